"""Does the model's own attention over the imprint point at the asked value even where its reply does not give it?
And would copying from it (a pointer over the imprinted tokens' ids, weighted by that attention) give the value?

The natural set's tuning part (or the training part) is played as ``sia eval --natural`` plays it (the user's
messages, ``--depth`` unrelated turns, the shipped write and read), then each question is asked while every layer's
attention weights on the imprint's entries are recorded at the position that predicts the next token.

Diagnostic: for each (layer, query head), at the step of a right reply that emits the value's first token, how often
the entry it attends to most holds that very token ("points right"), and how much of its attention the imprint takes.

Copy decoding (``--copy L1,L2,..:lam ...``): the next-token distribution mixed with the imprint's tokens,
p = (softmax(logits) + lam·a) / (1 + lam·|a|), a(v) = the mean over the named layers and their query heads of the
attention weight on entries whose token is v (the weights are shares of the whole softmax, so a small read moves
little). ``--heads K``: only the K (layer, head) pairs that point right most often in the diagnostic of the same run.
``--shipped LAM ...``: the model's own copy read (``config.imprint_copy``, with the ask head's weight and the wait
for a word's previous piece) at LAM; ``LAMu`` without that wait; ``LAMk`` each entry of known kind weighed by how
likely the question asks its kind; ``LAM@24.4,23.0`` pointed by those [layer, query head] pairs
(``imprint_copy_heads``). ``--states DIR`` keeps the states after talking (or reads them from an earlier run).

    PYTHONPATH=. python -m experiments.probes.copy_read [--part tune] [--users 60] [--depth 4] [--copy 20-29:1 ...]
        [--heads 16] [--shipped 4 4u] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from sia.backbones import injected_attention, llama
from sia.backbones.llama import LlamaModel
from sia.checkpoint import load_model
from sia.identity.state import Dynamics, IdentityState, state_from_bytes, state_to_bytes
from sia.identity.turn import TurnRequest, stream_turns
from sia.learn.natural import ASK, TALK, answered, filler, load_fillers, load_users
from sia.personas import PERSONAS

_REC: dict[str, Any] = {"on": False, "layers": {}}  # layer -> (B, H, N) weights on the imprint at the last query
_COPY: dict[str, Any] = {"tokens": None, "pairs": None, "lam": 0.0}  # tokens (B, N) ids, -1 none; pairs [(layer, head)]
_STEPS: list[Tensor] = []  # per forward while recording: (B, n_layer, H, N)
_original_attend = injected_attention.InjectedAttention._attend
_original_forward = llama.LlamaModel.forward


def _attend(
    self: injected_attention.InjectedAttention,
    q_aug: Tensor,
    k_aug: Tensor,
    v_aug: Tensor,
    lc: Any,
    cache: Any,
    layer: int,
    attn_mask: Tensor | None,
    starts: list[int] | None,
    reads: injected_attention.EntryReads | None = None,
) -> Tensor:
    y = _original_attend(self, q_aug, k_aug, v_aug, lc, cache, layer, attn_mask, starts, reads)
    if not _REC["on"] or lc is None or cache is None:
        return y
    B, H, Lq, _ = q_aug.shape
    end = cache.length + Lq
    keys = cache.keys[layer][:, :, :end].float()  # (B, H_kv, Lk, w)
    G = H // keys.shape[1]
    q = q_aug[:, :, -1].float()  # (B, H, w)
    logits = torch.einsum("bhw,bhkw->bhk", q, keys.repeat_interleave(G, dim=1))  # (B, H, Lk)
    Lk = keys.shape[2]
    visible = torch.ones(B, Lk, dtype=torch.bool)
    if attn_mask is not None:
        visible = attn_mask[:, 0, -1].bool()
    elif starts is not None:
        at = torch.arange(Lk)
        visible = torch.stack([(at < cache.prefix) | (at >= s) for s in starts])
    logits = logits.masked_fill(~visible[:, None, :], float("-inf"))
    weights = torch.softmax(logits, dim=-1)
    S = self.S
    N = lc.slot_key.shape[2] - S
    _REC["layers"][layer] = weights[:, :, S : S + N]  # (B, H, N)
    return y


def _forward(self: LlamaModel, idx: Tensor, cond: Any, **kw: Any) -> Any:
    _REC["layers"] = {}
    out = _original_forward(self, idx, cond, **kw)
    if not _REC["on"] or not _REC["layers"] or kw.get("memory"):
        return out
    w = torch.stack([_REC["layers"][i] for i in sorted(_REC["layers"])], dim=1)  # (B, n_layer, H, N)
    _STEPS.append(w)
    tokens, pairs, lam = _COPY["tokens"], _COPY["pairs"], _COPY["lam"]
    if tokens is None or not pairs or not lam:
        return out
    a = torch.stack([w[:, layer, head] for layer, head in pairs]).mean(0)  # (B, N)
    a = a.masked_fill(tokens < 0, 0.0)
    logits = out.logits
    V = logits.shape[-1]
    copy = torch.zeros(a.shape[0], V).scatter_add_(1, tokens.clamp_min(0).long(), a)  # (B, V)
    p = torch.softmax(logits[:, -1].float(), -1)
    mixed = (p + lam * copy) / (1.0 + lam * a.sum(-1, keepdim=True))
    logits = logits.clone()
    logits[:, -1] = mixed.clamp_min(1e-30).log().to(logits.dtype)
    return type(out)(logits=logits, stats=out.stats, memory=out.memory)


injected_attention.InjectedAttention._attend = _attend  # type: ignore[method-assign]
llama.LlamaModel.forward = _forward  # type: ignore[method-assign]


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _value_step(tok: Any, reply_tokens: Sequence[int], accepts: Sequence[str]) -> int | None:
    """The index of the reply token where the first accepted value mentioned begins, or None."""
    text = tok.decode(list(reply_tokens))
    best = None
    for a in accepts:
        m = re.search(r"(?<![\w])" + re.escape(a.lower()), text.lower())
        if m and (best is None or m.start() < best):
            best = m.start()
    if best is None:
        return None
    for i in range(len(reply_tokens)):
        if len(tok.decode(list(reply_tokens[: i + 1]))) > best:
            return i
    return None


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--part", default="tune")
    ap.add_argument("--users", type=int, default=None)
    ap.add_argument("--depth", type=int, default=4)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--checkpoint", type=Path, default=None)
    ap.add_argument("--copy", nargs="*", default=[], help="LAYERS:LAMBDA, LAYERS as 20-29 or 3,5,9 or 'top'")
    ap.add_argument("--heads", type=int, default=16, help="pairs for 'top': the K that point right most often")
    ap.add_argument(
        "--shipped",
        nargs="*",
        default=[],
        help="LAMBDA[u][k][@L.H,...]: the model's own copy read (config.imprint_copy) at LAMBDA; u: every entry "
        "copied anywhere (no wait for the word's previous piece); k: entries weighed by p(their kind asked); "
        "@: pointed by those [layer, query head] pairs only",
    )
    ap.add_argument("--states", type=Path, default=None, help="a folder: the states after talking kept there, or read")
    ap.add_argument("--out", type=Path, default=Path("experiments/probes/results/copy_read.json"))
    args = ap.parse_args(argv)
    if args.part not in ("tune", "train"):
        raise SystemExit("--part is tune or train: the held-out part is never played by a probe")
    torch.manual_seed(0)
    model = load_model(args.checkpoint)
    assert isinstance(model, LlamaModel)
    tok = model.tokenizer
    system = tuple(tok.system_prompt(PERSONAS["sia"].system_prompt))
    users = load_users(args.part)[: args.users]
    fillers = load_fillers("tune")
    dynamics = Dynamics.from_config(model.config)
    states = {u.id: IdentityState.fresh(model.config) for u in users}
    started = time.perf_counter()
    kept = args.states is not None and args.states.is_dir()
    if kept:
        states = {u.id: state_from_bytes((args.states / u.id).read_bytes(), model.config) for u in users}
    turns = [] if kept else [[*u.messages, *(filler(fillers, n, j) for j in range(args.depth))] for n, u in enumerate(users)]
    for i in range(max((len(t) for t in turns), default=0)):
        order = [u for u, t in zip(users, turns, strict=True) if i < len(t)]
        said = {u.id: t[i] for u, t in zip(users, turns, strict=True) if i < len(t)}
        requests = [TurnRequest(states[u.id], said[u.id], dynamics, system, True) for u in order]
        for a in range(0, len(requests), args.batch):
            for u, r in zip(
                order[a : a + args.batch], stream_turns(model, requests[a : a + args.batch], TALK).finish(), strict=True
            ):
                states[u.id] = r.state
    _say(f"talked in {time.perf_counter() - started:.0f} s")
    if args.states is not None and not kept:
        args.states.mkdir(parents=True)
        for u in users:
            (args.states / u.id).write_bytes(state_to_bytes(states[u.id]))
    pairs_q = [(u, q) for u in users for q in u.questions]
    N = model.config.imprint_tokens
    held = [states[u.id].imprint for u, _ in pairs_q]
    ids = torch.stack([torch.full((N,), -1, dtype=torch.int32) if i is None else i.token for i in held])

    def ask(pairs: list[tuple[int, int]] | None, lam: float) -> tuple[list[str], list[list[int]], list[list[Tensor]]]:
        replies, tokens, weights = [], [], []
        _REC["on"] = True
        for a in range(0, len(pairs_q), args.batch):
            chunk = pairs_q[a : a + args.batch]
            _COPY.update(tokens=ids[a : a + args.batch], pairs=pairs, lam=lam)
            _STEPS.clear()
            reqs = [TurnRequest(states[u.id], q.text, dynamics, system, True) for u, q in chunk]
            stream = stream_turns(model, reqs, ASK)
            got: list[list[int]] = [[] for _ in chunk]
            for ev in stream:
                got[ev.row].append(ev.token)
            results = stream.result
            if len(_STEPS) != max(len(g) for g in got):
                _say(f"warning: {len(_STEPS)} recorded forwards for {max(len(g) for g in got)} tokens")
            replies += [r.reply for r in results]
            tokens += got
            # _STEPS: the prefill's forward, then one per decoding step (and the write's memory pass, skipped)
            for b in range(len(chunk)):
                weights.append([s[b] for s in _STEPS[: len(got[b])]])
        _REC["on"] = False
        return replies, tokens, weights

    results: dict[str, Any] = {"part": args.part, "depth": args.depth, "questions": len(pairs_q), "conditions": {}}

    def score(name: str, replies: list[str]) -> list[bool]:
        right = [answered(r, u, q.kind) for (u, q), r in zip(pairs_q, replies, strict=True)]
        by_kind: dict[str, list[bool]] = {}
        for (_, q), ok in zip(pairs_q, right, strict=True):
            by_kind.setdefault(q.kind, []).append(ok)
        results["conditions"][name] = {
            "per_fact": sum(right) / len(right),
            "by_kind": {k: round(sum(v) / len(v), 3) for k, v in sorted(by_kind.items())},
            "replies": [[u.id, q.kind, r] for (u, q), r in zip(pairs_q, replies, strict=True)],
        }
        _say(f"{name}: {sum(right) / len(right):.3f} {results['conditions'][name]['by_kind']}")
        return right

    shipped_lam = model.config.imprint_copy
    model.config.imprint_copy = 0.0  # the diagnostic and the probe's own pointers read without the model's copy
    started = time.perf_counter()
    replies, tokens, weights = ask(None, 0.0)
    right = score("none", replies)
    _say(f"asked in {time.perf_counter() - started:.0f} s")
    n_layer, H = weights[0][0].shape[:2]
    hits = torch.zeros(n_layer, H)
    mass = torch.zeros(n_layer, H)
    counted = 0
    wrong_reach = torch.zeros(n_layer, H)  # wrong replies: some step where the pair's top entry is a value token
    wrong_n = 0
    for i, ((u, q), ok) in enumerate(zip(pairs_q, right, strict=True)):
        if not weights[i]:
            continue
        accepts = u.newest(q.kind).accept
        if ok:
            at = _value_step(tok, tokens[i], accepts)
            if at is None or at >= len(weights[i]):
                continue
            w = weights[i][at]  # (n_layer, H, N)
            top = w.argmax(-1)  # (n_layer, H)
            hits += (ids[i][top] == tokens[i][at]).float()
            mass += w.sum(-1)
            counted += 1
        else:
            value_ids = set()
            for value in accepts:
                for form in (value, " " + value, value.capitalize(), " " + value.capitalize()):
                    value_ids.add(tok.encode(form)[0])
            reach = torch.zeros(n_layer, H, dtype=torch.bool)
            for w in weights[i]:
                top_ids = ids[i][w.argmax(-1)]
                reach |= torch.isin(top_ids, torch.tensor(sorted(value_ids)))
            wrong_reach += reach.float()
            wrong_n += 1
    rate = hits / max(counted, 1)
    ranked = rate.flatten().argsort(descending=True)
    best = [(int(o) // H, int(o) % H) for o in ranked[: args.heads]]
    results["diagnostic"] = {
        "right_value_steps": counted,
        "points_right": [[round(float(x), 3) for x in row] for row in rate],
        "imprint_mass": [[round(float(x), 3) for x in row] for row in mass / max(counted, 1)],
        "wrong": wrong_n,
        "wrong_reach": [[round(float(x), 3) for x in row] for row in wrong_reach / max(wrong_n, 1)],
        "top_pairs": best,
    }
    _say(f"right value steps {counted}; best pairs {[(l, h, round(float(rate[l, h]), 3)) for l, h in best]}")
    _say("per layer, best head's points-right rate: " + " ".join(f"{float(r.max()):.2f}" for r in rate))
    _say("per layer, mean imprint mass: " + " ".join(f"{float(m.mean()):.3f}" for m in mass / max(counted, 1)))
    _say(
        "wrong replies reached by the best pairs: " + str([round(float(wrong_reach[l, h] / max(wrong_n, 1)), 3) for l, h in best])
    )
    for spec in args.copy:
        layers_s, lam_s = spec.split(":")
        if layers_s == "top":
            pairs = best
        else:
            if "-" in layers_s:
                lo, hi = (int(x) for x in layers_s.split("-"))
                layers = list(range(lo, hi + 1))
            else:
                layers = [int(x) for x in layers_s.split(",")]
            pairs = [(layer, h) for layer in layers for h in range(H)]
        started = time.perf_counter()
        replies, _, _ = ask(pairs, float(lam_s))
        score(f"copy {spec}", replies)
        _say(f"  ({time.perf_counter() - started:.0f} s)")
    gated, weighed = LlamaModel.copy_after, LlamaModel.copy_weight

    def of_kind(self: LlamaModel, imprint: Any, asked: Tensor | None) -> Tensor | None:
        """An entry of known kind copies lam·p(its kind asked); one of unknown kind lam·(1 - p(none))."""
        weight = weighed(self, imprint, asked)
        if weight is None or asked is None:
            return weight
        p = asked.float().to(weight.device)
        share = p.gather(1, imprint.kind.to(weight.device)) / (1.0 - p[:, :1]).clamp_min(1e-6)
        return weight * torch.where(imprint.kind.to(weight.device) > 0, share, torch.ones_like(share))

    copy_layers, copy_heads = model.config.imprint_copy_layers, model.config.imprint_copy_heads
    for spec in args.shipped:
        lam_s, _, at = spec.partition("@")
        model.config.imprint_copy = float(lam_s.rstrip("uk"))
        if at:
            named = sorted([int(x) for x in p.split(".")] for p in at.split(","))
            model.config.imprint_copy_heads = named
            model.config.imprint_copy_layers = sorted({p[0] for p in named})
        if "u" in spec:
            LlamaModel.copy_after = lambda self, imprint: torch.full_like(imprint.token, -1)  # type: ignore[method-assign]
        if "k" in spec:
            LlamaModel.copy_weight = of_kind  # type: ignore[method-assign]
        started = time.perf_counter()
        replies, _, _ = ask(None, 0.0)
        LlamaModel.copy_after, LlamaModel.copy_weight = gated, weighed  # type: ignore[method-assign]
        model.config.imprint_copy_layers, model.config.imprint_copy_heads = copy_layers, copy_heads
        score(f"shipped {spec}", replies)
        _say(f"  ({time.perf_counter() - started:.0f} s)")
    model.config.imprint_copy = shipped_lam
    args.out.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
