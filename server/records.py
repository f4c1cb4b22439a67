"""Records: the plain values the store hands out and takes in (never ORM rows), shared by the store, the
runtime services and the routes that shape them into responses."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from sia.identity.turn import TurnReply

__all__ = [
    "PERSONA_FIELDS",
    "ApiKey",
    "Blob",
    "IdentityRecord",
    "Lease",
    "NewTurn",
    "PersonaRecord",
    "SnapshotRecord",
    "TurnRecord",
    "VersionRecord",
]

# a persona's settable fields (besides its name and its initial state)
PERSONA_FIELDS = (
    "description",
    "preamble",
    "alpha",
    "decay",
    "eta",
    "temperature",
    "top_p",
    "top_k",
    "max_tokens",
    "repetition_penalty",
    "no_repeat_ngram",
    "frequency_penalty",
    "presence_penalty",
    "logit_bias",
    "logit_bias_once",
    "lowercase",
    "max_sentences",
    "max_words",
    "wind_down",
    "exclaim",
    "address",
    "recall_temperature",
)


@dataclass(frozen=True)
class Blob:
    """A serialised state and the figures kept beside it in columns (for listing without parsing)."""

    data: bytes
    format_version: int
    shock_count: int
    shock_mean: float
    shock_m2: float


@dataclass(frozen=True)
class PersonaRecord:
    id: int
    name: str
    description: str
    preamble: str
    alpha: float | None
    decay: float | None
    eta: float | None
    temperature: float
    top_p: float | None
    top_k: int | None
    max_tokens: int
    repetition_penalty: float  # 1: off
    no_repeat_ngram: int  # 0: off
    frequency_penalty: float  # 0: off
    presence_penalty: float  # 0: off
    logit_bias: dict[str, float]  # token id (decimal) -> bias; {}: none
    logit_bias_once: bool  # each bias holds only until the reply holds its token
    lowercase: bool  # the reply written in lower case
    max_sentences: int  # the reply ended after this many sentences; 0: off
    max_words: int  # the reply's end pulled nearer at every word past this many; 0: off
    wind_down: int  # the reply's end pulled nearer at every token of its last this many; 0: off
    exclaim: bool  # a full stop right after a word written "!" until the reply holds one
    address: str  # a form of address written before the reply's first sentence end unless it says it; "": off
    recall_temperature: float | None  # the most a reply that recalls the user's facts is decoded at; None: off
    initial_state: bytes | None
    defaults_release: int  # the release of the default personas' defaults it was last brought to (0: none recorded)
    created_at: datetime
    updated_at: datetime


@dataclass(frozen=True)
class IdentityRecord:
    id: int
    persona: str
    user_id: str
    version: int
    turn_count: int
    shock_count: int
    shock_mean: float
    shock_m2: float
    state_sha256: str
    format_version: int
    busy: bool  # a turn holds it right now
    created_at: datetime
    updated_at: datetime


@dataclass(frozen=True)
class Lease:
    """A turn's hold on one identity, with the state as it was when the hold was taken."""

    identity_id: int
    persona_record: PersonaRecord  # the persona as it was when the hold was taken
    user_id: str
    token: str
    version: int
    turn_count: int
    state: bytes

    @property
    def persona(self) -> str:
        return self.persona_record.name


@dataclass(frozen=True)
class NewTurn(TurnReply):
    """A turn to store: what the library's turn answered (TurnReply), the message it answered, how long it took.

    Without ``text_kept`` (SIA_STORE_TURN_TEXT=false) the record holds no text: ``message`` and ``reply`` are empty,
    and the store writes NULL for both."""

    message: str
    latency_ms: float
    text_kept: bool = field(default=True, kw_only=True)

    @classmethod
    def of(cls, answered: TurnReply, message: str, latency_ms: float, *, keep_text: bool) -> NewTurn:
        """The record of a turn that answered ``message``, holding its text only when ``keep_text``."""
        if keep_text:
            return cls(**answered.reply_fields(), message=message, latency_ms=latency_ms)
        return cls(**{**answered.reply_fields(), "reply": ""}, message="", latency_ms=latency_ms, text_kept=False)


@dataclass(frozen=True)
class TurnRecord(NewTurn):
    """A stored turn: its index for the identity, the state versions around it, when it was stored."""

    index: int
    version_before: int
    version_after: int
    created_at: datetime


@dataclass(frozen=True)
class VersionRecord:
    version: int
    reason: str
    turn_index: int | None
    state_sha256: str
    created_at: datetime


@dataclass(frozen=True)
class SnapshotRecord:
    name: str
    version: int
    state_sha256: str
    created_at: datetime


@dataclass(frozen=True)
class ApiKey:
    """An API key as listed: never the key itself, nor its hash."""

    id: int
    name: str
    role: str
    user_id: str | None
    prefix: str
    created_at: datetime
    revoked_at: datetime | None
