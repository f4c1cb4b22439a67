"""A stateful property test: chat, reset, rollback and export/import in any order, for a few users, against
a simple model of what each identity's state history must be."""

from __future__ import annotations

import hashlib
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, initialize, invariant, rule

from server.core.config import Settings
from server.db import migrate
from server.runtime.services import Services
from server.store import Store
from sia.model.generate import Sampling
from tests.conftest import tiny_model

USERS = st.sampled_from(["ana", "bob", "cy"])


def digest(blob: bytes) -> str:
    return hashlib.sha256(blob).hexdigest()


class IdentityHistory(RuleBasedStateMachine):
    """The model: per user, the list of state digests by version (index 0 is version 1) and the turn count."""

    exports = Bundle("exports")

    @initialize()
    def start(self) -> None:
        self.tmp = tempfile.TemporaryDirectory()
        config = Settings(data_dir=Path(self.tmp.name), history_retention=1000)
        migrate.upgrade(config)
        self.services = Services.over(tiny_model(), Store(config))
        self.services.personas.ensure_defaults()
        self.versions: dict[str, list[str]] = {}
        self.turns: dict[str, int] = {}

    def _current(self, user: str) -> str:
        return digest(self.services.identities.export_state("sia", user)[1])

    def _record(self, user: str, version: int) -> None:
        history = self.versions.setdefault(user, [])
        if not history:  # the identity was created at version 1 by this operation
            history.append(digest(self.services.identities.export_state("sia", user, version=1)[1]))
        assert version == len(history) + 1, (user, version, len(history))
        history.append(self._current(user))

    @rule(user=USERS, seed=st.integers(0, 3))
    def chat(self, user: str, seed: int) -> None:
        out = self.services.turns.turn("sia", user, f"hello {seed}", Sampling(max_tokens=3, temperature=1.0, seed=seed))
        assert out.turn == self.turns.get(user, 0)
        self.turns[user] = out.turn + 1
        self._record(user, out.state_version)

    @rule(user=USERS)
    def reset(self, user: str) -> None:
        if user not in self.versions:
            return
        self._record(user, self.services.identities.reset("sia", user))
        assert self.versions[user][-1] == self.versions[user][0]  # back to the state it was created with

    @rule(user=USERS, data=st.data())
    def rollback(self, user: str, data: st.DataObject) -> None:
        if user not in self.versions:
            return
        target = data.draw(st.integers(1, len(self.versions[user])))
        self._record(user, self.services.identities.rollback("sia", user, version=target))
        assert self.versions[user][-1] == self.versions[user][target - 1]

    @rule(target=exports, user=USERS)
    def export(self, user: str) -> bytes:
        if user not in self.versions:
            return b""
        return self.services.identities.export_state("sia", user)[1]

    @rule(blob=consumes(exports), user=USERS)
    def import_(self, blob: bytes, user: str) -> None:
        if not blob:
            return
        self._record(user, self.services.identities.import_state("sia", user, blob))
        assert self.versions[user][-1] == digest(blob)  # another user's exported state, bit for bit

    @invariant()
    def store_agrees_with_the_model(self) -> None:
        if not hasattr(self, "services"):
            return
        for user, history in self.versions.items():
            ident = self.services.store.get_identity("sia", user)
            assert ident.version == len(history)
            assert ident.turn_count == self.turns.get(user, 0)
            assert ident.state_sha256 == history[-1] and not ident.busy
            versions = [v.version for v in self.services.identities.history("sia", user).versions]
            assert versions == list(range(len(history), 0, -1))

    def teardown(self) -> None:
        if hasattr(self, "services"):
            self.services.store.close()
            self.tmp.cleanup()


IdentityHistory.TestCase.settings = settings(
    max_examples=8, stateful_step_count=12, deadline=None, suppress_health_check=list(HealthCheck)
)
test_identity_history = IdentityHistory.TestCase
