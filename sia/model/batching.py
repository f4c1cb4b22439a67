"""Continuous batching: rows of different identities decode in one forward per step, each with its own state.

A row joins after its prefill (alone, or in one padded forward with the rows joining with it) and leaves when it
stops (end token, stop string, length) or is cancelled, so a batch never waits for its longest reply and a new turn
never waits for the batch. What differs between rows is kept per row: the conditioning (the metric and the self
slots its identity state gives), the KV cache, the position, the sampling generator and the stop strings. A row's
tokens are the ones ``generate`` gives it alone.

Layout. The batch's KV cache is one tensor per layer, (B, H_kv, prefix + columns, w): the self slots first, then
token columns shared by all rows. A row's tokens sit right-aligned at the newest columns it has lived through;
columns before its first token are masked for it (``valid``), and its positions count its own tokens only, so a
gap is invisible to it. A joining row longer than the batch widens every row to the left; columns no row uses
any more are dropped. A reply taken back forgets what it read: its row's earlier columns move over those tokens, so a
row's tokens are always one run of columns ending at the newest. Where rows attend one by one (``exact_rows``), each
row also keeps a copy of its self slots in the P columns just before its first token (``KVCache.mirrored``), so that
its keys are one view of the batch's.

Notation: B rows, P prefix keys (the self slots), N token columns, V vocabulary, K memory tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields, is_dataclass
from functools import partial

import torch
from torch import Tensor

from sia.model.conditioning import Conditioning
from sia.model.generate import (
    Generation,
    ReplyDecoder,
    SamplingParams,
    StreamEvent,
    check_room,
    forget_newest,
    left_padded,
    padded_inputs,
    prompt_nll,
    prompt_scoring,
    reply_events,
    row_params,
)
from sia.model.identity_model import IdentityModel
from sia.model.kv_cache import KVCache
from sia.model.summary_sums import SummarySums
from sia.model.tokenizer import Tokenizer

__all__ = ["DecodeBatch", "Prefilled", "cat_conditioning", "select_conditioning"]

HEADROOM = 64  # token columns allocated beyond what the batch needs now, so most steps write in place


def _select_layer(lc: object, rows: Tensor) -> object:
    assert is_dataclass(lc) and not isinstance(lc, type)
    parts = {f.name: getattr(lc, f.name) for f in fields(lc)}
    return type(lc)(**{k: None if v is None else v[rows] for k, v in parts.items()})


def _cat_layer(parts: Sequence[object]) -> object:
    first = parts[0]
    assert is_dataclass(first) and not isinstance(first, type)
    out = {}
    for f in fields(first):
        values = [getattr(p, f.name) for p in parts]
        out[f.name] = None if values[0] is None else torch.cat(values, dim=0)
    return type(first)(**out)


def select_conditioning(cond: Conditioning, rows: Tensor) -> Conditioning:
    """The given rows (B',) of a Conditioning, in that order; nothing is recomputed."""
    layers = [None if lc is None else _select_layer(lc, rows) for lc in cond.layers]
    recalls = None if cond.recalls is None else cond.recalls[rows.cpu()]
    values = {
        name: None if kinds is None else tuple(kinds[int(r)] for r in rows.cpu())
        for name in _ROW_VALUES
        for kinds in (getattr(cond, name),)
    }
    return Conditioning(layers=layers, self_state=cond.self_state[rows], recalls=recalls, **values)  # type: ignore[arg-type]


def cat_conditioning(conds: Sequence[Conditioning]) -> Conditioning:
    """Conditionings of the same model stacked along the batch."""
    layers = [None if lcs[0] is None else _cat_layer(lcs) for lcs in zip(*(c.layers for c in conds), strict=True)]
    recalls = None
    if any(c.recalls is not None for c in conds):
        recalls = torch.cat([torch.zeros(c.batch_size, dtype=torch.bool) if c.recalls is None else c.recalls for c in conds])
    values = {name: _cat_values([getattr(c, name) for c in conds], conds, empty) for name, empty in _ROW_VALUES.items()}
    self_state = torch.cat([c.self_state for c in conds], dim=0)
    return Conditioning(layers=layers, self_state=self_state, recalls=recalls, **values)  # type: ignore[arg-type]


# the Conditioning's per-row values, each with what a row without one holds; None for a conditioning without any
_ROW_VALUES = {"untold": "", "echo": "", "echo_words": (), "recollection": ""}


def _cat_values(
    parts: Sequence[tuple[object, ...] | None], conds: Sequence[Conditioning], empty: object
) -> tuple[object, ...] | None:
    """Per-row values (``Conditioning.untold``, ``echo``, ``echo_words``, ``recollection``) stacked: ``empty`` for the
    rows of a conditioning without them."""
    if all(p is None for p in parts):
        return None
    return tuple(k for p, c in zip(parts, conds, strict=True) for k in (p or (empty,) * c.batch_size))


@dataclass
class _Member:
    """One row of the batch."""

    rid: int  # the caller's handle, stable while other rows join and leave
    params: SamplingParams
    row: ReplyDecoder  # tokens, text, stop handling, generator
    prompt_nll: Tensor  # (prompt_len - 1,)
    stats: SummarySums  # (1 row) sums over counted prompt tokens and every generated token fed back
    last: Tensor  # (V,) logits of its next token
    prompt_stats: SummarySums  # (1 row) the prompt's: what a reply begun again (``ReplyDecoder.taken_back``) counts
    first: Tensor  # (V,) logits of its reply's first token


@dataclass
class Prefilled:
    """Rows prefilled by ``DecodeBatch.prefill``, not yet in the batch: ``admit`` them."""

    cache: KVCache  # (B rows) their keys and values, left-padded to the longest prompt
    cond: Conditioning  # (B rows)
    lengths: list[int]  # each prompt's tokens
    params: list[SamplingParams]
    prompt_nll: Tensor  # (B, L - 1)
    stats: SummarySums  # (B rows)
    last: Tensor  # (B, V) the logits of each row's first reply token

    def row_nll(self, b: int) -> Tensor:
        """Row ``b``'s prompt NLL (lengths[b] - 1,): its own tokens' entries of the left-padded ``prompt_nll``."""
        return self.prompt_nll[b, max(self.lengths) - self.lengths[b] :]


def _stack(parts: Sequence[Prefilled], cond: Conditioning, n_memory: int) -> Prefilled:
    """Rows prefilled one by one, as one left-padded Prefilled (what a padded prefill of them all returns)."""
    lengths = [n for p in parts for n in p.lengths]
    B, L = len(lengths), max(lengths)
    first = parts[0].cache
    cache = object.__new__(KVCache)
    P = cache.prefix = first.prefix
    cache.capacity, cache.length = P + L + 1 + n_memory, P + L
    cache.keys, cache.values = [], []
    for store, sources in ((cache.keys, [p.cache.keys for p in parts]), (cache.values, [p.cache.values for p in parts])):
        for layer, t in enumerate(sources[0]):
            padded = t.new_zeros((B, t.shape[1], cache.capacity, t.shape[3]))
            for b, (n, src) in enumerate(zip(lengths, sources, strict=True)):
                padded[b, :, :P] = src[layer][0, :, :P]
                padded[b, :, P + L - n : P + L] = src[layer][0, :, P : P + n]
            store.append(padded)
    nll = parts[0].prompt_nll.new_full((B, L - 1), float("nan"))
    for b, (n, p) in enumerate(zip(lengths, parts, strict=True)):
        nll[b, L - n :] = p.prompt_nll[0]
    return Prefilled(
        cache,
        cond,
        lengths,
        [q for p in parts for q in p.params],
        nll,
        SummarySums.cat([p.stats for p in parts]),
        torch.cat([p.last for p in parts]),
    )


class DecodeBatch:
    """Rows decoding together; ``join`` a prompt under a one-row Conditioning, ``step`` until rows finish.

    ``step()`` samples one token for every row, yields their StreamEvents (``row`` is the handle ``join``
    returned) and feeds the tokens of the rows that go on back in one forward; ``sample()`` and ``advance()`` are
    its two halves, so that the tokens can be streamed before that forward. A row that stops is written (its
    memory tokens, when the model has them), leaves at once, and its Generation is kept for ``take(rid)``.
    ``cancel(rid)`` drops a row without a result. Not thread-safe: one scheduler drives it.
    """

    def __init__(self, model: IdentityModel, tokenizer: Tokenizer | None = None) -> None:
        self.model = model
        self.tok = tokenizer or model.tokenizer
        self.n_memory = model.memory_after_reply
        self.prefix = model.prefix_len
        self.members: list[_Member] = []
        self.cond: Conditioning | None = None  # (B rows)
        self.cache: KVCache | None = None  # shared length: prefix + token columns in use
        self.valid = torch.zeros(0, self.prefix, dtype=torch.bool, device=model.device)  # (B, prefix + columns in use)
        self.done: dict[int, Generation] = {}
        self._next = 0
        self._banned = torch.tensor(self.tok.banned_ids, dtype=torch.long, device=model.device)
        self._sampled: tuple[list[int], list[int]] | None = None  # (going, stopped) between sample() and advance()

    def __len__(self) -> int:
        return len(self.members)

    def _check_whole(self) -> None:
        if self._sampled is not None:
            raise RuntimeError("a step is half done (sampled, not advanced): rows join and leave between steps")

    @property
    def rids(self) -> list[int]:
        return [m.rid for m in self.members]

    # --- joining -------------------------------------------------------------------------------------------

    @torch.inference_mode()
    def join(
        self,
        prompt: Sequence[int],
        cond: Conditioning,
        params: SamplingParams,
        summary_mask: Sequence[bool] | None = None,
        nll_from: int = 0,
    ) -> int:
        """Prefill ``prompt`` alone under ``cond`` (one row) and add it to the batch; returns its handle."""
        if cond.batch_size != 1:
            raise ValueError(f"a row joins with a one-row Conditioning; got {cond.batch_size} rows")
        return self.join_many([prompt], cond, [params], None if summary_mask is None else [summary_mask], [nll_from])[0]

    def join_many(
        self,
        prompts: Sequence[Sequence[int]],
        cond: Conditioning,
        params: Sequence[SamplingParams],
        summary_masks: Sequence[Sequence[bool]] | None = None,
        nll_from: Sequence[int] | None = None,
    ) -> list[int]:
        """Prefill ``prompts`` together, one left-padded forward under ``cond`` (a row each), and add them to the
        batch in order; returns their handles. The padding is masked: each row is the row it would be alone."""
        self._check_whole()
        return self.admit(self.prefill(prompts, cond, params, summary_masks, nll_from))

    @torch.inference_mode()
    def prefill(
        self,
        prompts: Sequence[Sequence[int]],
        cond: Conditioning,
        params: Sequence[SamplingParams],
        summary_masks: Sequence[Sequence[bool]] | None = None,
        nll_from: Sequence[int] | None = None,
    ) -> Prefilled:
        """The computation of ``join_many`` without joining: it reads the model and nothing of the batch's rows, so
        it may run on another thread while the batch steps; ``admit`` the result between two steps. ``nll_from``
        as in ``generate.stream``: the prompt NLL from there on only, its logits alone computed."""
        model, device = self.model, self.model.device
        B = len(prompts)
        if B < 1 or cond.batch_size != B or len(params) != B:
            raise ValueError(
                f"{B} prompts need as many conditioning rows and sampling settings; got {cond.batch_size}, {len(params)}"
            )
        lengths = [len(p) for p in prompts]
        if min(lengths) < 1:
            raise ValueError("a prompt needs at least one token")
        for n, p in zip(lengths, params, strict=True):
            check_room(model, n, p.max_new_tokens)
        masks = [[True] * n for n in lengths] if summary_masks is None else [list(m) for m in summary_masks]
        for mask, n in zip(masks, lengths, strict=True):
            if len(mask) != n:
                raise ValueError(f"summary mask has {len(mask)} entries for {n} tokens")
        starts, logits_from = prompt_scoring(lengths, nll_from)
        if model.exact_rows and B > 1 and min(lengths) != max(lengths):
            # padding would change a row's sums (its prompt's reductions run over more columns): one by one instead
            alone = [
                self.prefill(
                    [p], select_conditioning(cond, torch.tensor([b], device=device)), [params[b]], [masks[b]], [starts[b]]
                )
                for b, p in enumerate(prompts)
            ]
            return _stack(alone, cond, self.n_memory)
        idx, valid = left_padded(prompts, self.tok.pad_id, device)  # (B, L)
        counted = left_padded([[int(m) for m in mask] for mask in masks], 0, device)[0].bool()
        L = idx.shape[1]
        key_valid = torch.cat([valid.new_ones(B, self.prefix), valid], dim=1)
        own = model.new_cache(cond, L + 1 + self.n_memory)
        positions, key_mask = padded_inputs(key_valid, L, self.prefix)
        attn_mask = key_mask if min(lengths) != L else None  # rows of one length take the causal kernel
        out = model(idx, cond, cache=own, positions=positions, attn_mask=attn_mask, summary_mask=counted, logits_from=logits_from)
        nll = prompt_nll(out.logits, idx, lengths, starts, logits_from)  # (B, L-1)
        last = out.logits[:, -1].clone()  # a copy: a view would keep every position's logits alive
        return Prefilled(own, cond, lengths, row_params(params, cond), nll, out.stats, last)

    @torch.inference_mode()
    def admit(self, pre: Prefilled) -> list[int]:
        """Add prefilled rows to the batch, in order, between two steps; returns their handles. A left-padded
        prefill is already right-aligned, as the batch keeps its rows: the group joins in one copy per layer."""
        self._check_whole()
        device, P = self.model.device, self.prefix
        B, L = len(pre.lengths), max(pre.lengths)
        if self.cache is None:  # the first rows: an empty batch of their layout
            self.cache = object.__new__(KVCache)
            self.cache.prefix, self.cache.length, self.cache.capacity = P, P, P
            self.cache.keys = [t.new_zeros((0, t.shape[1], P, t.shape[3])) for t in pre.cache.keys]
            self.cache.values = [t.new_zeros((0, t.shape[1], P, t.shape[3])) for t in pre.cache.values]
            self.cache.mirrored = self.model.exact_rows and P > 0
        M = P if self.cache.mirrored else 0  # columns before a row's first token that hold its slots again
        columns = self.cache.length - P
        if columns < L + M:  # widen every row to the left
            self._shift(L + M - columns)
            columns = L + M
        self._reserve(columns + 1 + self.n_memory)
        first = P + columns - L  # where the group's L token columns start in the batch
        lengths = torch.tensor(pre.lengths, device=device)
        at = torch.arange(self.cache.capacity, device=device)
        own_columns = ((at >= P + columns - lengths[:, None]) & (at < P + columns)) | (at < P)  # (B, capacity)
        for store, own in ((self.cache.keys, pre.cache.keys), (self.cache.values, pre.cache.values)):
            for layer, t in enumerate(store):
                group = t.new_zeros((B, *t.shape[1:]))
                group[:, :, :P] = own[layer][:, :, :P]
                group[:, :, first : P + columns] = own[layer][:, :, P : P + L]
                group.mul_(own_columns[:, None, :, None])  # a padded prompt's padding columns hold zeros, as unused ones
                if M:
                    for b, n in enumerate(pre.lengths):
                        group[b, :, P + columns - n - M : P + columns - n] = group[b, :, :P]
                store[layer] = torch.cat([t, group], dim=0)
        self.valid = torch.cat([self.valid, own_columns[:, : P + columns]], dim=0)
        self.cond = pre.cond if self.cond is None else cat_conditioning([self.cond, pre.cond])
        rids: list[int] = []
        for b, p in enumerate(pre.params):
            rids.append(self._next)
            row = ReplyDecoder(p, device, self.tok)
            stats = pre.stats.row(b)
            self.members.append(_Member(self._next, p, row, pre.row_nll(b), stats, pre.last[b], stats, pre.last[b]))
            self._next += 1
        return rids

    def _shift(self, k: int) -> None:
        """Insert k empty token columns before every row's first token (a longer row joins)."""
        assert self.cache is not None
        P, used = self.prefix, self.cache.length
        self.valid = torch.cat([self.valid[:, :P], self.valid.new_zeros(self.valid.shape[0], k), self.valid[:, P:]], dim=1)
        for store in (self.cache.keys, self.cache.values):
            for layer, t in enumerate(store):
                pad = t.new_zeros((*t.shape[:2], k, t.shape[3]))
                store[layer] = torch.cat([t[:, :, :P], pad, t[:, :, P:used]], dim=2)
        self.cache.length = self.cache.capacity = used + k

    def _reserve(self, columns: int) -> None:
        """Room for ``columns`` token columns (growing by HEADROOM more when it must)."""
        assert self.cache is not None
        if self.cache.capacity >= self.prefix + columns:
            return
        capacity = self.prefix + columns + HEADROOM
        for store in (self.cache.keys, self.cache.values):
            for layer, t in enumerate(store):
                grown = t.new_zeros((*t.shape[:2], capacity, t.shape[3]))
                grown[:, :, : self.cache.length] = t[:, :, : self.cache.length]
                store[layer] = grown
        self.cache.capacity = capacity

    # --- stepping ------------------------------------------------------------------------------------------

    def step(self) -> list[StreamEvent]:
        """One token for every row; the rows that stop are written and leave (their Generations go to ``done``):
        ``sample()`` then ``advance()``."""
        events = self.sample()
        self.advance()
        return events

    @torch.inference_mode()
    def sample(self) -> list[StreamEvent]:
        """The next token of every row, from the logits the last forward left: its StreamEvent can go to its reader
        before ``advance()`` runs the tokens through the model (a row's first token comes straight from its
        prefill). Until ``advance()``, rows can neither join nor leave."""
        if self._sampled is not None:
            raise RuntimeError("these rows' tokens are already sampled: advance() first")
        events: list[StreamEvent] = []
        going: list[int] = []
        stopped: list[int] = []
        for b, m in enumerate(self.members):
            events += reply_events(m.row, m.last, m.params, m.rid, self._banned, self.tok.end_ids, partial(self._restart, b))
            (going if m.row.finish_reason is None else stopped).append(b)
        self._sampled = (going, stopped)
        return events

    def _restart(self, b: int, n: int) -> Tensor:
        """Row b's reply begins again (``reply_events``): it forgets its n tokens read (``forget_newest``); the
        logits of its first token."""
        m = self.members[b]
        if n:
            forget_newest(self.valid, self.cache, b, n, self.prefix)
        m.stats = m.prompt_stats
        return m.first

    @torch.inference_mode()
    def advance(self) -> None:
        """The rest of the step ``sample()`` began: the rows that stopped are written and leave, the others' tokens
        go through the model in one forward."""
        if self._sampled is None:
            raise RuntimeError("nothing to advance: sample() first")
        going, stopped = self._sampled
        self._sampled = None
        if stopped:
            self._finish(stopped)
        if going:
            self._feed(going)
        self._keep([b for b in range(len(self.members)) if b in going])

    def _feed(self, going: list[int]) -> None:
        """Run the sampled tokens of the rows that go on through the model, all in one forward."""
        assert self.cache is not None and self.cond is not None
        self._reserve(self.cache.length - self.prefix + 1 + self.n_memory)
        B = len(self.members)
        tokens = torch.full((B, 1), self.tok.pad_id, dtype=torch.long, device=self.valid.device)
        alive = torch.zeros(B, 1, dtype=torch.bool, device=self.valid.device)
        for b in going:
            tokens[b, 0], alive[b, 0] = self.members[b].row.tokens[-1], True
        key_valid = torch.cat([self.valid, alive], dim=1)
        positions, mask = padded_inputs(key_valid, 1, self.prefix)
        out = self.model(tokens, self.cond, cache=self.cache, positions=positions, attn_mask=mask, summary_mask=alive)
        self.valid = key_valid
        for b in going:
            m = self.members[b]
            m.stats = m.stats + out.stats.row(b)
            m.last = out.logits[b, -1]

    def _finish(self, stopped: list[int]) -> None:
        """The write of the rows that stopped: their last token and the memory tokens, on a copy of their cache."""
        assert self.cache is not None and self.cond is not None
        stats = [self.members[b].stats for b in stopped]
        if self.n_memory:
            index = torch.tensor(stopped, dtype=torch.long, device=self.valid.device)
            cache = self.cache.select(index)
            need = cache.length + 1 + self.n_memory
            if cache.capacity < need:
                for store in (cache.keys, cache.values):
                    for layer, t in enumerate(store):
                        store[layer] = torch.cat([t, t.new_zeros((*t.shape[:2], need - t.shape[2], t.shape[3]))], dim=2)
                cache.capacity = need
            final = torch.tensor([[self.members[b].row.tokens[-1]] for b in stopped], dtype=torch.long, device=index.device)
            key_valid = torch.cat([self.valid[index], self.valid.new_ones(len(stopped), 1)], dim=1)
            positions, mask = padded_inputs(key_valid, 1, self.prefix, self.n_memory)
            cond = select_conditioning(self.cond, index)
            none = torch.zeros(len(stopped), 1, dtype=torch.bool, device=index.device)
            out = self.model(final, cond, cache=cache, positions=positions, attn_mask=mask, summary_mask=none, memory=True)
            assert out.memory is not None
            stats = [(s + out.stats.row(i)).written_by(out.memory[i : i + 1]) for i, s in enumerate(stats)]
        for b, s in zip(stopped, stats, strict=True):
            m = self.members[b]
            self.done[m.rid] = Generation(
                tokens=m.row.tokens,
                text=m.row.text,
                finish_reason=m.row.finish_reason or "length",
                prompt_nll=m.prompt_nll,
                stats=s,
            )

    # --- leaving -------------------------------------------------------------------------------------------

    def cancel(self, rid: int) -> None:
        """Drop a row now, with no result (its client is gone); KeyError if it is not in the batch."""
        self._check_whole()
        rows = self.rids
        if rid not in rows:
            raise KeyError(f"row {rid} is not in the batch")
        self._keep([b for b, r in enumerate(rows) if r != rid])

    def take(self, rid: int) -> Generation:
        """The Generation of a row that stopped (once); KeyError if it has not."""
        return self.done.pop(rid)

    def _keep(self, rows: list[int]) -> None:
        """Only these rows stay; token columns no row uses any more are dropped."""
        if len(rows) == len(self.members):
            return
        self.members = [self.members[b] for b in rows]
        if not rows:
            self.cond, self.cache = None, None
            self.valid = self.valid[:0, : self.prefix]
            return
        assert self.cache is not None and self.cond is not None
        index = torch.tensor(rows, dtype=torch.long, device=self.valid.device)
        self.cond = select_conditioning(self.cond, index)
        self.valid = self.valid[index]
        P, used = self.prefix, self.cache.length
        tokens_valid = self.valid[:, P:used].any(dim=0)
        first = int(tokens_valid.float().argmax()) if bool(tokens_valid.any()) else used - P  # leading unused columns
        if self.cache.mirrored:  # the first row's mirrored slots stay
            first = max(first - P, 0)
        for store in (self.cache.keys, self.cache.values):
            for layer, t in enumerate(store):
                kept = t[index]
                store[layer] = torch.cat([kept[:, :, :P], kept[:, :, P + first :]], dim=2)
        self.valid = torch.cat([self.valid[:, :P], self.valid[:, P + first :]], dim=1)
        self.cache.length -= first
        self.cache.capacity -= first
