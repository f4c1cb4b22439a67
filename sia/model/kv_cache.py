"""The key/value cache of one generation: preallocated per layer, the self slots at its first positions.

Notation: B batch, H heads (key/value heads for a grouped-query model), L tokens in this call, w a layer's kernel width.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from sia.model.conditioning import Conditioning

__all__ = ["KVCache"]


class KVCache:
    """Keys and values per layer, preallocated; with a stateful variant position 0 holds the self slot.

    ``widths`` gives each layer's kernel width (one int: the same for all); ``dtype`` defaults to the self state's.
    ``mirrored``: every row's self slots are also copied into the columns just before its first token (a batch of
    left-padded rows that attend one by one keeps them so, ``DecodeBatch``): a row's keys are then one view.
    """

    mirrored = False

    def __init__(
        self, cond: Conditioning, max_tokens: int, *, n_head: int, width: int | Sequence[int], dtype: torch.dtype | None = None
    ) -> None:
        s = cond.self_state
        B = s.shape[0]
        widths = [width] * len(cond.layers) if isinstance(width, int) else list(width)
        first = cond.layers[0]
        self.prefix = 0 if first is None else first.slot_key.shape[2]  # the self slots
        self.capacity = max_tokens + self.prefix
        self.length = self.prefix
        dtype = dtype or s.dtype
        self.keys = [s.new_zeros((B, n_head, self.capacity, w), dtype=dtype) for w in widths]
        self.values = [s.new_zeros((B, n_head, self.capacity, w), dtype=dtype) for w in widths]
        for layer, lc in enumerate(cond.layers):
            if lc is not None:
                self.keys[layer][:, :, : self.prefix] = lc.slot_key
                self.values[layer][:, :, : self.prefix] = lc.slot_value

    @property
    def tokens(self) -> int:
        """Tokens cached so far (the self slot not counted)."""
        return self.length - self.prefix

    def extend(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Write (B, H, L, w) keys/values after the current length; return the filled prefix.

        Keys or values narrower than the layer's width fill its first columns and leave the others as they are: zeros,
        as every column is made, so long as a layer's keys (and its values) are always written at one width (the
        columns a reply taken back leaves are written again at the same width); a decoding step then pads nothing."""
        start, end = self.length, self.length + k.shape[2]
        if end > self.capacity:
            raise ValueError(f"KV cache holds {self.capacity - self.prefix} tokens; this step needs {end - self.prefix}")
        for store, new in ((self.keys[layer], k), (self.values[layer], v)):
            if new.shape[-1] == store.shape[-1]:
                store[:, :, start:end] = new
            else:
                store[:, :, start:end, : new.shape[-1]] = new
        return self.keys[layer][:, :, :end], self.values[layer][:, :, :end]

    def advance(self, n: int) -> None:
        self.length += n

    def mirror(self, firsts: Sequence[int]) -> None:
        """Make this cache ``mirrored``: P columns inserted after the self slots (P more of capacity, so that the rows
        that begin right after the slots have room), then every row's slots copied into the P columns just before its
        first token; ``firsts`` (B,): each row's first token's column before the insertion."""
        P = self.prefix
        for store in (self.keys, self.values):
            for layer, t in enumerate(store):
                grown = t.new_zeros((*t.shape[:2], t.shape[2] + P, t.shape[3]))
                grown[:, :, :P] = t[:, :, :P]
                grown[:, :, 2 * P : self.length + P] = t[:, :, P : self.length]
                for b, first in enumerate(firsts):
                    grown[b, :, first : first + P] = t[b, :, :P]
                store[layer] = grown
        self.capacity, self.length, self.mirrored = self.capacity + P, self.length + P, True

    def forget_newest(self, row: int, n: int, first: int) -> None:
        """Row ``row`` forgets its n newest columns (a reply taken back): its columns from ``first`` (its first token's;
        where ``mirrored``, from its slots' copy just before it) move n to the right, over them, and the n they leave
        hold zeros, as unused columns do. Its tokens stay one run of columns ending at the newest, so it still attends
        alone as left-padded rows do (``row_starts``)."""
        if self.mirrored:
            first -= self.prefix
        for store in (self.keys, self.values):
            for t in store:
                t[row, :, first + n : self.length] = t[row, :, first : self.length - n].clone()
                t[row, :, first : first + n] = 0

    @classmethod
    def continuing(cls, keys: Sequence[Tensor], values: Sequence[Tensor], room: int) -> KVCache:
        """A cache without self slots holding per layer the keys and values (B, H, P, w) of P tokens already read (a
        copy: those tensors are left as they are), with room for ``room`` tokens more."""
        if len(keys) != len(values) or not keys or room < 0:
            raise ValueError("need keys and values for every layer and room >= 0")
        new = object.__new__(cls)
        new.prefix, new.length = 0, keys[0].shape[2]
        new.capacity = new.length + room
        new.keys, new.values = [], []
        for k, v in zip(keys, values, strict=True):
            for held, given in ((new.keys, k), (new.values, v)):
                full = given.new_zeros((*given.shape[:2], new.capacity, given.shape[3]))
                full[:, :, : new.length] = given
                held.append(full)
        return new

    def select(self, rows: Tensor) -> KVCache:
        """A new cache holding a copy of the given rows (B',) of this one, a row may repeat (e.g. one prompt read
        once, then continued several ways)."""
        new = object.__new__(KVCache)
        new.prefix, new.capacity, new.length = self.prefix, self.capacity, self.length
        new.mirrored = self.mirrored
        new.keys = [k[rows] for k in self.keys]
        new.values = [v[rows] for v in self.values]
        return new
