"""What the imprint gives a LLaMA-family backbone that SIA never trained: checkpoints of the bundled backbone whose
identity parameters are untrained (``init_identity``: the self slots shut, the trace untrained), with the bundled
imprint's size and write (token shock, the asides' weight) but nothing learnt in its read: no kind tagger, no read
adapter, no read gate, no ask head. ``untrained`` reads the entries by the backbone's own attention alone;
``untrained-copy`` adds the copy read (``imprint_copy`` LAM, pointed by the bundled config's eight query heads), which
without an ask head copies in every turn. Measure them as any checkpoint:

    PYTHONPATH=. python -m experiments.probes.untrained_imprint [--out runs] [--copy 1.0]
    sia eval --checkpoint runs/untrained-copy --natural tune --depths 4 --modes state --conversations 0
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

from sia.checkpoint import DEFAULT_CACHE, DEFAULT_CHECKPOINT, BaseRef, _llama_from_base, save_llama_checkpoint
from sia.model.config import LlamaConfig


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("runs"))
    ap.add_argument("--copy", type=float, default=1.0, help="the copy read's lambda in untrained-copy")
    args = ap.parse_args(argv)
    bundled = LlamaConfig.from_file(DEFAULT_CHECKPOINT / "config.json")
    ref = BaseRef.read(DEFAULT_CHECKPOINT / "base.json")
    base = ref.locate(DEFAULT_CHECKPOINT)
    plain = replace(
        bundled,
        slot_gate=False,
        imprint_read_rank=0,
        imprint_gate=False,
        imprint_kinds_layer=None,
        imprint_ask_bias=0.0,
        imprint_untold=None,
        imprint_copy=0.0,
        imprint_copy_layers=None,
        imprint_copy_heads=None,
    )
    copying = replace(
        plain,
        imprint_copy=args.copy,
        imprint_copy_layers=bundled.imprint_copy_layers,
        imprint_copy_heads=bundled.imprint_copy_heads,
    )
    for name, config in (("untrained", plain), ("untrained-copy", copying)):
        model = _llama_from_base(base, Path(DEFAULT_CACHE), config, ref.sha256)
        model.init_identity(seed=0)
        sys.stdout.write(f"{save_llama_checkpoint(model, args.out / name, ref)}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
