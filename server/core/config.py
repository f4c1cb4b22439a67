"""One settings object for the service and the store, read from ``SIA_*`` environment variables."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = ["Settings", "get_settings"]


class Settings(BaseSettings):
    """Every setting has a default that runs the embedded configuration (SQLite + the bundled model)."""

    model_config = SettingsConfigDict(env_prefix="SIA_", extra="ignore")

    # --- storage -------------------------------------------------------------------------------------
    data_dir: Path = Field(Path("sia-data"), description="directory for the SQLite database and other local files")
    database_url: str | None = Field(
        None, description="SQLAlchemy URL; default sqlite:///<data_dir>/sia.db. PostgreSQL: postgresql+psycopg://..."
    )
    db_pool_size: int = Field(10, ge=1, description="connections kept open per process (PostgreSQL)")
    db_max_overflow: int = Field(20, ge=0, description="extra connections allowed under load (PostgreSQL)")
    sqlite_busy_timeout_ms: int = Field(5000, ge=0, description="how long SQLite waits for its write lock")

    # --- identities and turns ------------------------------------------------------------------------
    checkpoint: Path | None = Field(
        None,
        description="a SIA or native checkpoint directory, a GGUF file or an HF directory (default: the bundled SmolLM2)",
    )
    busy_timeout_s: float = Field(
        60.0, gt=0, description="how long a turn waits for its identity (turns of one identity are serial) before 'busy'"
    )
    lease_s: float = Field(
        300.0, gt=0, description="a turn's hold on its identity expires after this long (a crashed process's hold too)"
    )
    history_retention: int = Field(100, ge=1, description="state versions kept per identity (named snapshots are kept apart)")
    store_turn_text: bool = Field(
        True,
        description="keep the words of a conversation: turn records keep the message and the reply, and the imprint its"
        " spans' tokens. false (privacy mode): turn records keep no text (NULL), the imprint keeps keys and values only,"
        " and there is no prompt window; the reply is still returned to the caller",
    )
    prompt_window_tokens: int = Field(
        0,
        ge=0,
        description="a turn's context: the persona's prompt followed by the newest stored exchanges of the identity, whole"
        " ones only, at most this many tokens; 0: none. Always 0 while store_turn_text is false",
    )

    # --- the HTTP service ----------------------------------------------------------------------------
    host: str = Field("127.0.0.1", description="address `sia serve` binds (development mode always binds 127.0.0.1)")
    port: int = Field(8000, ge=1, le=65535, description="port `sia serve` listens on")
    auto_migrate: bool = Field(
        True, description="`sia serve` upgrades a SQLite database at start-up (PostgreSQL: run `sia db upgrade` once)"
    )
    max_message_chars: int = Field(8000, ge=1, description="longest user message accepted")
    max_tokens_cap: int = Field(512, ge=1, description="largest max_tokens a request may ask for")
    max_body_bytes: int = Field(1 << 20, ge=1024, description="request bodies larger than this are refused with 413")
    max_batch: int = Field(
        16, ge=0, description="turns of different identities decoding together in one forward per step; 0: no batching"
    )
    batch_wait_ms: float = Field(
        0.0, ge=0, le=1000, description="how long an idle batch waits for batch mates before its first step"
    )
    max_queued_turns: int = Field(64, ge=1, description="turns waiting for a place in a full batch; more get 503")
    batch_threads: int = Field(
        0,
        ge=0,
        description="torch threads a batch decodes on while no prefill computes beside it (and a turn that arrives"
        " when nothing decodes prefills on); 0: the cores this process may use",
    )
    max_concurrent_turns: int = Field(
        4, ge=1, description="counterfactuals (and, with SIA_MAX_BATCH=0, turns) computing at once per process"
    )
    cors_origins: list[str] = Field(default_factory=list, description="origins allowed by CORS (JSON list); none by default")
    torch_threads: int = Field(1, ge=1, description="torch threads per process (turns already run in parallel)")
    device: str = Field(
        "cpu",
        pattern=r"^(cpu|auto|cuda(:[0-9]+)?)$",
        description="where the model computes: cpu; cuda (or cuda:N) a GPU, which must be present; auto: the first GPU"
        " where torch sees one, else the CPU. Identity state is stored and handed over on the CPU, moved to the device"
        " once per turn",
    )
    dtype: Literal["auto", "float32", "bfloat16"] = Field(
        "auto",
        description="the weights the model decodes in: bfloat16 halves them and decodes faster on GPUs and CPUs with"
        " bfloat16 instructions, but batched replies are then not always token for token the solo ones; the identity"
        " state's update stays float32. auto: bfloat16 on a GPU, float32 on the CPU",
    )
    packed_weights: Literal["auto", "float32", "bfloat16", "off"] = Field(
        "auto",
        description="a float32 model on a CPU: keep a second copy of the backbone's matrices in oneDNN's packed layout."
        " float32 (or true): products of three rows or more (batched decoding, prefill) run faster (eight rows 1.6x),"
        " for about 510 MB more for SmolLM2-135M. bfloat16: every projection multiplies a bfloat16 copy (about 320 MB"
        " more), rounded as under bfloat16 autocast, and batched rows compute exactly as alone: decoding reads half the"
        " bytes. auto (the default): bfloat16 where this CPU multiplies bfloat16 natively (timed at start-up; there it"
        " decodes a little faster than float32, with recall and reply perplexity as float32's), else float32. off (or"
        " false): no copy",
    )
    read_shift: float | None = Field(
        None,
        ge=-20,
        le=20,
        allow_inf_nan=False,
        description="every self slot's logit lowered by this (a pretrained backbone's adapter), in place of the"
        " checkpoint's own (unset: the checkpoint's; the bundled adapter's is 0.5): a weaker read of the identity state"
        " costs recall and brings replies closer to the base model's (docs/model.md: the bundled adapter at 0 recalls"
        " 94.8 % at 1.072x base perplexity, at its own 0.5 91.7 % at 1.003x); negative strengthens it",
    )
    log_json: bool = Field(True, description="JSON log lines with a request id (false: plain text)")
    log_level: str = Field("INFO", description="logging level")

    @field_validator("database_url", "checkpoint", "read_shift", mode="before")
    @classmethod
    def _empty_is_default(cls, value: object) -> object:
        return None if isinstance(value, str) and not value.strip() else value

    @field_validator("packed_weights", mode="before")
    @classmethod
    def _packing_switch(cls, value: object) -> object:
        """true / false (the setting's earlier form) mean float32 / off."""
        if isinstance(value, bool):
            return "float32" if value else "off"
        if isinstance(value, str) and value.strip().lower() in ("true", "false", "1", "0", "yes", "no", "on"):
            return "float32" if value.strip().lower() in ("true", "1", "yes", "on") else "off"
        return value

    @model_validator(mode="after")
    def _default_database(self) -> Settings:
        if self.database_url is None:
            self.database_url = f"sqlite:///{self.data_dir / 'sia.db'}"
        return self

    @property
    def model_cache(self) -> Path:
        """Where a GGUF base is dequantised once (data_dir/models/<sha256>.v1/), so restarts load float weights."""
        return self.data_dir / "models"

    @property
    def url(self) -> str:
        assert self.database_url is not None  # set by the validator
        return self.database_url


@lru_cache
def get_settings() -> Settings:
    """The process-wide settings, read once from the environment."""
    return Settings()
