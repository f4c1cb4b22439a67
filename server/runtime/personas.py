"""Personas: the defaults a service starts with, their administration, and what a persona decides for a turn
(its update rates, its decoding defaults, the state its new identities start from)."""

from __future__ import annotations

import logging
from typing import Any

from server.errors import CorruptStateError
from server.records import PERSONA_FIELDS, Blob, PersonaRecord
from server.runtime.codec import encode
from server.store import Store
from sia.identity.state import Dynamics, IdentityState, StateFormatError, state_from_bytes
from sia.model.generate import Sampling, SamplingParams, logit_bias_pairs
from sia.model.identity_model import IdentityModel
from sia.personas import DEFAULT_PERSONA, DEFAULTS_RELEASE, PERSONAS, outdated_defaults, persona_defaults

__all__ = ["Personas"]

log = logging.getLogger("sia.runtime")


class Personas:
    """The personas of one store, checked against one loaded model. Thread-safe."""

    def __init__(self, model: IdentityModel, store: Store) -> None:
        self.model = model
        self.config = model.config
        self.store = store

    # --- administration --------------------------------------------------------------------------------

    def ensure_defaults(self) -> list[str]:
        """Create the default personas (``sia`` first) if they are missing, each with the prompt this model reads; a
        default persona last brought to an earlier release's defaults gets today's in the fields that still hold an
        earlier release's (sia.personas.outdated_defaults), once: the release is recorded with it, so a field an admin
        sets back later stays. Returns the personas created."""
        existing = {p.name: p for p in self.store.list_personas()}
        created = []
        for name in sorted(PERSONAS, key=lambda n: (n != DEFAULT_PERSONA, n)):
            if name not in existing:
                self.store.create_persona(name, **persona_defaults(self.model, name), defaults_release=DEFAULTS_RELEASE)
                created.append(name)
                continue
            stored = existing[name]
            if stored.defaults_release >= DEFAULTS_RELEASE:
                continue
            changes = outdated_defaults(self.model, name, {f: getattr(stored, f) for f in PERSONA_FIELDS})
            self.store.update_persona(name, **changes, defaults_release=DEFAULTS_RELEASE)
            if changes:
                log.info("persona %s: %s brought to this release's defaults", name, ", ".join(sorted(changes)))
        return created

    def validate_values(self, values: dict[str, object]) -> None:
        """Raise ValueError for rates, sampling defaults or an initial state this model cannot use."""
        base = Dynamics.from_config(self.config)
        Dynamics(
            alpha=_float(values.get("alpha"), base.alpha),
            decay=_float(values.get("decay"), base.decay),
            eta=_float(values.get("eta"), base.eta),
        )
        SamplingParams(
            max_new_tokens=int(str(values.get("max_tokens", 64))),
            temperature=_float(values.get("temperature"), 0.8),
            top_p=None if values.get("top_p") is None else _float(values.get("top_p"), 1.0),
            top_k=None if values.get("top_k") is None else int(str(values.get("top_k"))),
            repetition_penalty=_float(values.get("repetition_penalty"), 1.0),
            no_repeat_ngram=_int(values.get("no_repeat_ngram"), 0),
            frequency_penalty=_float(values.get("frequency_penalty"), 0.0),
            presence_penalty=_float(values.get("presence_penalty"), 0.0),
            logit_bias=self.logit_bias(values.get("logit_bias")),
            logit_bias_once=_bool(values.get("logit_bias_once"), False),
            lowercase=_bool(values.get("lowercase"), False),
            max_sentences=_int(values.get("max_sentences"), 0),
            max_words=_int(values.get("max_words"), 0),
            wind_down=_int(values.get("wind_down"), 0),
            exclaim=_bool(values.get("exclaim"), False),
            address=_str(values.get("address"), ""),
            recall_temperature=None if values.get("recall_temperature") is None else _float(values["recall_temperature"], 0.0),
        )
        blob = values.get("initial_state")
        if blob is not None:
            if not isinstance(blob, bytes):
                raise ValueError("initial_state must be bytes (a serialised identity state)")
            state_from_bytes(blob, self.config)

    def create_persona(self, name: str, **values: Any) -> PersonaRecord:
        """A new persona; fields left out take their defaults. ValueError if a value is unusable."""
        self.validate_values(values)
        return self.store.create_persona(name, **values)

    def list_personas(self) -> list[PersonaRecord]:
        return self.store.list_personas()

    def get_persona(self, name: str) -> PersonaRecord:
        return self.store.get_persona(name)

    def update_persona(self, name: str, **changes: Any) -> PersonaRecord:
        """Change the fields given; the persona that results is validated as a whole before it is stored."""
        current = self.store.get_persona(name)
        self.validate_values({**{field: getattr(current, field) for field in PERSONA_FIELDS}, **changes})
        return self.store.update_persona(name, **changes)

    def delete_persona(self, name: str) -> None:
        """Delete the persona with its identities, their turns, history and snapshots."""
        self.store.delete_persona(name)

    def set_initial_state(self, name: str, blob: bytes) -> PersonaRecord:
        """New identities of the persona start from ``blob`` (StateFormatError, a ValueError, if unusable)."""
        self.validate_values({"initial_state": blob})
        return self.store.update_persona(name, initial_state=blob)

    def clear_initial_state(self, name: str) -> PersonaRecord:
        """New identities start from the zero state again."""
        return self.store.update_persona(name, initial_state=None)

    # --- what a persona decides for a turn -------------------------------------------------------------

    def dynamics(self, persona: PersonaRecord) -> Dynamics:
        """The persona's update rates, the model's where the persona sets none."""
        base = Dynamics.from_config(self.config)
        return Dynamics(
            alpha=base.alpha if persona.alpha is None else persona.alpha,
            decay=base.decay if persona.decay is None else persona.decay,
            eta=base.eta if persona.eta is None else persona.eta,
        )

    def sampling_params(self, persona: PersonaRecord, sampling: Sampling) -> SamplingParams:
        """The request's decoding choices over the persona's defaults (ValueError if invalid)."""
        defaults = SamplingParams(
            max_new_tokens=persona.max_tokens,
            temperature=persona.temperature,
            top_p=persona.top_p,
            top_k=persona.top_k,
            repetition_penalty=persona.repetition_penalty,
            no_repeat_ngram=persona.no_repeat_ngram,
            frequency_penalty=persona.frequency_penalty,
            presence_penalty=persona.presence_penalty,
            logit_bias=self.logit_bias(persona.logit_bias),
            logit_bias_once=persona.logit_bias_once,
            lowercase=persona.lowercase,
            max_sentences=persona.max_sentences,
            max_words=persona.max_words,
            wind_down=persona.wind_down,
            exclaim=persona.exclaim,
            address=persona.address,
            recall_temperature=persona.recall_temperature,
            speaker=persona.name,
        )
        params = sampling.over(defaults)
        for token, _ in params.logit_bias:  # a request's ids, checked before the identity is used
            self.in_vocabulary(token)
        return params

    def logit_bias(self, value: object) -> tuple[tuple[int, float], ...]:
        """A stored or sent logit bias as SamplingParams takes it; ValueError for anything but token ids of this model
        mapped to numbers."""
        pairs = logit_bias_pairs(value)
        for token, _ in pairs:
            self.in_vocabulary(token)
        return pairs

    def in_vocabulary(self, token: int) -> None:
        if token >= self.config.vocab_size:
            raise ValueError(f"logit_bias: token {token} is not in the model's vocabulary of {self.config.vocab_size}")

    def initial_state(self, persona: PersonaRecord) -> IdentityState:
        """The state a new (or fully reset) identity of the persona starts from."""
        if persona.initial_state is None:
            return IdentityState.fresh(self.config)
        try:
            return state_from_bytes(persona.initial_state, self.config)
        except StateFormatError as exc:
            raise CorruptStateError(f"persona {persona.name!r} has an unusable initial state: {exc}") from exc

    def initial_blob(self, persona: PersonaRecord) -> Blob:
        return encode(self.initial_state(persona))


def _float(value: object, default: float) -> float:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"expected a number; got {value!r}")
    return float(value)


def _int(value: object, default: int) -> int:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"expected an integer; got {value!r}")
    return value


def _str(value: object, default: str) -> str:
    if value is None:
        return default
    if not isinstance(value, str):
        raise ValueError(f"expected text; got {value!r}")
    return value


def _bool(value: object, default: bool) -> bool:
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ValueError(f"expected true or false; got {value!r}")
    return value
