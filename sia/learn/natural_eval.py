"""``sia eval --natural PART``: what a checkpoint remembers of the natural-conversation set (sia.learn.natural), through
its state, against a stranger, the transcript in context and the oracle, and what its imprint costs the replies.

Figures (greedy, persona ``sia``; every depth's questions asked of the same conversation on its way):
- recall per kind after each depth of unrelated turns, through the state alone (each turn sees the persona's prompt
  and its message only); every fact of a user right; corrections (the newer value given, not the older);
- ``fresh``: the same questions asked of a fresh identity (a stranger; how often a reply names the value by chance);
- ``transcript``: the base model reading the whole conversation at every turn;
- ``oracle``: the fact's clause alone as the previous user turn;
- reply perplexity of the held-out dialogue (sia/learn/data/dialogue.jsonl) with an imprint present (a natural user's
  messages imprinted) against the base model;
- write time per turn (the imprint's read of the prompt and selection), the state's bytes.

``keep_text=False`` plays every turn as the service's privacy mode does (``SIA_STORE_TURN_TEXT=false``): the imprint
keeps no token ids, so what reads the user's words (the copy read, the untold reply's words, the echo's lean, the
recollection) has none to read, and the labels alone decide.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from sia.backbones.llama import LlamaModel
from sia.identity.imprint import Imprint
from sia.identity.state import IdentityState, state_to_bytes
from sia.learn.dialogue import load_dialogue
from sia.learn.imprint_read import imprint_of
from sia.learn.natural import MAIN_KINDS, DepthResult, load_fillers, load_users, recall_by_depth
from sia.personas import PERSONAS

__all__ = ["NATURAL_TARGETS", "NaturalOptions", "imprint_perplexity", "run_natural_eval"]

log = logging.getLogger("sia.learn.natural_eval")

MODES = ("state", "fresh", "transcript", "oracle")
# the targets, held-out part, 4 unrelated turns, through the state alone
NATURAL_TARGETS = {"open": 0.80, "closed": 0.90, "all_facts": 0.60, "depth16": 0.70, "corrections": 0.80, "perplexity": 1.05}


@dataclass(frozen=True)
class NaturalOptions:
    part: str = "heldout"
    depths: tuple[int, ...] = (4,)
    modes: tuple[str, ...] = MODES
    users: int | None = None  # the first this many users of the part (None: all)
    batch: int = 8
    conversations: int = 60  # held-out dialogue conversations for the perplexity (0: not measured)
    keep_text: bool = True  # False: privacy mode, the imprint keeps no token ids (SIA_STORE_TURN_TEXT=false)

    def __post_init__(self) -> None:
        if self.conversations < 0:
            raise ValueError(f"conversations counts dialogue conversations: >= 0; got {self.conversations}")


def _rate(oks: Sequence[bool]) -> float | None:
    return sum(oks) / len(oks) if oks else None


def _figures(result: DepthResult, users: Sequence[Any]) -> dict[str, Any]:
    kinds = result.per_kind()
    return {
        "depth": result.depth,
        "per_fact": result.per_fact,
        "all_facts": result.all_facts,
        "by_kind": {k: _rate(v) for k, v in sorted(kinds.items())},
        "counts": {k: len(v) for k, v in sorted(kinds.items())},
        "main": _rate([ok for k in MAIN_KINDS for ok in kinds.get(k, [])]),
        "corrections": _rate(result.corrections(users)),
        **_kept(result),
        "replies": result.replies,
    }


def _kept(result: DepthResult) -> dict[str, Any]:
    """The write's share and the read's: how often the asked value was in the imprint when asked, and how often the
    reply gave it when it was (and when it was not)."""
    rows: list[tuple[str, bool, bool]] = []
    for user, asked in result.right.items():
        for kind, ok in asked.items():
            held = result.kept.get(user, {}).get(kind)
            if held is not None:
                rows.append((kind, held, ok))
    if not rows:
        return {}
    kinds = sorted({kind for kind, _, _ in rows})
    return {
        "kept": _rate([held for _, held, _ in rows]),
        "kept_by_kind": {k: _rate([held for kind, held, _ in rows if kind == k]) for k in kinds},
        "right_when_kept": _rate([ok for _, held, ok in rows if held]),
        "right_when_lost": _rate([ok for _, held, ok in rows if not held]),
    }


def imprint_perplexity(model: LlamaModel, imprints: Sequence[Imprint], conversations: int) -> dict[str, float]:
    """Reply perplexity of the held-out dialogue, each conversation's turns read with one of ``imprints`` (cycled)
    against the base model (the same turns, no imprint); each turn sees the persona's prompt and its message (which
    the ask head reads, as in a turn)."""
    tok = model.tokenizer
    system = tok.system_prompt(PERSONAS["sia"].system_prompt)
    if conversations < 1:
        raise ValueError(f"the perplexity needs at least one conversation; got {conversations}")
    convs = load_dialogue()[:conversations]
    fresh = IdentityState.fresh(model.config)
    nll = {"state": 0.0, "base": 0.0}
    count = 0
    for n, conv in enumerate(convs):
        imprint = imprints[n % len(imprints)]
        for turn in conv.turns:
            prompt, (start, end) = tok.turn_prompt(turn.user, system)
            tokens = prompt + tok.reply_tokens(turn.reply)
            idx = torch.tensor([tokens], device=model.device)
            target = idx[0, len(prompt) :]
            for name, held in (("state", imprint), ("base", None)):
                cond = model.condition_states([replace(fresh, imprint=held)], [len(system)], [prompt[start : end - 1]])
                with torch.no_grad():
                    logits = model(idx, cond).logits[0, len(prompt) - 1 : -1]
                nll[name] += float(F.cross_entropy(logits.float(), target, reduction="sum"))
            count += len(target)
    ppl = {k: math.exp(v / count) for k, v in nll.items()}
    return {"state": ppl["state"], "base": ppl["base"], "ratio": ppl["state"] / ppl["base"], "tokens": count}


def run_natural_eval(model: LlamaModel, out: Path, options: NaturalOptions) -> dict[str, Any]:
    """Every figure of the module docstring for ``model`` on ``options.part``; report.md and figures.json in ``out``."""
    if not model.config.imprint_tokens:
        log.warning("this checkpoint keeps no imprint: the natural set measures its self state alone")
    tok = model.tokenizer
    system = tok.system_prompt(PERSONAS["sia"].system_prompt)
    users = load_users(options.part)[: options.users]
    fillers = load_fillers(options.part)
    figures: dict[str, Any] = {
        "part": options.part,
        "users": len(users),
        "questions": sum(len(u.questions) for u in users),
        "keep_text": options.keep_text,
    }
    for mode in options.modes:
        started = time.perf_counter()
        results = recall_by_depth(
            model, tok, users, fillers, options.depths, system=system, mode=mode, batch=options.batch, keep_text=options.keep_text
        )
        figures[mode] = [_figures(r, users) for r in results]
        figures[f"{mode}_seconds"] = round(time.perf_counter() - started, 1)
        log.info("%s: %s", mode, [(r.depth, round(r.per_fact, 3)) for r in results])
    if model.config.imprint_tokens:
        started = time.perf_counter()
        imprints = [imprint_of(model, system, u.messages) for u in users[:20]]
        turns = sum(len(u.messages) for u in users[:20])
        figures["write_ms_per_turn"] = 1000 * (time.perf_counter() - started) / turns
        figures["state_bytes"] = len(state_to_bytes(replace(IdentityState.fresh(model.config), imprint=imprints[0])))
        if options.conversations:
            figures["perplexity"] = imprint_perplexity(model, imprints, options.conversations)
    figures["targets"] = targets(figures)
    out.mkdir(parents=True, exist_ok=True)
    (out / "figures.json").write_text(json.dumps(figures, indent=1) + "\n")
    (out / "report.md").write_text(report(figures))
    return figures


def _at(figures: dict[str, Any], mode: str, depth: int) -> dict[str, Any] | None:
    return next((f for f in figures.get(mode, []) if f["depth"] == depth), None)


def targets(figures: dict[str, Any]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    four = _at(figures, "state", 4)
    if four is not None:
        kinds = four["by_kind"]
        for kind in MAIN_KINDS:
            goal = NATURAL_TARGETS["open"] if kind in ("name", "city", "job") else NATURAL_TARGETS["closed"]
            if kinds.get(kind) is not None:
                rows.append({"name": f"{kind} at 4 turns >= {goal:.0%}", "measured": kinds[kind], "met": kinds[kind] >= goal})
        rows.append({"name": "every fact of a user >= 60%", "measured": four["all_facts"], "met": four["all_facts"] >= 0.6})
        if four["corrections"] is not None:
            rows.append({"name": "corrections >= 80%", "measured": four["corrections"], "met": four["corrections"] >= 0.8})
    sixteen = _at(figures, "state", 16)
    if sixteen is not None:
        rows.append({"name": "16 turns >= 70%", "measured": sixteen["per_fact"], "met": sixteen["per_fact"] >= 0.7})
    if "perplexity" in figures:
        ratio = figures["perplexity"]["ratio"]
        rows.append({"name": "reply perplexity <= 1.05x base", "measured": ratio, "met": ratio <= 1.05})
    return rows


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.1f} %"


def report(figures: dict[str, Any]) -> str:
    lines = [
        f"# The natural-conversation set, {figures['part']} part",
        "",
        f"{figures['users']} users, {figures['questions']} questions; greedy, persona `sia`."
        + ("" if figures.get("keep_text", True) else " Privacy mode: the imprint keeps no token ids."),
        "",
    ]
    kinds = sorted({k for m in MODES for f in figures.get(m, []) for k in f["by_kind"]})
    head = "| mode | depth | per fact | all facts | corrections | " + " | ".join(kinds) + " |"
    lines += [head, "|---" * (5 + len(kinds)) + "|"]
    for mode in MODES:
        for f in figures.get(mode, []):
            depth = str(f["depth"]) if mode not in ("fresh", "oracle") else "–"
            cells = " | ".join(_pct(f["by_kind"].get(k)) for k in kinds)
            lines.append(
                f"| {mode} | {depth} | {_pct(f['per_fact'])} | {_pct(f['all_facts'])} | {_pct(f['corrections'])} | {cells} |"
            )
    kept = [(f["depth"], f) for f in figures.get("state", []) if f.get("kept") is not None]
    if kept:
        lines += [
            "",
            "The write and the read apart (through the state): the asked value among the imprint's words when asked,"
            " and how often the reply gave it.",
            "",
            "| depth | value imprinted | "
            + " | ".join(f"{k} imprinted" for k in kinds)
            + " | right when imprinted | right when not |",
            "|---" * (4 + len(kinds)) + "|",
        ]
        for depth, f in kept:
            cells = " | ".join(_pct(f["kept_by_kind"].get(k)) for k in kinds)
            lines.append(
                f"| {depth} | {_pct(f['kept'])} | {cells} | {_pct(f['right_when_kept'])} | {_pct(f['right_when_lost'])} |"
            )
    if "perplexity" in figures:
        p = figures["perplexity"]
        lines += [
            "",
            f"Reply perplexity of the held-out dialogue with an imprint present: {p['state']:.3f} against the base model's"
            f" {p['base']:.3f}, **{p['ratio']:.4f}×** ({p['tokens']} tokens).",
            f"Write (the imprint's read of a turn's prompt and its selection): {figures['write_ms_per_turn']:.0f} ms a turn;"
            f" a stored identity with its imprint: {figures['state_bytes']} bytes.",
        ]
    lines += ["", "| target | measured | met |", "|---|---|---|"]
    for t in figures["targets"]:
        measured = f"{t['measured']:.4f}×" if "perplexity" in t["name"] else _pct(t["measured"])
        lines.append(f"| {t['name']} | {measured} | {'yes' if t['met'] else 'no'} |")
    return "\n".join(lines) + "\n"
