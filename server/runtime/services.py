"""The services over one loaded model and one store, built once: by the app's lifespan, the command line,
tests and benchmarks alike."""

from __future__ import annotations

from dataclasses import dataclass

from server.runtime.health import Health
from server.runtime.identities import Identities
from server.runtime.keys import KeyRing
from server.runtime.personas import Personas
from server.runtime.turns import Turns
from server.store import Store
from sia.model.transformer import IdentityModel

__all__ = ["Services"]


@dataclass(frozen=True)
class Services:
    store: Store
    personas: Personas
    identities: Identities
    turns: Turns
    keys: KeyRing
    health: Health

    @classmethod
    def over(cls, model: IdentityModel, store: Store) -> Services:
        """Every service over ``model`` (which must keep identity state) and ``store``."""
        personas = Personas(model, store)
        identities = Identities(model.config, store, personas)
        turns = Turns(model, store, personas, identities)
        return cls(store, personas, identities, turns, KeyRing(store), Health(model, store))

    def close(self) -> None:
        self.store.close()
