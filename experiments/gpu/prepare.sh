#!/bin/bash
# Builds .gpu/ (ignored by git, carried to a GPU machine): wheels of the service's packages that the GPU image lacks,
# for its Python 3.12, at the versions this checkout's .venv holds, and the bundled base's config.json and tokenizer
# files (its weights stay here: the working tree that travels is limited to 64 MiB).
#
#   bash experiments/gpu/prepare.sh
set -eu
cd "$(dirname "$0")/../.."
grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || { mkdir -p .git/info; echo '/.gpu/' >> .git/info/exclude; }
mkdir -p .gpu/whl .gpu/like
PACKAGES="pydantic pydantic_core annotated-types typing-inspection pydantic-settings python-dotenv fastapi starlette
annotated-doc opentelemetry-api uvicorn sqlalchemy greenlet alembic mako psycopg psycopg-binary gguf typing_extensions"
PINS=$(for p in $PACKAGES; do echo "$p==$(.venv/bin/python -c "import importlib.metadata as m; print(m.version('$p'))")"; done)
# shellcheck disable=SC2086
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .gpu/whl $PINS
HF=$(.venv/bin/python -c "from sia.backbones.weights import bundled_gguf, resolve_base; print(resolve_base(bundled_gguf(), 'sia-data/models'))")
cp "$HF/config.json" "$HF/tokenizer.json" "$HF/tokenizer_config.json" .gpu/like/
du -sh .gpu
