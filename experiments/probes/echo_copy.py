"""Whether a stronger copy read right after the echo opening ("You told me you") brings back the user's own verb
("restore pipe organs") where the model goes on with the read's taught form ("work as a restore pipe organ").

``sia eval --natural`` as shipped (the echo for jobs and hobbies), with the copy read's weight multiplied by
``--boost`` at every position whose input token is the opening's last (" you"): right after the opening, and, as an
approximation, after any " you" of a recall reply. Writes ``sia eval``'s figures to ``--out``.

    PYTHONPATH=. python -m experiments.probes.echo_copy --boost 4 --out DIR [--part tune] [--depth 4]
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import torch

import sia.backbones.llama as llama
from server.cli import main as sia_main
from sia.backbones.injected_attention import CopyPlan
from sia.checkpoint import DEFAULT_CACHE, DEFAULT_CHECKPOINT, load_llama_checkpoint
from sia.model.language import ECHO_OPENING


def boosted(boost: float, you: int) -> Any:
    """``llama.copied`` with the copy weight times ``boost`` at the positions reading token ``you``."""
    plain = llama.copied

    def copied(
        logits: torch.Tensor,
        pointer: torch.Tensor,
        plan: CopyPlan,
        previous: torch.Tensor,
        unfinished: torch.Tensor | None = None,
    ) -> torch.Tensor:
        out = plain(logits, pointer, plan, previous, unfinished)
        at = previous == you  # (B, L)
        if not bool(at.any()):
            return out
        strong = plain(logits, pointer, replace(plan, weight=plan.weight * boost), previous, unfinished)
        return torch.where(at.unsqueeze(-1), strong, out)

    return copied


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--boost", type=float, required=True)
    parser.add_argument("--part", default="tune")
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    tok = load_llama_checkpoint(DEFAULT_CHECKPOINT, DEFAULT_CACHE).tokenizer
    you = tok.encode(ECHO_OPENING)[-1]
    llama.copied = boosted(args.boost, you)
    cli = ["eval", "--natural", args.part, "--depths", str(args.depth), "--modes", "state", "--conversations", "0"]
    return int(sia_main([*cli, "--out", args.out]) or 0)


if __name__ == "__main__":
    raise SystemExit(main())
