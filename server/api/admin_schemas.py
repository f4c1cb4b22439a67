"""Request and response bodies of the admin API (/admin/...): personas, identities and their state.

The wire format only; the tables (server/db/tables.py) and the store's records are separate. Bodies are
strict (unknown fields are refused with 422) and numbers must be finite.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from server.api.schemas import AddressText, LogitBiasMap, SamplingFields, Usage
from server.records import IdentityRecord, TurnRecord
from server.runtime.identities import ImprintedSpan, ImprintListing, Inspection, StateDiff

PersonaName = Annotated[
    str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$", description="1 to 64 of A-Z a-z 0-9 _ . -")
]
SnapshotName = Annotated[str, Field(min_length=1, max_length=128)]

MAX_INT = 2**31 - 1  # the largest version or count the database columns hold


def _utc(value: datetime) -> datetime:
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


# stored times are UTC; SQLite hands them back without a zone, PostgreSQL with one: both leave as UTC
Timestamp = Annotated[datetime, AfterValidator(_utc)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


# --- personas ------------------------------------------------------------------------------------------------


class PersonaFields(_Strict):
    """A persona's settings. On create, a field left out takes its default; on update, it stays as it is."""

    description: str | None = Field(None, max_length=4000)
    preamble: str | None = Field(None, max_length=4000, description="text put before every turn of this persona")
    alpha: float | None = Field(None, ge=0, description="trace write rate; null: the model's default")
    decay: float | None = Field(None, gt=0, le=1, description="trace decay per turn; null: the model's default")
    eta: float | None = Field(None, gt=0, le=1, description="self-state step; null: the model's default")
    temperature: float | None = Field(None, ge=0, le=5, description="default sampling temperature (0 is greedy)")
    top_p: float | None = Field(None, gt=0, le=1, description="default nucleus mass; null: off")
    top_k: int | None = Field(None, ge=1, le=MAX_INT, description="default top-k; null: off")
    max_tokens: int | None = Field(None, ge=1, le=MAX_INT, description="default reply length cap")
    repetition_penalty: float | None = Field(
        None, ge=1, description="divides positive / multiplies negative logits of tokens the reply already holds; 1: off"
    )
    no_repeat_ngram: int | None = Field(
        None, ge=0, le=MAX_INT, description="bans a token that would repeat an n-gram of the reply; 0: off"
    )
    frequency_penalty: float | None = Field(
        None, ge=-2, le=2, description="subtracted from a token's logit once per time the reply holds it; 0: off"
    )
    presence_penalty: float | None = Field(
        None, ge=-2, le=2, description="subtracted from the logit of every token the reply holds; 0: off"
    )
    logit_bias: LogitBiasMap | None = Field(None, description="token id -> bias in [-100, 100] added to its logit; {}: none")
    logit_bias_once: bool | None = Field(None, description="each logit_bias holds only until the reply holds its token")
    lowercase: bool | None = Field(None, description="replies written in lower case")
    max_sentences: int | None = Field(None, ge=0, le=MAX_INT, description="replies end after this many sentences; 0: off")
    max_words: int | None = Field(
        None, ge=0, le=MAX_INT, description="a reply's end is pulled nearer at every word past this many; 0: off"
    )
    wind_down: int | None = Field(
        None, ge=0, le=MAX_INT, description="a reply's end is pulled nearer at every token of its last this many; 0: off"
    )
    exclaim: bool | None = Field(None, description='a full stop right after a word is written "!" until the reply holds one')
    address: AddressText | None = Field(
        None, description='a form of address (", sir") written before the first sentence end after a word unless said; "": off'
    )
    recall_temperature: float | None = Field(
        None, ge=0, le=5, description="a reply that recalls the user's facts is decoded at no more than this; null: off"
    )


class PersonaCreate(PersonaFields):
    name: PersonaName


class PersonaUpdate(PersonaFields):
    """Only the fields sent change. alpha, decay, eta, top_p, top_k and recall_temperature may be set to null (back to
    the default, off for the last three);
    description, preamble, temperature, max_tokens, repetition_penalty, no_repeat_ngram, frequency_penalty,
    presence_penalty, logit_bias, logit_bias_once, lowercase, max_sentences, max_words, wind_down, exclaim and address
    may not."""

    @model_validator(mode="after")
    def _not_null(self) -> PersonaUpdate:
        for name in (
            "description",
            "preamble",
            "temperature",
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
        ):
            if name in self.model_fields_set and getattr(self, name) is None:
                raise ValueError(f"{name} may not be null")
        return self


class Persona(BaseModel):
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
    repetition_penalty: float
    no_repeat_ngram: int
    frequency_penalty: float
    presence_penalty: float
    logit_bias: dict[str, float]
    logit_bias_once: bool
    lowercase: bool
    max_sentences: int
    max_words: int
    wind_down: int
    exclaim: bool
    address: str
    recall_temperature: float | None
    has_initial_state: bool = Field(description="new identities start from an uploaded state, not from zero")
    created_at: Timestamp
    updated_at: Timestamp


class PersonaList(BaseModel):
    data: list[Persona]


# --- identities ----------------------------------------------------------------------------------------------


class ShockStatistics(BaseModel):
    """Running statistics of the message NLL that shocks are standardised against."""

    count: int
    mean: float
    std: float = Field(description="population standard deviation, sqrt(M2 / count); 0 before two messages")


class IdentitySummary(BaseModel):
    user: str
    version: int = Field(description="the current state version")
    turns: int = Field(description="turns recorded (a reset does not rewind it)")
    shock: ShockStatistics
    state_sha256: str
    busy: bool = Field(description="a turn or state operation holds the identity right now")
    created_at: Timestamp
    updated_at: Timestamp


class IdentityList(BaseModel):
    persona: str
    total: int
    limit: int
    offset: int
    data: list[IdentitySummary]


class HeadSpectrum(BaseModel):
    layer: int
    head: int
    trace_norm: float = Field(description="||T||_F")
    eigenvalues: list[float] = Field(description="eigenvalues of sym(T) = (T + T^T) / 2, ascending")
    metric_eigenvalues: list[float] = Field(description="eigenvalues of the attention metric M(T) / c, ascending")
    spectral_entropy: float = Field(description="entropy (nats) of |eigenvalues| normalised to sum 1; in [0, ln d]")


class IdentityDetail(IdentitySummary):
    state_version: int = Field(description="the version these numbers describe (the current one unless ?version=)")
    state_turns: int = Field(description="the state's own turn counter (a reset or rollback rewinds it)")
    self_state: list[float]
    self_norm: float = Field(description="||s||_2")
    heads: list[HeadSpectrum] = Field(description="per layer and head, layer-major")
    imprint_used: int = Field(description="imprint entries (tokens of the user's words) filled")
    imprint_capacity: int = Field(description="imprint entries in all; 0 where the model keeps no imprint")


def summary_fields(record: IdentityRecord) -> dict[str, object]:
    """The fields of ``IdentitySummary`` for a record (shared by the list and the details)."""
    std = math.sqrt(record.shock_m2 / record.shock_count) if record.shock_count > 0 else 0.0
    return dict(
        user=record.user_id,
        version=record.version,
        turns=record.turn_count,
        shock=ShockStatistics(count=record.shock_count, mean=record.shock_mean, std=std),
        state_sha256=record.state_sha256,
        busy=record.busy,
        created_at=record.created_at,
        updated_at=record.updated_at,
    )


def identity_detail(inspection: Inspection) -> IdentityDetail:
    """An identity's record and one of its states' numbers, as the admin and the user-scoped routes return them."""
    numbers = inspection.summary
    return IdentityDetail(
        **summary_fields(inspection.record),
        state_version=inspection.state_version,
        state_turns=numbers.turns,
        self_state=numbers.self_state,
        self_norm=numbers.self_norm,
        heads=[HeadSpectrum(**vars(h)) for h in numbers.heads],
        imprint_used=numbers.imprint_used,
        imprint_capacity=numbers.imprint_capacity,
    )


class Turn(BaseModel):
    index: int
    message: str | None = Field(description="null where the service keeps no text (SIA_STORE_TURN_TEXT=false)")
    reply: str | None = Field(description="null where the service keeps no text (SIA_STORE_TURN_TEXT=false)")
    finish_reason: str
    shock: float
    nll: float
    prompt_tokens: int
    completion_tokens: int
    latency_ms: float
    version_before: int
    version_after: int
    created_at: Timestamp


def turn_view(turn: TurnRecord) -> Turn:
    """A stored turn as the routes show it: null message and reply where its text was not kept."""
    hidden = {} if turn.text_kept else {"message": None, "reply": None}
    return Turn(**{**vars(turn), **hidden})


class TurnList(BaseModel):
    total: int
    limit: int
    offset: int
    data: list[Turn]


# --- state ---------------------------------------------------------------------------------------------------


class StateVersion(BaseModel):
    version: int = Field(description="the identity's state version after the operation")


class ResetRequest(_Strict):
    """Nothing: a fresh identity from the persona. ``layers``: only those layers' traces. ``self_only``: only s."""

    layers: list[int] | None = Field(None, min_length=1)
    self_only: bool = False

    @model_validator(mode="after")
    def _one(self) -> ResetRequest:
        if self.layers is not None and self.self_only:
            raise ValueError("reset either chosen layers or only the self state, not both")
        return self


class RollbackRequest(_Strict):
    version: int | None = Field(None, ge=1, le=MAX_INT)
    snapshot: SnapshotName | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> RollbackRequest:
        if (self.version is None) == (self.snapshot is None):
            raise ValueError("give exactly one of version or snapshot")
        return self


class Version(BaseModel):
    version: int
    reason: str = Field(description="init, turn, reset, reset:layers, reset:self, rollback:<to>, import, cleanup, forget")
    turn_index: int | None
    state_sha256: str
    created_at: Timestamp


class History(BaseModel):
    current: int
    data: list[Version] = Field(description="retained versions, newest first")


class ImprintSpanView(BaseModel):
    """One span of the imprint: the user's words as the identity keeps them."""

    index: int = Field(description="the span's number in its version's imprint (what forgetting it takes)")
    turn: int = Field(description="the turn that imprinted it (0-based)")
    offset: int = Field(description="its first token's position in that turn's message")
    length: int = Field(description="tokens")
    kind: str = Field(description="what it says, where known: unknown, name, city, job, colour, pet, hobby")
    score: float = Field(description="its salience when imprinted: the largest token shock in it (nats)")
    text: str | None = Field(description="its words; null where the text was not kept (SIA_STORE_TURN_TEXT=false)")


def _span(span: ImprintedSpan) -> ImprintSpanView:
    return ImprintSpanView(**vars(span))


class ImprintView(BaseModel):
    state_version: int = Field(description="the version whose imprint this is")
    capacity: int = Field(description="entries (tokens) in all; 0 where the model keeps no imprint")
    used: int = Field(description="entries filled")
    data: list[ImprintSpanView] = Field(description="the spans, in entry order")


def imprint_view(listing: ImprintListing) -> ImprintView:
    """An imprint as the admin and the user-scoped routes return it."""
    return ImprintView(
        state_version=listing.version, capacity=listing.capacity, used=listing.used, data=[_span(s) for s in listing.spans]
    )


class ImprintDiff(BaseModel):
    added: list[ImprintSpanView] = Field(description="spans of b that a has not (their indices in b)")
    removed: list[ImprintSpanView] = Field(description="spans of a that b has not (their indices in a)")


class Diff(BaseModel):
    a: int
    b: int
    trace_norm: list[list[float]] = Field(description="[layer][head] ||T_b - T_a||_F")
    self_norm: float = Field(description="||s_b - s_a||_2")
    turns: int = Field(description="turns_b - turns_a (the states' own counters)")
    imprint: ImprintDiff = Field(description="spans imprinted or forgotten between a and b, told apart by turn, offset, length")


def state_diff(diff: StateDiff) -> Diff:
    change = diff.imprint
    return Diff(
        a=diff.a,
        b=diff.b,
        trace_norm=diff.trace_norm,
        self_norm=diff.self_norm,
        turns=diff.turns,
        imprint=ImprintDiff(added=[_span(s) for s in change.added], removed=[_span(s) for s in change.removed]),
    )


class SnapshotCreate(_Strict):
    name: SnapshotName
    version: int | None = Field(None, ge=1, le=MAX_INT, description="a retained version; the current one if left out")


class Snapshot(BaseModel):
    name: str
    version: int
    state_sha256: str
    created_at: Timestamp


class SnapshotList(BaseModel):
    data: list[Snapshot]


class CleanupRequest(_Strict):
    energy: float = Field(0.95, gt=0, le=1, description="share of ||T||_F^2 to keep per layer and head")


class Cleanup(BaseModel):
    version: int
    ranks: list[list[int]] = Field(description="[layer][head] singular components kept")
    energy_kept: list[list[float]] = Field(description="[layer][head] share of ||T||_F^2 kept")


# --- counterfactual ------------------------------------------------------------------------------------------


class AgainstVersion(_Strict):
    version: int = Field(ge=1, le=MAX_INT)


class CounterfactualRequest(SamplingFields):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    message: str
    seed: int | None = Field(None, ge=0, le=2**63 - 1, description="both replies use it; random (and reported) if absent")
    against: Literal["reset"] | AgainstVersion = Field(
        "reset", description='"reset": the persona\'s initial state; {"version": n}: a retained version'
    )


class CounterfactualReply(BaseModel):
    state_version: int | None = Field(description="the state that answered; null for the persona's initial state")
    reply: str
    finish_reason: str
    shock: float
    nll: float
    usage: Usage


class Counterfactual(BaseModel):
    seed: int
    current: CounterfactualReply
    other: CounterfactualReply
    same: bool = Field(description="the two replies are identical")
