#!/bin/bash
# Builds .gpu/ (ignored by git, carried to a GPU machine): wheels of the service's packages that the GPU image lacks,
# for its Python 3.12, at the versions this checkout's .venv holds, the bundled base's config.json and tokenizer files,
# and the bundled GGUF's SHA-256; and .gpu-parts/ (ignored too): the GGUF in parts of 22 MiB, each small enough to
# travel beside the tracked tree in a call of its own (README.md says in which order).
#
#   bash experiments/gpu/prepare.sh
set -eu
cd "$(dirname "$0")/../.."
mkdir -p .git/info
for d in /.gpu/ /.gpu-parts/; do grep -qx "$d" .git/info/exclude 2>/dev/null || echo "$d" >> .git/info/exclude; done
mkdir -p .gpu/whl .gpu/like
PACKAGES="pydantic pydantic_core annotated-types typing-inspection pydantic-settings python-dotenv fastapi starlette
annotated-doc opentelemetry-api uvicorn sqlalchemy greenlet alembic mako psycopg psycopg-binary gguf typing_extensions"
PINS=$(for p in $PACKAGES; do echo "$p==$(.venv/bin/python -c "import importlib.metadata as m; print(m.version('$p'))")"; done)
# shellcheck disable=SC2086
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .gpu/whl $PINS
HF=$(.venv/bin/python -c "from sia.backbones.weights import bundled_gguf, resolve_base; print(resolve_base(bundled_gguf(), 'sia-data/models'))")
cp "$HF/config.json" "$HF/tokenizer.json" "$HF/tokenizer_config.json" .gpu/like/
GGUF=$(.venv/bin/python -c "from sia.backbones.weights import bundled_gguf; print(bundled_gguf())")
sha256sum "$GGUF" | cut -d' ' -f1 > .gpu/weights.sha256
rm -rf .gpu-parts && mkdir .gpu-parts && split -b 22M -d -a 1 "$GGUF" .gpu-parts/part-
du -sh .gpu .gpu-parts; ls .gpu-parts
