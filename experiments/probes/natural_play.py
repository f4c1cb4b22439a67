"""A natural-set part played as ``sia eval --natural`` plays it, for probes that watch the turns go by: the bundled
model, sia's prompt, every user's identity fresh, then each user's messages and ``depth`` unrelated turns, round by
round (``rounds``)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from sia.checkpoint import load_model
from sia.identity.state import Dynamics, IdentityState
from sia.learn.natural import NaturalUser, filler, load_fillers, load_users
from sia.personas import PERSONAS


@dataclass
class Played:
    model: Any
    tok: Any
    system: tuple[int, ...]
    users: list[NaturalUser]
    fillers: list[str]
    dynamics: Dynamics
    states: dict[str, IdentityState]  # per user id, as the turns leave it

    @classmethod
    def load(cls, part: str) -> Played:
        model = load_model(None)
        tok = model.tokenizer
        users = load_users(part)
        return cls(
            model,
            tok,
            tuple(tok.system_prompt(PERSONAS["sia"].system_prompt)),
            users,
            load_fillers(part),
            Dynamics.from_config(model.config),
            {u.id: IdentityState.fresh(model.config) for u in users},
        )

    def rounds(self, depth: int) -> Iterator[list[tuple[str, str]]]:
        """The turns as (user id, message) rounds: every user's i-th message, then its j-th unrelated turn."""
        for i in range(max((len(u.messages) for u in self.users), default=0)):
            yield [(u.id, u.messages[i]) for u in self.users if i < len(u.messages)]
        for j in range(depth):
            yield [(u.id, filler(self.fillers, n, j)) for n, u in enumerate(self.users)]
