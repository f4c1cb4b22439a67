"""Train the imprint's read from the start over the bundled checkpoint (experiments/LOG.md, 2026-12-07 (m)).

The recipe's fifth stage trains a fresh read adapter over the fourth stage's export, which is not shipped. The bundled
checkpoint holds that export's parameters unchanged, with the imprint's read adapter, read gate, kind tagger and ask
head added by the stages after it, and the reply settings that need the ask head (``imprint_untold``,
``imprint_untold_by_label``, ``imprint_echo``). ``strip`` writes the bundled checkpoint without the gate, the tagger,
the ask head and those settings (``sia.learn.imprint_read`` then gives it a fresh read and, with ``--gate``, a fresh
gate); ``settle`` gives a checkpoint trained from there, once its tagger and ask head are fitted again, the bundled
reply settings back.

    PYTHONPATH=. python -m experiments.read_afresh strip runs/stage4
    PYTHONPATH=. python -m sia.learn.imprint_read --checkpoint runs/stage4 --out runs/fresh5 --gate --kinds-layer -1 ...
    PYTHONPATH=. python -m sia.learn.imprint_read --checkpoint runs/fresh5 --out runs/fresh8 --kinds-only \\
        --kinds-natural 1 --ask-bias 2 --asks-natural --label-min 0.3
    PYTHONPATH=. python -m experiments.read_afresh settle runs/fresh8
"""

from __future__ import annotations

import argparse
import logging
from dataclasses import replace
from pathlib import Path

from sia.backbones.llama import LlamaModel
from sia.checkpoint import CONFIG_FILE, DEFAULT_CACHE, DEFAULT_CHECKPOINT, BaseRef, load_llama_checkpoint, save_llama_checkpoint
from sia.model.config import LlamaConfig

log = logging.getLogger(__name__)
REPLY_SETTINGS = ("imprint_untold", "imprint_untold_by_label", "imprint_echo")  # what needs the ask head


def strip(model: LlamaModel) -> None:
    """``model`` without its imprint's read gate, kind tagger and ask head, nor the settings that need the ask head."""
    for attn in model.attentions:
        if getattr(attn, "imprint_gated", False):
            attn.imprint_gated = False
            del attn.imprint_gate
    model.config = replace(
        model.config,
        imprint_untold=None,
        imprint_untold_by_label=None,
        imprint_echo=None,
        imprint_gate=False,
        imprint_ask_bias=0.0,
        imprint_kinds_layer=None,
    )
    model.imprint_ask = None
    model.imprint_kind = None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("step", choices=("strip", "settle"))
    ap.add_argument("checkpoint", type=Path, help="strip: where to write; settle: the checkpoint to settle, in place")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.step == "strip":
        model = load_llama_checkpoint(DEFAULT_CHECKPOINT, DEFAULT_CACHE)
        strip(model)
        save_llama_checkpoint(model, args.checkpoint, BaseRef.of(DEFAULT_CHECKPOINT))
        return
    bundled = LlamaConfig.from_file(DEFAULT_CHECKPOINT / CONFIG_FILE)
    path = args.checkpoint / CONFIG_FILE
    config = replace(LlamaConfig.from_file(path), **{k: getattr(bundled, k) for k in REPLY_SETTINGS})  # validates them
    config.to_file(path)
    log.info("%s: the bundled reply settings back", path)


if __name__ == "__main__":
    main()
