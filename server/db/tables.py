"""ORM tables. Only Alembic migrations create them (migrations/); these classes describe them for queries."""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import JSON, Boolean, DateTime, Float, ForeignKey, Integer, LargeBinary, String, Text, UniqueConstraint, text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.sql import false

__all__ = ["ApiKeyRow", "Base", "IdentityRow", "PersonaRow", "SnapshotRow", "StateVersionRow", "TurnRow", "utcnow"]


def utcnow() -> datetime:
    return datetime.now(UTC)


class Base(DeclarativeBase):
    pass


class PersonaRow(Base):
    __tablename__ = "personas"
    __table_args__ = (UniqueConstraint("name", name="uq_personas_name"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(64))
    description: Mapped[str] = mapped_column(Text, default="")
    preamble: Mapped[str] = mapped_column(Text, default="")  # text put before every turn of this persona
    # update-rule rates; NULL means the model config's default
    alpha: Mapped[float | None] = mapped_column(Float)
    decay: Mapped[float | None] = mapped_column(Float)
    eta: Mapped[float | None] = mapped_column(Float)
    # sampling defaults for requests that do not say
    temperature: Mapped[float] = mapped_column(Float, default=0.8)
    top_p: Mapped[float | None] = mapped_column(Float)
    top_k: Mapped[int | None] = mapped_column(Integer)
    max_tokens: Mapped[int] = mapped_column(Integer, default=64)
    repetition_penalty: Mapped[float] = mapped_column(Float, default=1.0, server_default="1.0")  # 1: off
    no_repeat_ngram: Mapped[int] = mapped_column(Integer, default=0, server_default="0")  # 0: off
    # OpenAI's additive penalties (0: off) and logit bias (token id, as a string, -> bias; {}: none)
    frequency_penalty: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")
    presence_penalty: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")
    logit_bias: Mapped[dict[str, float]] = mapped_column(JSON, default=dict, server_default=text("'{}'"))
    # each logit_bias pair holds only until the reply holds its token (a word the persona should say once)
    logit_bias_once: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    # the replies' form: written in lower case; ended after this many sentences (0: off)
    lowercase: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    max_sentences: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    max_words: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    wind_down: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # a full stop right after a word is written "!" until the reply holds one
    exclaim: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    # a form of address (", sir") written before the reply's first sentence end after a word unless it says it; "": off
    address: Mapped[str] = mapped_column(String(40), default="", server_default="")
    # a reply that recalls the user's facts is decoded at no more than this temperature (0: greedy; NULL: off)
    recall_temperature: Mapped[float | None] = mapped_column(Float)
    # the release of the default personas' defaults this persona was last brought to (sia.personas.DEFAULTS_RELEASE;
    # 0: stored before any was recorded); not an admin's field
    defaults_release: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    initial_state: Mapped[bytes | None] = mapped_column(LargeBinary)  # safetensors state new identities start from
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow, onupdate=utcnow)


class IdentityRow(Base):
    __tablename__ = "identities"
    __table_args__ = (UniqueConstraint("persona_id", "user_id", name="uq_identities_persona_user"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    persona_id: Mapped[int] = mapped_column(ForeignKey("personas.id", ondelete="CASCADE"), index=True)
    user_id: Mapped[str] = mapped_column(String(256))
    state: Mapped[bytes] = mapped_column(LargeBinary)  # safetensors bytes (sia.identity.state.state_to_bytes)
    state_sha256: Mapped[str] = mapped_column(String(64))
    format_version: Mapped[int] = mapped_column(Integer)
    version: Mapped[int] = mapped_column(Integer, default=1)  # +1 on every change of the state
    turn_count: Mapped[int] = mapped_column(Integer, default=0)  # turns recorded; a reset does not rewind it
    shock_count: Mapped[int] = mapped_column(Integer, default=0)
    shock_mean: Mapped[float] = mapped_column(Float, default=0.0)
    shock_m2: Mapped[float] = mapped_column(Float, default=0.0)
    # a turn's hold on the identity: set by a short transaction before inference, cleared by its commit
    lease_token: Mapped[str | None] = mapped_column(String(36))
    lease_expires: Mapped[float | None] = mapped_column(Float)  # unix time
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow, onupdate=utcnow)


class TurnRow(Base):
    __tablename__ = "turns"
    __table_args__ = (UniqueConstraint("identity_id", "index", name="uq_turns_identity_index"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    identity_id: Mapped[int] = mapped_column(ForeignKey("identities.id", ondelete="CASCADE"), index=True)
    index: Mapped[int] = mapped_column(Integer)  # 0, 1, 2, ... per identity
    # NULL: the service kept no text of this turn (SIA_STORE_TURN_TEXT=false)
    message: Mapped[str | None] = mapped_column(Text)
    reply: Mapped[str | None] = mapped_column(Text)
    finish_reason: Mapped[str] = mapped_column(String(16))
    shock: Mapped[float] = mapped_column(Float)
    nll: Mapped[float] = mapped_column(Float)
    prompt_tokens: Mapped[int] = mapped_column(Integer)
    completion_tokens: Mapped[int] = mapped_column(Integer)
    latency_ms: Mapped[float] = mapped_column(Float)
    version_before: Mapped[int] = mapped_column(Integer)
    version_after: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class StateVersionRow(Base):
    """Recent versions of an identity's state, for history, diff and rollback (pruned to the retention)."""

    __tablename__ = "state_versions"
    __table_args__ = (UniqueConstraint("identity_id", "version", name="uq_state_versions_identity_version"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    identity_id: Mapped[int] = mapped_column(ForeignKey("identities.id", ondelete="CASCADE"), index=True)
    version: Mapped[int] = mapped_column(Integer)
    state: Mapped[bytes] = mapped_column(LargeBinary)
    state_sha256: Mapped[str] = mapped_column(String(64))
    reason: Mapped[str] = mapped_column(String(64))  # init, turn, reset, rollback, import, cleanup
    turn_index: Mapped[int | None] = mapped_column(Integer)  # the turn that produced it, if any
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class SnapshotRow(Base):
    """A named copy of one state version, kept until deleted (independent of the retention)."""

    __tablename__ = "snapshots"
    __table_args__ = (UniqueConstraint("identity_id", "name", name="uq_snapshots_identity_name"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    identity_id: Mapped[int] = mapped_column(ForeignKey("identities.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(128))
    version: Mapped[int] = mapped_column(Integer)
    state: Mapped[bytes] = mapped_column(LargeBinary)
    state_sha256: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class ApiKeyRow(Base):
    """An API key, stored as its sha256 (the key itself is shown once, at creation)."""

    __tablename__ = "api_keys"
    __table_args__ = (UniqueConstraint("key_hash", name="uq_api_keys_key_hash"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(128))
    role: Mapped[str] = mapped_column(String(16))  # "admin" or "user"
    user_id: Mapped[str | None] = mapped_column(String(256))  # the only user a user key may act as
    key_hash: Mapped[str] = mapped_column(String(64))
    prefix: Mapped[str] = mapped_column(String(16))  # the key's first characters, to tell keys apart in listings
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
