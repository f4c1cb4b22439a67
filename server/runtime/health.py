"""Readiness: the database answers at this code's schema revision, and what model is loaded."""

from __future__ import annotations

from dataclasses import dataclass

from server.db import migrate
from server.store import Store
from sia.model.identity_model import IdentityModel

__all__ = ["Health", "Readiness"]


@dataclass(frozen=True)
class Readiness:
    """Whether the service can serve turns (``reason`` says why not), and the model it serves them with."""

    reason: str | None  # None when ready
    model: str  # the attention variant
    parameters: int

    @property
    def ready(self) -> bool:
        return self.reason is None


class Health:
    def __init__(self, model: IdentityModel, store: Store) -> None:
        self.store = store
        self.schema_head = migrate.head_revision(store.settings)  # this code's newest migration
        self.model = model.config.attention
        self.parameters = sum(p.numel() for p in model.parameters())

    def at_schema_head(self) -> bool:
        """Whether the database is migrated to this code's schema (raises if the database does not answer)."""
        return migrate.current_revision(self.store.settings) == self.schema_head

    def readiness(self) -> Readiness:
        return Readiness(reason=self._database_problem(), model=self.model, parameters=self.parameters)

    def _database_problem(self) -> str | None:
        """None when the database answers and is migrated to this code's schema; otherwise why not."""
        try:
            current = self.store.schema_revision()
        except Exception as exc:  # any failure to reach or read the database means not ready
            return f"database unavailable: {str(exc).splitlines()[0]}"
        if current != self.schema_head:
            return f"database schema is at {current}, this service needs {self.schema_head}: run `sia db upgrade`"
        return None
