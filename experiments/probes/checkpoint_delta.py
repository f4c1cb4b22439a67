"""A candidate checkpoint kept as what it changes in another: the tensors of its identity.safetensors that differ from
the reference's (added or changed), with its config.json and base.json, so a trained candidate survives in the lab
without a second copy of the unchanged slot maps; ``apply`` rebuilds the whole checkpoint from the reference.

Run: ``python -m experiments.probes.checkpoint_delta save REFERENCE CANDIDATE OUT`` and
``python -m experiments.probes.checkpoint_delta apply REFERENCE DELTA OUT``.
"""

from __future__ import annotations

import argparse
import logging
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

WEIGHTS = "identity.safetensors"
KEPT = ("config.json", "base.json")
log = logging.getLogger(__name__)


def save(reference: Path, candidate: Path, out: Path) -> list[str]:
    """Write to ``out`` the candidate's tensors absent from or unequal to the reference's; returns their names."""
    ref, cand = load_file(reference / WEIGHTS), load_file(candidate / WEIGHTS)
    gone = sorted(set(ref) - set(cand))
    if gone:
        raise ValueError(f"the candidate lacks {len(gone)} tensors of the reference (e.g. {gone[0]}): not a delta of it")
    changed = {k: v for k, v in cand.items() if k not in ref or ref[k].shape != v.shape or not torch.equal(ref[k], v)}
    out.mkdir(parents=True, exist_ok=True)
    save_file(changed, str(out / WEIGHTS))
    for name in KEPT:
        shutil.copyfile(candidate / name, out / name)
    return sorted(changed)


def apply(reference: Path, delta: Path, out: Path) -> None:
    """Rebuild in ``out`` the checkpoint that ``save`` took apart: the reference's tensors updated with the delta's."""
    weights = {**load_file(reference / WEIGHTS), **load_file(delta / WEIGHTS)}
    out.mkdir(parents=True, exist_ok=True)
    save_file(weights, str(out / WEIGHTS))
    for name in KEPT:
        shutil.copyfile(delta / name, out / name)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("action", choices=("save", "apply"))
    p.add_argument("reference", type=Path)
    p.add_argument("source", type=Path, help="save: the candidate checkpoint; apply: the delta")
    p.add_argument("out", type=Path)
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.action == "save":
        names = save(args.reference, args.source, args.out)
        log.info("%d tensors differ: %s%s", len(names), ", ".join(names[:6]), " ..." if len(names) > 6 else "")
    else:
        apply(args.reference, args.source, args.out)


if __name__ == "__main__":
    main()
