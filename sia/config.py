"""The model configuration: the single source of truth for shapes, dynamics and stabilisation.

A checkpoint carries its config (``to_file``/``from_file``), so a saved model always rebuilds exactly.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

ATTENTION_VARIANTS = ("trace", "dot")
POOLING_VARIANTS = ("mean", "attention")


@dataclass
class ModelConfig:
    # --- transformer shape ---
    vocab_size: int = 260  # the byte tokenizer: 256 bytes + 4 special tokens
    block_size: int = 512  # longest context (tokens) the position table covers
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128  # residual width; value/head width = n_embd // n_head
    mlp_ratio: int = 4
    dropout: float = 0.0

    # --- attention variant (registry in sia/model.py) ---
    attention: str = "trace"  # "trace": TTA + self slot; "dot": plain dot-product attention, no state (the twin)

    # --- identity state ---
    d_self: int = 16  # self-state dimension d_s
    pooling: str = "mean"  # how a turn's hidden states pool into z: "mean", or "attention" (a learned score per token)

    # --- identity dynamics (defaults; a persona may override them) ---
    alpha: float = 0.1  # plasticity: how strongly a turn imprints the trace
    decay: float = 0.95  # lambda: temporal decay of the trace per turn
    eta: float = 0.5  # self-state step size, in (0, 1]

    # --- metric stabilisation (docs/attention.md, "Stabilising the metric") ---
    metric_max_deform: float = 0.5  # rho in [0, 1): eigenvalues of the metric stay in c·[1-rho, 1+rho]
    metric_temperature: float = 1.0  # tau > 0: trace eigenvalue scale at which the deformation saturates

    # --- shock (docs/attention.md, "Shock") ---
    shock_prior_mean: float = 2.0  # nats/token assumed before an identity has any history
    shock_prior_std: float = 1.0
    shock_prior_weight: float = 2.0  # pseudo-count of the prior in the running statistics
    shock_clip: float = 8.0  # standardised shock is clipped to [-clip, clip]

    def __post_init__(self) -> None:
        positive = ("vocab_size", "block_size", "n_layer", "n_head", "n_embd", "mlp_ratio", "d_self")
        for name in positive:
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive integer; got {value!r}")
        if self.n_embd % self.n_head != 0:
            raise ValueError(f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})")
        if self.head_dim < 2:
            raise ValueError(f"n_embd // n_head must be at least 2 (one query/key column + the bias slot); got {self.head_dim}")
        if self.attention not in ATTENTION_VARIANTS:
            raise ValueError(f"attention must be one of {ATTENTION_VARIANTS}; got {self.attention!r}")
        if self.pooling not in POOLING_VARIANTS:
            raise ValueError(f"pooling must be one of {POOLING_VARIANTS}; got {self.pooling!r}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1); got {self.dropout}")
        if not self.alpha >= 0.0:
            raise ValueError(f"alpha (plasticity) must be >= 0; got {self.alpha}")
        if not 0.0 < self.decay <= 1.0:
            raise ValueError(f"decay (lambda) must be in (0, 1]; got {self.decay}")
        if not 0.0 < self.eta <= 1.0:
            raise ValueError(f"eta must be in (0, 1] so the self state stays in [-1, 1]; got {self.eta}")
        if not 0.0 <= self.metric_max_deform < 1.0:
            raise ValueError(
                f"metric_max_deform must be in [0, 1) to keep the metric positive definite; got {self.metric_max_deform}"
            )
        if not self.metric_temperature > 0.0:
            raise ValueError(f"metric_temperature must be > 0; got {self.metric_temperature}")
        if not self.shock_prior_std > 0.0:
            raise ValueError(f"shock_prior_std must be > 0; got {self.shock_prior_std}")
        if not self.shock_prior_weight > 0.0:
            raise ValueError(f"shock_prior_weight must be > 0; got {self.shock_prior_weight}")
        if not self.shock_clip > 0.0:
            raise ValueError(f"shock_clip must be > 0; got {self.shock_clip}")

    # --- derived values ---
    @property
    def head_dim(self) -> int:
        """Value width per head; also the width the attention kernel runs at."""
        return self.n_embd // self.n_head

    @property
    def qk_dim(self) -> int:
        """Query/key width d: one less than head_dim, leaving exactly the slot of the key-bias column."""
        return self.head_dim - 1

    @property
    def metric_base(self) -> float:
        """c = 1 / (2 sqrt(d)): with the metric c·I the cross term of the distance is q·k / sqrt(d)."""
        return 1.0 / (2.0 * math.sqrt(self.qk_dim))

    # --- files ---
    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelConfig:
        check_fields(cls, data, "config")
        return cls(**data)

    def to_file(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n")

    @classmethod
    def from_file(cls, path: str | Path) -> ModelConfig:
        return cls.from_dict(read_json_object(path))


def read_json_object(path: str | Path) -> dict[str, Any]:
    """A JSON file holding one object; ValueError naming the file otherwise."""
    try:
        data = json.loads(Path(path).read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object of config fields")
    return data


def check_fields(cls: type, data: dict[str, Any], what: str) -> None:
    """Refuse keys that are not fields of the dataclass ``cls``, listing the known ones."""
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f"unknown {what} keys {unknown}; known keys are {sorted(known)}")
