"""``sia eval`` for a pretrained backbone: does the persona remember what a user said, through its state alone?

Every figure is measured on the held-out split of the fact corpus (its own wordings, users, values and chit-chat),
played turn by turn as the service plays it (sia.learn.adapter.unroll):
- recall: after a user states three facts in one message and chats about k unrelated things, each fact is asked
  about; the answer is right when the true value is the most likely of its kind's candidates. Read under the
  user's own state, a fresh state (stateless), another user's state, and by the base model with the whole
  transcript in context (what the backbone itself can do); chance and its standard deviation beside them;
- the acceptance figure: with ``draws``, recall at the target depth over several held-out draws of ``episodes``
  each, pooled (each draw's figures kept), against which the targets are judged;
- open vocabulary: names and cities never seen in training, ranked among every held-out name or city;
- the trace's share: recall with the trace frozen at zero (alpha = 0) against the trace on;
- reply perplexity with state against the base model on the held-out dialogue (sia/learn/data/dialogue.jsonl);
- history KL (the same message under two users' states), reset determinism (a fresh state is the base model);
- plots: recall by depth, the self state over an episode, the trace spectra, the training curves.
"""

from __future__ import annotations

import json
import logging
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from sia.backbones.chat_tokenizer import ChatTokenizer
from sia.backbones.llama import LlamaModel
from sia.checkpoint import DEFAULT_CACHE, load_model
from sia.identity.state import Dynamics
from sia.learn.adapter import facts
from sia.learn.adapter.heldout import heldout_readout
from sia.learn.adapter.plots import plot_recall, plot_self_state, plot_spectra, plot_training
from sia.learn.adapter.readout import READOUT_FILE, ReadOut
from sia.learn.adapter.unroll import (
    Carry,
    persona_contexts,
    probe_logits,
    render_turn,
    score_candidates,
    span,
    transcript,
    write_turn,
)
from sia.learn.dialogue import load_dialogue
from sia.personas import PERSONAS

__all__ = ["EvalOptions", "pooled_recall", "run_eval"]

log = logging.getLogger(__name__)

CLOSED_TRIO = ("colour", "pet", "hobby")
OPEN_SET = ("name", "city", "job")
CONDITIONS = ("state", "stateless", "other_user", "transcript")
POOLED_CONDITIONS = ("state", "stateless", "other_user")  # the draws' (the transcript reading is the base model's)
TARGETS = {"per_fact": 0.90, "all_three": 0.75, "perplexity_ratio": 1.05, "open_vocabulary": 0.80, "double_depth": 0.80}


@dataclass(frozen=True)
class EvalOptions:
    episodes: int = 24  # held-out episodes per depth
    depths: tuple[int, ...] = (0, 1, 2, 4, 8)  # 0: asked right after the statement
    target_depth: int = 4
    conversations: int = 60  # held-out dialogue conversations for perplexity
    seed: int = 100
    chunk: int = 8  # probes scored per forward
    device: str = "cpu"  # the torch device to evaluate on (e.g. cuda)
    read_shifts: tuple[float, ...] = ()  # the read's strength: recall and perplexity with every slot logit lowered by each
    # held-out draws (eval seeds, as ``seed``) of ``episodes`` each at the target depth, pooled: the acceptance figure
    # (the shipped adapter's: 100, 200, ..., 1000 of 32 episodes); empty: the targets read the one draw at ``seed``
    draws: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.episodes < 2:
            raise ValueError(f"episodes must be >= 2 (another user's state is the next episode's); got {self.episodes}")
        if self.target_depth not in self.depths or min(self.depths) < 0:
            raise ValueError(f"depths must be >= 0 and hold target_depth {self.target_depth}; got {self.depths}")
        if self.conversations < 1 or self.chunk < 1:
            raise ValueError(f"conversations and chunk must be >= 1; got {self.conversations}, {self.chunk}")
        if len(set(self.draws)) != len(self.draws):
            raise ValueError(f"draws must be distinct: a draw pooled twice counts its episodes twice; got {list(self.draws)}")


# ---------------------------------------------------------------------------------------------------------
# Playing episodes and asking
# ---------------------------------------------------------------------------------------------------------


@torch.no_grad()
def play(
    model: LlamaModel, episodes: Sequence[facts.Episode], contexts: Sequence[Sequence[int]], dynamics: Dynamics
) -> list[Carry]:
    """The state of every episode after each of its turns: element t holds every row (rows that ended keep theirs)."""
    tok = model.tokenizer
    assert isinstance(tok, ChatTokenizer)
    carry = Carry.fresh(model, len(episodes))
    states = []
    for t in range(max(len(e.turns) for e in episodes)):
        rows = [b for b, e in enumerate(episodes) if t < len(e.turns)]
        turns = [render_turn(tok, contexts[b], episodes[b].turns[t].user, episodes[b].turns[t].reply) for b in rows]
        part, _, _ = write_turn(model, carry.take(rows), turns, dynamics, grad_tokens=True)
        carry = carry.put(rows, part)
        states.append(carry)
    return states


def ask(
    model: LlamaModel,
    carry: Carry,
    episodes: Sequence[facts.Episode],
    contexts: Sequence[Sequence[int]],
    *,
    in_context: bool,
    chunk: int,
) -> Tensor:
    """(episodes, probes) bool: the true value ranks first among its kind's values of the episode's split.

    ``in_context``: the prompt holds the whole transcript before the question (read with ``carry``, normally fresh)."""
    tok = model.tokenizer
    assert isinstance(tok, ChatTokenizer)
    right = torch.zeros(len(episodes), max(len(e.probes) for e in episodes), dtype=torch.bool)
    jobs = [(b, j) for b, e in enumerate(episodes) for j in range(len(e.probes))]
    for start in range(0, len(jobs), chunk):
        part = jobs[start : start + chunk]
        prompts, prefixes, candidates = [], [], []
        for b, j in part:
            probe = episodes[b].probes[j]
            context = list(contexts[b])
            if in_context:
                context, _ = transcript(tok, context, [(x.user, x.reply) for x in episodes[b].turns])
            prompts.append(tok.turn_prompt(probe.question, context)[0])
            prefixes.append(probe.reply_prefix)
            candidates.append(facts.values(probe.kind, episodes[b].split))
        scores = score_candidates(model, carry.take([b for b, _ in part]), prompts, prefixes, candidates)
        for (b, j), values, sc in zip(part, candidates, scores, strict=True):
            right[b, j] = values[int(sc.argmax())] == episodes[b].probes[j].value
    return right


def _rates(right: Tensor, episodes: Sequence[facts.Episode]) -> dict[str, Any]:
    kinds = [p.kind for p in episodes[0].probes]
    out: dict[str, Any] = {"per_fact": float(right.float().mean()), "all_three": float(right.all(dim=1).float().mean())}
    out["by_kind"] = {k: float(right[:, j].float().mean()) for j, k in enumerate(kinds)}
    return out


def chance(episodes: Sequence[facts.Episode]) -> dict[str, Any]:
    """Chance of ranking the true value first, and its standard deviation over this many probes."""
    probes = [p for e in episodes for p in e.probes]
    p_fact = sum(1 / len(facts.values(p.kind, e.split)) for e in episodes for p in e.probes) / len(probes)
    p_all = sum(math.prod(1 / len(facts.values(p.kind, e.split)) for p in e.probes) for e in episodes) / len(episodes)
    return {
        "per_fact": p_fact,
        "per_fact_sd": math.sqrt(p_fact * (1 - p_fact) / len(probes)),
        "all_three": p_all,
        "all_three_sd": math.sqrt(p_all * (1 - p_all) / len(episodes)),
    }


def recall_at(
    model: LlamaModel,
    depth: int,
    kinds: Sequence[str],
    options: EvalOptions,
    dynamics: Dynamics,
    conditions: Sequence[str] = CONDITIONS,
) -> tuple[dict[str, Any], list[facts.Episode], list[Carry]]:
    episodes = facts.episodes("heldout", options.episodes, options.seed + depth, between=depth, kinds=tuple(kinds))
    contexts = persona_contexts(model, len(episodes))
    states = play(model, episodes, contexts, dynamics)
    final = states[-1]
    fresh = Carry.fresh(model, len(episodes))
    readers = {
        "state": (final, False),
        "stateless": (fresh, False),
        "other_user": (final.take([(b + 1) % len(episodes) for b in range(len(episodes))]), False),
        "transcript": (fresh, True),
    }
    figures: dict[str, Any] = {"depth": depth, "episodes": len(episodes), "chance": chance(episodes)}
    for name in conditions:
        carry, in_context = readers[name]
        figures[name] = _rates(ask(model, carry, episodes, contexts, in_context=in_context, chunk=options.chunk), episodes)
        log.info("depth %d %s: %s", depth, name, figures[name])
    return figures, episodes, states


def pooled_recall(model: LlamaModel, options: EvalOptions, dynamics: Dynamics) -> dict[str, Any]:
    """Recall at the target depth over each of ``options.draws`` (its own ``options.episodes`` held-out episodes,
    read under the user's state, a fresh one and another user's), and pooled: the mean over the draws (of equal size,
    so the share over every probe drawn), with chance over every episode drawn."""
    if not options.draws:
        raise ValueError("pooled recall needs at least one draw")
    depth, rows, drawn = options.target_depth, [], []
    for draw in options.draws:
        figures, episodes, _ = recall_at(model, depth, CLOSED_TRIO, replace(options, seed=draw), dynamics, POOLED_CONDITIONS)
        rows.append({"draw": draw, "episodes": len(episodes), **{name: figures[name] for name in POOLED_CONDITIONS}})
        rows[-1]["chance"] = figures["chance"]
        drawn += episodes
    pooled: dict[str, Any] = {"depth": depth, "episodes": len(drawn), "draws": rows, "chance": chance(drawn)}
    for name in POOLED_CONDITIONS:
        pooled[name] = {
            "per_fact": statistics.fmean(r[name]["per_fact"] for r in rows),
            "all_three": statistics.fmean(r[name]["all_three"] for r in rows),
            "by_kind": {kind: statistics.fmean(r[name]["by_kind"][kind] for r in rows) for kind in CLOSED_TRIO},
        }
    log.info("pooled over %d draws at depth %d: %s", len(rows), depth, pooled["state"])
    return pooled


# ---------------------------------------------------------------------------------------------------------
# Reply quality
# ---------------------------------------------------------------------------------------------------------


@torch.no_grad()
def dialogue_perplexity(model: LlamaModel, dynamics: Dynamics, conversations: int) -> dict[str, float]:
    """Reply perplexity of the held-out dialogue with the state carried turn to turn vs the base model (fresh state)."""
    tok = model.tokenizer
    assert isinstance(tok, ChatTokenizer)
    context = tok.system_prompt(PERSONAS["sia"].system_prompt)
    convs = load_dialogue()[:conversations]
    carry = Carry.fresh(model, len(convs))
    nll = {"state": 0.0, "base": 0.0}
    count = 0
    for t in range(max(len(c.turns) for c in convs)):
        rows = [b for b, c in enumerate(convs) if t < len(c.turns)]
        turns = [render_turn(tok, context, convs[b].turns[t].user, convs[b].turns[t].reply) for b in rows]
        part, logits, _ = write_turn(model, carry.take(rows), turns, dynamics, grad_tokens=True)
        tail = max(len(x.tokens) - x.reply[0] + 1 for x in turns)
        base = probe_logits(model, Carry.fresh(model, len(rows)), [x.tokens for x in turns], tail=tail)
        for i, x in enumerate(turns):
            target = torch.tensor(x.tokens[x.reply[0] : x.reply[1]], device=model.device)
            nll["state"] += float(F.cross_entropy(span(logits[i], len(x.tokens), *x.reply).float(), target, reduction="sum"))
            nll["base"] += float(F.cross_entropy(span(base[i], len(x.tokens), *x.reply).float(), target, reduction="sum"))
            count += len(target)
        carry = carry.put(rows, part)
    ppl = {k: math.exp(v / count) for k, v in nll.items()}
    return {"state": ppl["state"], "base": ppl["base"], "ratio": ppl["state"] / ppl["base"], "tokens": count}


def read_strength(model: LlamaModel, dynamics: Dynamics, options: EvalOptions) -> list[dict[str, Any]]:
    """Memory against language: for each shift in ``options.read_shifts``, every slot's logit lowered by it (its
    attention weight times e^-shift) in place of the model's own shift, recall at the target depth through the state
    and the reply perplexity ratio. The model's own read shift is given back as it was."""
    kept = model.read_shift
    rows = []
    try:
        for shift in options.read_shifts:
            model.set_read_shift(shift)
            f, _, _ = recall_at(model, options.target_depth, CLOSED_TRIO, options, dynamics, ("state",))
            ppl = dialogue_perplexity(model, dynamics, options.conversations)
            rows.append({"shift": shift, "state": f["state"], "perplexity_ratio": ppl["ratio"]})
            log.info("read shift %.2f: %s, perplexity %.4fx", shift, f["state"], ppl["ratio"])
    finally:
        model.set_read_shift(kept)
    return rows


@torch.no_grad()
def history_kl(model: LlamaModel, final: Carry, pairs: int = 16) -> float:
    """Mean KL (nats per reply token) between the replies to the same message under two users' states."""
    tok = model.tokenizer
    assert isinstance(tok, ChatTokenizer)
    talk = facts.chitchat("heldout")
    context = tok.system_prompt(PERSONAS["sia"].system_prompt)
    n = min(pairs, final.self_state.shape[0] - 1)
    turns = [render_turn(tok, context, talk[i % len(talk)].user, talk[i % len(talk)].reply) for i in range(n)]
    tail = max(len(x.tokens) - x.reply[0] + 1 for x in turns)
    a = probe_logits(model, final.take(list(range(n))), [x.tokens for x in turns], tail=tail)
    b = probe_logits(model, final.take(list(range(1, n + 1))), [x.tokens for x in turns], tail=tail)
    kls = []
    for i, x in enumerate(turns):
        p = F.log_softmax(span(a[i], len(x.tokens), *x.reply).float(), -1)
        q = F.log_softmax(span(b[i], len(x.tokens), *x.reply).float(), -1)
        kls.append(float(F.kl_div(q, p, log_target=True, reduction="batchmean")))
    return sum(kls) / len(kls)


@torch.no_grad()
def retention(model: LlamaModel, checkpoint: str | Path | None, options: EvalOptions, dynamics: Dynamics) -> list[dict[str, Any]]:
    """What the training read-out (kept beside a training checkpoint, never shipped) still names from the state
    0, 1, ... unrelated turns after the statement: whether a miss is the write forgetting or the read not finding
    it. Empty for a checkpoint without a read-out."""
    path = None if checkpoint is None else Path(checkpoint) / READOUT_FILE
    if path is None or not path.is_file():
        return []
    readout = ReadOut.saved(path, model.config.d_self).to(model.device)
    n = 2 * options.episodes
    return [{"depth": d, **heldout_readout(model, readout, n, dynamics, between=d)} for d in sorted({0, *options.depths})]


def rewrites(states: Sequence[Carry], episodes: Sequence[facts.Episode], moved_by: float = 0.5) -> dict[str, Any]:
    """How much of the self state each turn rewrites, from the states ``play`` kept: the share of its dimensions that
    a turn moved by more than ``moved_by`` (s lies in [-1, 1]), on statement turns, on chit-chat before them, and on
    the 1st, 2nd, ... unrelated turn after them; and the share of dimensions saturated (|s| > 0.9) at the end. What
    the facts live in is what unrelated turns leave alone."""
    kinds: dict[str, list[float]] = {"statement": [], "opening": []}
    after: dict[int, list[float]] = {}
    before = torch.zeros_like(states[0].self_state, dtype=torch.float32)
    for t, carry in enumerate(states):
        now = carry.self_state.float()
        share = ((now - before).abs() > moved_by).float().mean(-1)  # (B,)
        for b, episode in enumerate(episodes):
            if t >= len(episode.turns):
                continue
            if t == episode.stated_at:
                kinds["statement"].append(float(share[b]))
            elif t < episode.stated_at:
                kinds["opening"].append(float(share[b]))
            else:
                after.setdefault(t - episode.stated_at, []).append(float(share[b]))
        before = now
    final = states[-1].self_state.float()
    return {
        "moved_by": moved_by,
        **{kind: sum(v) / len(v) if v else None for kind, v in kinds.items()},
        "unrelated": [sum(after[k]) / len(after[k]) for k in sorted(after)],
        "saturated": float((final.abs() > 0.9).float().mean()),
    }


@torch.no_grad()
def reset_determinism(model: LlamaModel) -> dict[str, float]:
    """A fresh (or reset) state reads nothing: its logits equal the base model's (the injection switched off)."""
    tok = model.tokenizer
    assert isinstance(tok, ChatTokenizer)
    talk = facts.chitchat("heldout")[:4]
    context = tok.system_prompt(PERSONAS["sia"].system_prompt)
    rows = [render_turn(tok, context, x.user, x.reply).tokens for x in talk]
    fresh = probe_logits(model, Carry.fresh(model, len(rows)), rows)
    again = probe_logits(model, Carry.fresh(model, len(rows)), rows)
    base = probe_logits(model.base_view(), Carry.fresh(model, len(rows)), rows)  # the same weights, no identity
    return {"fresh_vs_fresh": float((fresh - again).abs().max()), "fresh_vs_base": float((fresh - base).abs().max())}


# ---------------------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------------------


def _pct(x: float) -> str:
    return f"{100 * x:.1f} %"


def report(figures: dict[str, Any]) -> str:
    lines = [
        "# Memory evaluation",
        "",
        f"Checkpoint `{figures['checkpoint']}`; {figures['options']['episodes']} held-out episodes per depth;"
        f" read at the checkpoint's own read shift, {figures.get('read_shift', 0.0):g} (every slot's logit lowered by it).",
        "",
    ]
    lines += ["## Recall of three facts stated in one message (held-out wordings, users, chit-chat)", ""]
    lines += ["| unrelated turns | state | stateless | other user | transcript in context | chance ± sd | all three (state) |"]
    lines += ["|---|---|---|---|---|---|---|"]
    for f in figures["recall"]:
        ch = f["chance"]
        lines.append(
            f"| {f['depth']} | {_pct(f['state']['per_fact'])} | {_pct(f['stateless']['per_fact'])}"
            f" | {_pct(f['other_user']['per_fact'])} | {_pct(f['transcript']['per_fact'])}"
            f" | {_pct(ch['per_fact'])} ± {_pct(ch['per_fact_sd'])}"
            f" | {_pct(f['state']['all_three'])} (chance {_pct(ch['all_three'])}) |"
        )
    lines += ["", "By kind, under the state:", ""]
    for f in figures["recall"]:
        lines.append(f"- {f['depth']} turns: " + ", ".join(f"{k} {_pct(v)}" for k, v in f["state"]["by_kind"].items()))
    if figures.get("pooled"):
        lines += _pooled_report(figures["pooled"])
    o = figures["open_vocabulary"]
    lines += ["", f"## Open vocabulary ({o['depth']} unrelated turns; names and cities never seen in training)", ""]
    lines += ["| kind | state | stateless | transcript | chance |", "|---|---|---|---|---|"]
    for k in OPEN_SET:
        n_values = len(facts.values(k, "heldout"))
        lines.append(
            f"| {k} | {_pct(o['state']['by_kind'][k])} | {_pct(o['stateless']['by_kind'][k])}"
            f" | {_pct(o['transcript']['by_kind'][k])} | {_pct(1 / n_values)} |"
        )
    a = figures["trace_ablation"]
    lines += ["", f"## What the trace contributes ({a['depth']} turns)", ""]
    lines += [f"- trace on: per fact {_pct(a['on']['per_fact'])}, all three {_pct(a['on']['all_three'])}"]
    lines += [f"- trace frozen at zero: per fact {_pct(a['off']['per_fact'])}, all three {_pct(a['off']['all_three'])}"]
    p = figures["perplexity"]
    lines += ["", "## Reply quality and state hygiene", ""]
    lines += [
        f"- held-out dialogue reply perplexity: with state {p['state']:.3f}, base model {p['base']:.3f}, ratio {p['ratio']:.4f}"
    ]
    lines += [f"- history KL (same message, two users' states): {figures['history_kl']:.4f} nats per reply token"]
    r = figures["reset"]
    lines += [
        f"- reset determinism: max |Δlogit| fresh vs fresh {r['fresh_vs_fresh']:.2e}, "
        f"fresh vs base model {r['fresh_vs_base']:.2e}"
    ]
    if figures.get("retention"):
        lines += ["", "## Is it still in the state? (the training read-out, held-out statements of colour, pet, hobby)", ""]
        lines += ["| unrelated turns since the statement | " + " | ".join(str(f["depth"]) for f in figures["retention"]) + " |"]
        lines += ["|---|" + "---|" * len(figures["retention"])]
        lines += ["| read-out accuracy (chance 16.7 %) | " + " | ".join(_pct(f["readout"]) for f in figures["retention"]) + " |"]
    if figures.get("rewrites"):
        w = figures["rewrites"]
        lines += ["", f"## How much each turn rewrites ({figures['options']['target_depth']}-turn episodes)", ""]
        lines += [
            f"Share of the self state's dimensions a turn moved by more than {w['moved_by']:g} (s lies in [-1, 1]): "
            f"statement turns {_pct(w['statement'])}"
            + ("" if w["opening"] is None else f", chit-chat before them {_pct(w['opening'])}")
            + ", unrelated turns after them "
            + " / ".join(_pct(x) for x in w["unrelated"])
            + f" (1st, 2nd, ...); dimensions saturated (|s| > 0.9) after the last turn: {_pct(w['saturated'])}."
        ]
    if figures.get("read_strength"):
        depth = figures["options"]["target_depth"]
        lines += ["", f"## The read's strength: memory against language ({depth} unrelated turns)", ""]
        lines += ["| slot logits lowered by | per fact | all three | reply perplexity / base |", "|---|---|---|---|"]
        for row in figures["read_strength"]:
            lines.append(
                f"| {row['shift']:g} | {_pct(row['state']['per_fact'])} | {_pct(row['state']['all_three'])}"
                f" | {row['perplexity_ratio']:.3f}× |"
            )
    lines += ["", "## Targets", "", "| target | measured | met |", "|---|---|---|"]
    for t in figures["targets"]:
        lines.append(f"| {t['name']} | {t['measured']} | {'yes' if t['met'] else 'no'} |")
    lines += ["", "![recall by depth](recall.png)", "", "![self state](self_state.png)", "", "![trace spectra](spectra.png)", ""]
    if figures.get("training"):
        lines += ["![training](training.png)", ""]
    return "\n".join(lines)


def _pooled_report(p: dict[str, Any]) -> list[str]:
    lines = ["", f"## The acceptance figure: recall after {p['depth']} turns over {len(p['draws'])} held-out draws", ""]
    lines += ["| draw (eval seed) | episodes | per fact | all three | stateless | other user |", "|---|---|---|---|---|---|"]
    for r in p["draws"]:
        lines.append(
            f"| {r['draw']} | {r['episodes']} | {_pct(r['state']['per_fact'])}"
            f" | {_pct(r['state']['all_three'])} | {_pct(r['stateless']['per_fact'])} | {_pct(r['other_user']['per_fact'])} |"
        )
    ch = p["chance"]
    lines.append(
        f"| **pooled** | {p['episodes']} | **{_pct(p['state']['per_fact'])}** | **{_pct(p['state']['all_three'])}**"
        f" | {_pct(p['stateless']['per_fact'])} | {_pct(p['other_user']['per_fact'])} |"
    )
    lines += [
        "",
        f"Chance over every episode drawn: per fact {_pct(ch['per_fact'])} ± {_pct(ch['per_fact_sd'])}, all three"
        f" {_pct(ch['all_three'])} ± {_pct(ch['all_three_sd'])}. By kind, pooled: "
        + ", ".join(f"{k} {_pct(v)}" for k, v in p["state"]["by_kind"].items())
        + ". The targets below are judged on the pooled figures.",
    ]
    return lines


def targets(figures: dict[str, Any], options: EvalOptions) -> list[dict[str, Any]]:
    """The targets, judged at the target depth on the pooled draws where there are any, else on the one draw."""
    at = figures.get("pooled") or next(f for f in figures["recall"] if f["depth"] == options.target_depth)
    deep = [f for f in figures["recall"] if f["depth"] >= 2 * options.target_depth]
    ch = at["chance"]
    ceiling = ch["per_fact"] + 2 * ch["per_fact_sd"]
    over = f" ({at['episodes']} episodes, {len(at['draws'])} draws)" if "draws" in at else ""
    out = [
        {
            "name": f"per fact after {options.target_depth} turns >= 90 %{over}",
            "measured": _pct(at["state"]["per_fact"]),
            "met": at["state"]["per_fact"] >= 0.9,
        },
        {
            "name": f"all three after {options.target_depth} turns >= 75 %{over}",
            "measured": _pct(at["state"]["all_three"]),
            "met": at["state"]["all_three"] >= 0.75,
        },
        {
            "name": f"stateless <= chance + 2 sd ({_pct(ceiling)})",
            "measured": _pct(at["stateless"]["per_fact"]),
            "met": at["stateless"]["per_fact"] <= ceiling,
        },
        {
            "name": f"other user's state <= chance + 2 sd ({_pct(ceiling)})",
            "measured": _pct(at["other_user"]["per_fact"]),
            "met": at["other_user"]["per_fact"] <= ceiling,
        },
        {
            "name": "reply perplexity <= 1.05x base",
            "measured": f"{figures['perplexity']['ratio']:.4f}x",
            "met": figures["perplexity"]["ratio"] <= 1.05,
        },
    ]
    o = figures["open_vocabulary"]["state"]["by_kind"]
    open_mean = (o["name"] + o["city"]) / 2
    out.append({"name": "stretch: open vocabulary >= 80 %", "measured": _pct(open_mean), "met": open_mean >= 0.8})
    if deep:
        out.append(
            {
                "name": f"stretch: {deep[0]['depth']} turns >= 80 %",
                "measured": _pct(deep[0]["state"]["per_fact"]),
                "met": deep[0]["state"]["per_fact"] >= 0.8,
            }
        )
    return out


def run_eval(
    checkpoint: str | Path | None,
    out_dir: str | Path,
    options: EvalOptions = EvalOptions(),
    *,
    history: Path | None = None,
    cache_dir: str | Path = DEFAULT_CACHE,
) -> dict[str, Any]:
    """Evaluate a LLaMA-family SIA checkpoint; writes report.md, figures.json and plots into ``out_dir``."""
    model = load_model(checkpoint, cache_dir=cache_dir)
    if not isinstance(model, LlamaModel) or not isinstance(model.tokenizer, ChatTokenizer):
        raise ValueError("this evaluation is for a LLaMA-family checkpoint with a chat tokenizer; the native model has its own")
    if not model.config.memory_tokens:
        raise ValueError("the checkpoint's identity has no memory tokens: it was not trained to remember (see docs/model.md)")
    model.to(torch.device(options.device))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    dynamics = Dynamics.from_config(model.config)
    figures: dict[str, Any] = {
        "checkpoint": str(checkpoint or "bundled"),
        "options": options.__dict__ | {"depths": list(options.depths), "draws": list(options.draws)},
        "read_shift": model.read_shift,  # every figure but read_strength's is read at the checkpoint's own
    }
    by_depth, kept = [], None
    for depth in options.depths:
        f, episodes, states = recall_at(model, depth, CLOSED_TRIO, options, dynamics)
        by_depth.append(f)
        if depth == options.target_depth:
            kept = (episodes, states)
    figures["recall"] = by_depth
    if options.draws:
        figures["pooled"] = pooled_recall(model, options, dynamics)
    assert kept is not None
    episodes, states = kept
    o, _, _ = recall_at(model, options.target_depth, OPEN_SET, options, dynamics, ("state", "stateless", "transcript"))
    figures["open_vocabulary"] = o
    frozen = Dynamics(alpha=0.0, decay=dynamics.decay, eta=dynamics.eta)
    off, _, _ = recall_at(model, options.target_depth, CLOSED_TRIO, options, frozen, ("state",))
    on = next(f for f in by_depth if f["depth"] == options.target_depth)
    figures["trace_ablation"] = {"depth": options.target_depth, "on": on["state"], "off": off["state"]}
    figures["perplexity"] = dialogue_perplexity(model, dynamics, options.conversations)
    figures["history_kl"] = history_kl(model, states[-1])
    figures["reset"] = reset_determinism(model)
    figures["retention"] = retention(model, checkpoint, options, dynamics)
    figures["rewrites"] = rewrites(states, episodes)
    if options.read_shifts:
        figures["read_strength"] = read_strength(model, dynamics, options)
    figures["targets"] = targets(figures, options)
    plot_recall(by_depth, out / "recall.png", CONDITIONS, TARGETS["per_fact"])
    plot_self_state(states, episodes[0], 0, out / "self_state.png")
    plot_spectra(model, states[-1], 0, out / "spectra.png")
    if history is not None and history.is_file():
        plot_training(history, out / "training.png")
        figures["training"] = str(history)
    (out / "figures.json").write_text(json.dumps(figures, indent=2) + "\n")
    (out / "report.md").write_text(report(figures) + "\n")
    return figures
