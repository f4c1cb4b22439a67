"""What one turn fixes for each batch row before any token is read: the per-layer conditioning built from the
identity state (the metric folded into the queries, the self slots), shared by every model family.

Notation: B batch, w a layer's kernel width, d_s self-state width.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from torch import Tensor

__all__ = ["Conditioning", "SlotLayer"]


class SlotLayer(Protocol):
    """A layer's conditioning as the cache sees it: the self slot's augmented key and value."""

    slot_key: Tensor  # (B, heads, 1, w)
    slot_value: Tensor  # (B, heads, 1, w)


@dataclass
class Conditioning:
    """Everything one turn fixes for each batch row. Built by the model's ``condition``; never mutated."""

    layers: Sequence[SlotLayer | None]  # per layer; None for a variant without state (plain attention)
    self_state: Tensor  # (B, d_s)
    # (B,) bool, on the CPU: the rows whose message asks about the user's facts with an imprint to answer from, whose replies are
    # decoded at their recall temperature (SamplingParams.recall_temperature); None: no row
    recalls: Tensor | None = None
    # per row, the kind of fact its message asks about that the user never told ("": none; ImprintEntries.untold): such
    # a row reads no imprint and its reply says so (SamplingParams.untold); None: no row
    untold: tuple[str, ...] | None = None
    # per row, the kind of fact whose recall reply opens by saying back the user's words ("": none;
    # ImprintEntries.echoed): its reply opens with sia.model.language.ECHO_OPENING (SamplingParams.echo); None: no row
    echo: tuple[str, ...] | None = None
    # per row where it echoes, the tokens that go on from "I" in its imprinted clauses, as said after "you"
    # (SamplingParams.echo_words)
    echo_words: tuple[tuple[int, ...], ...] | None = None
    # per row, the user's clauses (one a line) that answer a message asking what the persona knows of them ("": none;
    # sia.identity.imprint.Imprint.recollection): its reply quotes them (SamplingParams.recollection); None: no row
    recollection: tuple[str, ...] | None = None

    @property
    def batch_size(self) -> int:
        return self.self_state.shape[0]
