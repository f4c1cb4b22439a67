"""A fast recall diagnostic: can a small model carry one stated value to a later turn in its self state?

Run: ``python -m experiments.probes.recall_diagnostic [--steps 900] [--recall-weight 1] [--out PATH]``.

Episodes are colour facts only and three turns long: the user greets and states a favourite colour, one
small-talk turn follows, then the user asks for the colour and the reply names it. They are written from
the corpus's own templates (``sia.learn.native.corpus.TEMPLATES``), the training episodes from the train pools and the
held-out ones from the held-out pools, so held-out recall needs unseen phrasings. A small model (2 layers ×
64 by default) trains on them exactly as ``sia train`` does (``sia.learn.native.train.episode_loss``: turn by turn from
fresh identities, no transcript except in ``--transcript-prob`` of the batches, the value tokens weighted
``--answer-weight``×, and with ``--recall-weight`` > 0 the auxiliary read-out of the value from the self
state). Every ``--eval-every`` steps ``sia.learn.native.recall.recall`` scores the 12 candidates at each probe of 100
held-out and 100 training episodes, with the state carried ("state") and from a fresh state ("stateless"),
and the spread of the self state entering the probe across episodes (mean over dimensions of the standard
deviation) is recorded. One thread; about 0.3 s a step on one CPU core.

Results: a markdown table on stdout and JSON (``--out``) with every evaluation.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import random
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from sia.identity.state import Dynamics
from sia.learn.native.corpus import FACTS, NAMES, TEMPLATES, Episode, Probe, ScriptedTurn
from sia.learn.native.play import encode_episodes, play_episodes
from sia.learn.native.recall import recall
from sia.learn.native.train import RecallProbe, episode_loss
from sia.model.config import ModelConfig
from sia.model.native import SIAModel
from sia.model.tokenizer import ByteTokenizer
from sia.personas import PERSONAS

log = logging.getLogger("experiments.probes.recall_diagnostic")

SMALL_MODEL: dict[str, Any] = {"n_layer": 2, "n_head": 4, "n_embd": 64, "d_self": 16, "block_size": 256}


def colour_episode(rng: random.Random, split: str) -> Episode:
    """State a colour, one small-talk turn, ask for it: three turns of one persona from ``split``'s pools."""
    pools = TEMPLATES[split]
    persona = rng.choice(sorted(PERSONAS))
    name, value = rng.choice(NAMES[split]), rng.choice(FACTS["colour"])
    reply = f"reply.{persona}."
    statement = rng.choice(pools["state.colour"]).replace("{value}", value)
    greeting = rng.choice(pools["greet"]).replace("{name}", name) + " " + statement
    greet = ScriptedTurn(greeting, rng.choice(pools[reply + "greet"]).replace("{name}", name))
    chat = ScriptedTurn(rng.choice(pools["smalltalk"]), rng.choice(pools[reply + "smalltalk"]))
    prefix, suffix = rng.choice(pools[reply + "probe.colour"]).split("{value}")
    ask = ScriptedTurn(rng.choice(pools["ask.colour"]), prefix + value + suffix)
    probe = Probe(turn=2, fact="colour", answer=value, candidates=FACTS["colour"], prefix=prefix, source_turn=0)
    return Episode(persona, name, (greet, chat, ask), (probe,))


def measure(model: SIAModel, episodes: Sequence[Episode]) -> dict[str, float]:
    """Recall (state carried, stateless) and the spread of the self state entering the probe."""
    model.eval()
    out: dict[str, float] = {}
    for mode in ("state", "stateless"):
        scored = recall(model, episodes, mode)
        out[mode] = sum(s.correct for s in scored) / len(scored)
    refs = frozenset((e, episode.probes[0].turn) for e, episode in enumerate(episodes))
    captured = play_episodes(model, encode_episodes(model, episodes, transcript=False), capture=refs).captured
    selves = torch.cat([captured[ref].self_state for ref in sorted(refs)])  # (n, d_s)
    out["spread"] = float(selves.std(dim=0).mean())
    model.train()
    return out


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--steps", type=int, default=900)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--warmup-steps", type=int, default=50)
    parser.add_argument("--answer-weight", type=float, default=5.0)
    parser.add_argument("--recall-weight", type=float, default=1.0)
    parser.add_argument("--transcript-prob", type=float, default=0.1)
    parser.add_argument("--train-episodes", type=int, default=5000)
    parser.add_argument("--eval-every", type=int, default=150)
    parser.add_argument("--model", type=json.loads, default=SMALL_MODEL, help="ModelConfig fields as JSON")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("experiments/probes/results/recall_diagnostic.json"))
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    args = parse_args(argv)
    torch.set_num_threads(1)
    rng = random.Random(args.seed)
    train_set = [colour_episode(rng, "train") for _ in range(args.train_episodes)]
    heldout = [colour_episode(rng, "heldout") for _ in range(100)]
    config = ModelConfig.from_dict(args.model)
    torch.manual_seed(args.seed)
    model = SIAModel(config)
    head = RecallProbe(config.d_self) if args.recall_weight > 0 else None
    params = [*model.parameters(), *(head.parameters() if head is not None else ())]
    optimizer = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.01, betas=(0.9, 0.98))
    tok, dynamics = ByteTokenizer(), Dynamics.from_config(config)
    rows: list[dict[str, Any]] = []
    started = time.perf_counter()
    for step in range(1, args.steps + 1):
        batch_rng = random.Random(args.seed * 1_000_003 + step)
        batch = [train_set[batch_rng.randrange(len(train_set))] for _ in range(args.batch_size)]
        progress = max(0.0, (step - args.warmup_steps) / max(1, args.steps - args.warmup_steps))
        lr = args.lr * min(1.0, step / max(1, args.warmup_steps)) * (0.55 + 0.45 * math.cos(math.pi * progress))
        for group in optimizer.param_groups:
            group["lr"] = lr
        loss, _ = episode_loss(
            model,
            batch,
            tok,
            dynamics,
            transcript=batch_rng.random() < args.transcript_prob,
            user_weight=0.3,
            answer_weight=args.answer_weight,
            recall=head,
            recall_weight=args.recall_weight,
        )
        optimizer.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if step % args.eval_every == 0 or step == args.steps:
            row = {"step": step, "loss": float(loss.detach()), "minutes": (time.perf_counter() - started) / 60}
            row |= {f"heldout_{k}": v for k, v in measure(model, heldout).items()}
            row |= {f"train_{k}": v for k, v in measure(model, train_set[:100]).items()}
            rows.append(row)
            log.info(" ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    chance = 1 / len(FACTS["colour"])
    args.out.write_text(json.dumps({"args": {**vars(args), "out": str(args.out)}, "chance": chance, "rows": rows}, indent=2))
    header = "| step | min | held-out state | held-out stateless | train state | train stateless | spread of s |"
    lines = [header, "|" + "---|" * 7]
    for r in rows:
        lines.append(
            f"| {r['step']} | {r['minutes']:.1f} | {r['heldout_state']:.2f} | {r['heldout_stateless']:.2f} | "
            f"{r['train_state']:.2f} | {r['train_stateless']:.2f} | {r['train_spread']:.3f} |"
        )
    log.info("chance %.3f\n%s", chance, "\n".join(lines))


if __name__ == "__main__":
    main()
