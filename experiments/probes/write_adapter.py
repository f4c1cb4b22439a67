"""A write adapter: the imprint's entries computed with a learned correction, the read left as it ships.

The imprint keeps the base model's own keys and values of the user's words, and the read adapter (rank 8 on q, v, o)
learns to read them from the question's side only. When the same kind of adapter sees the statement's tokens too (the
spike of MEMORY.md §6, the statement in context), unseen names were read back from a single statement every time. This
probe gives the entries a side of their own: per layer, a rank-r map of the layer's attention input added to each
entry's pre-rotation key and value (k + B_k A x, v + B_v A x; B at zero: the shipped entries exactly). The write pass
itself is untouched (its logits, its token shock, the kind tagger), so a fresh identity is still the base model and
the selection is as it ships; only what is stored moves.

    # train the write adapter alone over the shipped checkpoint (the read adapter, gate, tagger and heads frozen)
    PYTHONPATH=. python -m experiments.probes.write_adapter train --out runs/write8 [--steps 120] [--rank 8]
    # the natural set's tuning part through it (``sia eval --natural`` with the entries written through the adapter)
    PYTHONPATH=. python -m experiments.probes.write_adapter eval --adapter runs/write8/write.safetensors -- \
        --natural tune --depths 4 --modes state --conversations 0 --out DIR

Training: the read adapter's data (``sia.learn.imprint_read``: generated statements with distractors, asides, others'
facts, split messages; a share of the natural training part), each conversation imprinted as a turn imprints it, the
held entries' layer inputs kept, the adapter's correction added to them with gradients, then the question's answer
cross-entropy and the KL to the base of an ordinary reply read with the same imprint (its weight as the read's runs).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import random
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

from sia.backbones.llama import LlamaModel
from sia.identity.imprint import Imprint, ImprintEntries
from sia.learn.imprint_read import (
    ReadPhrases,
    _batch,
    _conditioned,
    _written,
    make_example,
    natural_example,
)
from sia.learn.natural import load_users

log = logging.getLogger("experiments.write_adapter")


class WriteAdapter(nn.Module):
    """Per layer l: entries' (key, value) += B_l A_l h, h the layer's attention input (the RMS-normed residual)."""

    def __init__(self, n_layer: int, C: int, kv: int, rank: int, seed: int = 0) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.kv = kv
        self.down = nn.Parameter(torch.randn(n_layer, rank, C, generator=g) / math.sqrt(C))
        self.up = nn.Parameter(torch.zeros(n_layer, 2 * kv, rank))

    def forward(self, h: Tensor) -> Tensor:
        """h (n_layer, N, C) -> the corrections (n_layer, N, 2·kv): keys' first, values' after."""
        return torch.einsum("lnr,lor->lno", torch.einsum("lnc,lrc->lnr", h, self.down), self.up)


def split(delta: Tensor, H_kv: int, d: int) -> tuple[Tensor, Tensor]:
    """(n_layer, N, 2·H_kv·d) -> key and value corrections (n_layer, H_kv, N, d) each."""
    n_layer, N, _ = delta.shape
    k, v = delta[..., : H_kv * d], delta[..., H_kv * d :]
    return k.reshape(n_layer, N, H_kv, d).permute(0, 2, 1, 3), v.reshape(n_layer, N, H_kv, d).permute(0, 2, 1, 3)


@contextlib.contextmanager
def layer_inputs(model: LlamaModel) -> Iterator[list[Tensor]]:
    """Every attention input (B, L, C) the model's blocks compute while open, in call order."""
    seen: list[Tensor] = []
    hooks = [
        b.attn_norm.register_forward_hook(  # type: ignore[union-attr]
            lambda _m, _i, out: seen.append(out.detach())
        )
        for b in model.blocks
    ]
    try:
        yield seen
    finally:
        for hook in hooks:
            hook.remove()


@torch.no_grad()
def reads_with_inputs(
    model: LlamaModel, prompts: Sequence[tuple[list[int], tuple[int, int]]], rows: int = 16
) -> list[tuple[Tensor, Any, Tensor]]:
    """``message_reads`` plus each prompt's attention inputs (n_layer, n, C) over its read tokens."""
    out = []
    n_layer = model.config.n_layer
    for at in range(0, len(prompts), rows):
        chunk = prompts[at : at + rows]
        lengths = [end - 1 for _, (_, end) in chunk]
        cut = [(tokens[:n], 1) for (tokens, _), n in zip(chunk, lengths, strict=True)]
        idx, _ = _batch(cut, model.tokenizer.pad_id, model.device)
        with layer_inputs(model) as seen:
            reads = model.read_rows(idx, lengths, logits=True)
        hs = torch.stack(seen[:n_layer], 1).float()  # (B, n_layer, L, C)
        for b, ((tokens, (start, end)), words) in enumerate(zip(chunk, reads, strict=True)):
            targets = torch.tensor(tokens[start : end - 1], device=model.device)[:, None]
            assert words.logits is not None
            nll = -F.log_softmax(words.logits[start - 1 : end - 2].float(), -1).gather(-1, targets)[:, 0].cpu()
            out.append((nll, replace(words, logits=None), hs[b, :, : lengths[b]]))
    return out


def entry_inputs(imprint: Imprint, prompts: Sequence[tuple[list[int], tuple[int, int]]], hs: Sequence[Tensor]) -> Tensor:
    """The attention inputs (n_layer, N, C) of the imprint's entries (zeros where empty): entry n is token
    ``offset[n]`` of turn ``turn[n]``'s message."""
    n_layer, _, C = hs[0].shape
    N = imprint.capacity
    X = hs[0].new_zeros(n_layer, N, C)
    for n in range(N):
        if int(imprint.span[n]) < 0:
            continue
        t, o = int(imprint.turn[n]), int(imprint.offset[n])
        start = prompts[t][1][0]
        X[:, n] = hs[t][:, start + o]
    return X


_DELTAS: dict[int, tuple[Tensor, Tensor]] = {}  # id(imprint) -> its key and value corrections, while a step runs
_stack = ImprintEntries.stack.__func__  # type: ignore[attr-defined]


def _stack_with_deltas(
    cls: type, imprints: Sequence[Imprint | None], shape: tuple[int, int, int, int], dtype: torch.dtype
) -> ImprintEntries:
    entries: ImprintEntries = _stack(cls, imprints, shape, dtype)
    if not any(id(i) in _DELTAS for i in imprints if i is not None):
        return entries
    keys, values = [], []
    for b, imprint in enumerate(imprints):
        dk, dv = _DELTAS.get(id(imprint), (None, None)) if imprint is not None else (None, None)
        keys.append(entries.keys[b] if dk is None else entries.keys[b] + dk.to(entries.keys.dtype))
        values.append(entries.values[b] if dv is None else entries.values[b] + dv.to(entries.values.dtype))
    out: ImprintEntries = replace(entries, keys=torch.stack(keys), values=torch.stack(values))
    return out


def train(args: argparse.Namespace) -> None:
    from sia.checkpoint import DEFAULT_CACHE, load_llama_checkpoint
    from sia.personas import PERSONAS, persona_prompt

    torch.set_num_threads(args.threads)
    model = load_llama_checkpoint(args.checkpoint, DEFAULT_CACHE)
    c = model.config
    tok = model.tokenizer
    H_kv, d = c.n_kv_head, c.head_dim
    adapter = WriteAdapter(c.n_layer, c.n_embd, H_kv * d, args.rank, seed=args.seed)
    for p in model.parameters():
        p.requires_grad_(False)
    opt = torch.optim.AdamW(adapter.parameters(), lr=args.lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5 * (1 + math.cos(math.pi * min(s, args.steps) / args.steps)))
    systems = [tok.system_prompt(persona_prompt(model, name)) for name in sorted(PERSONAS)]
    phrases = ReadPhrases.load()
    natural = load_users("train")
    rng = random.Random(args.seed)
    torch.manual_seed(args.seed)
    ImprintEntries.stack = classmethod(_stack_with_deltas)  # type: ignore[assignment,method-assign]
    history = []
    started = time.perf_counter()
    args.out.mkdir(parents=True, exist_ok=True)
    for step in range(1, args.steps + 1):
        examples = []
        for _ in range(args.batch):
            ex = None
            if rng.random() < args.natural_rate:
                ex = natural_example(rng, phrases, rng.choice(natural), distractors=args.distractors)
            if ex is None:
                ex = make_example(
                    rng, phrases, distractors=args.distractors, extra_rate=0.25, others_rate=0.2, split_rate=0.3, aside_rate=0.5
                )
            examples.append(ex)
        model.eval()
        system = [rng.choice(systems) for _ in examples]
        starts = [len(s) for s in system]
        imprints: list[Imprint | None] = []
        _DELTAS.clear()
        for s, ex in zip(system, examples, strict=True):
            prompts = [tok.turn_prompt(m, s) for m in ex.messages]
            reads = reads_with_inputs(model, prompts)
            written = list(_written(model, prompts, [(nll, w) for nll, w, _ in reads], keep_text=False))
            imprint = written[-1][0] if written else Imprint.empty(c)
            imprints.append(imprint)
            if imprint.used:
                X = entry_inputs(imprint, prompts, [h for _, _, h in reads])
                dk, dv = split(adapter(X), H_kv, d)
                filled = (imprint.span >= 0).float().view(1, 1, -1, 1)
                _DELTAS[id(imprint)] = (dk * filled, dv * filled)
        asked = [(tok.turn_prompt(ex.question, s)[0], ex.answer) for s, ex in zip(system, examples, strict=True)]
        rows = [(prompt + tok.reply_tokens(answer), len(prompt)) for prompt, answer in asked]
        idx, counted = _batch(rows, tok.pad_id, model.device)
        logits = model(idx, _conditioned(model, imprints, starts, [ex.question for ex in examples])).logits[:, :-1]
        answer = F.cross_entropy(logits[counted], idx[:, 1:][counted])
        said = [tok.turn_prompt(ex.exchange[0], s)[0] for s, ex in zip(system, examples, strict=True)]
        rows = [(prompt + tok.reply_tokens(ex.exchange[1]), len(prompt)) for prompt, ex in zip(said, examples, strict=True)]
        idx, counted = _batch(rows, tok.pad_id, model.device)
        with torch.no_grad():
            teacher = model(idx, _conditioned(model, [None] * len(rows), starts)).logits[:, :-1][counted]
        student = model(idx, _conditioned(model, imprints, starts, [ex.exchange[0] for ex in examples])).logits[:, :-1][counted]
        kl = F.kl_div(
            F.log_softmax(student.float(), -1), F.log_softmax(teacher.float(), -1), log_target=True, reduction="batchmean"
        )
        loss = answer + args.distill * kl
        if loss.requires_grad:
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(adapter.parameters(), 1.0)
            opt.step()
        sched.step()
        record = {
            "step": step,
            "answer": answer.item(),
            "kl": kl.item(),
            "seconds": round(time.perf_counter() - started, 1),
            "up": float(adapter.up.detach().norm()),
        }
        history.append(record)
        if step % 10 == 0 or step == 1:
            log.info(
                "step %d: answer %.3f kl %.4f |up| %.3f (%.0f s)",
                step,
                record["answer"],
                record["kl"],
                record["up"],
                record["seconds"],
            )
            save_file(
                {"down": adapter.down.detach().contiguous(), "up": adapter.up.detach().contiguous()},
                str(args.out / "write.safetensors"),
            )
            (args.out / "history.json").write_text(
                json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "history": history}, indent=1) + "\n"
            )


def patch_write(weights: Path) -> None:
    """Every read of the model's words (the imprint's write) adds the adapter's corrections to the keys and values."""
    tensors = load_file(str(weights))
    original = LlamaModel._read

    def _read(self: LlamaModel, idx: Tensor, lengths: Sequence[int], logits: bool, cache: Any) -> list[Any]:
        c = self.config
        adapter = WriteAdapter(c.n_layer, c.n_embd, c.n_kv_head * c.head_dim, tensors["down"].shape[1])
        adapter.load_state_dict(tensors)
        with layer_inputs(self) as seen:
            reads = original(self, idx, lengths, logits, cache)
        hs = torch.stack(seen[: c.n_layer], 1).float()  # (B, n_layer, L, C)
        out = []
        for b, words in enumerate(reads):
            with torch.no_grad():
                dk, dv = split(adapter(hs[b, :, : lengths[b]]), c.n_kv_head, c.head_dim)
            out.append(replace(words, keys=words.keys + dk.to(words.keys), values=words.values + dv.to(words.values)))
        return out

    LlamaModel._read = _read  # type: ignore[method-assign]


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="command", required=True)
    t = sub.add_parser("train")
    t.add_argument("--checkpoint", type=Path, default=Path("sia/checkpoints/smollm2"))
    t.add_argument("--out", type=Path, required=True)
    t.add_argument("--steps", type=int, default=120)
    t.add_argument("--batch", type=int, default=8)
    t.add_argument("--rank", type=int, default=8)
    t.add_argument("--lr", type=float, default=1e-3)
    t.add_argument("--distill", type=float, default=10.0)
    t.add_argument("--distractors", type=int, default=4)
    t.add_argument("--natural-rate", type=float, default=0.3)
    t.add_argument("--seed", type=int, default=46)
    t.add_argument("--threads", type=int, default=2)
    e = sub.add_parser("eval")
    e.add_argument("--adapter", type=Path, required=True)
    e.add_argument("rest", nargs=argparse.REMAINDER)
    args = p.parse_args()
    if args.command == "train":
        train(args)
        return
    patch_write(args.adapter)
    from server.cli import main as cli

    sys.argv = ["sia", "eval", *[a for a in args.rest if a != "--"]]
    cli()


if __name__ == "__main__":
    main()
