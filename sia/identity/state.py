"""Identity state and its dynamics: the trace per layer and head, the self state, and pure update rules.

Notation: n_layer layers, H heads, d query/key width (config.qk_dim), d_s self-state width, C residual width.

    T_{t+1} = lambda T_t + alpha tanh(|Shock_t|) (K_t ⊗ Q_t)           (docs/attention.md §4, stored as is)
    M(T)    = c (I + rho U tanh(Lambda / tau) U^T),  sym(T) = U Lambda U^T   (metric used by attention)
    s_{t+1} = clamp(s_t + eta (tanh(W [z; s_t] + b) - s_t), -1, 1)     (gated: the step times sigma(G [z; s_t] + b_g))

Nothing here mutates a state: every rule returns a new IdentityState. docs/attention.md derives the bounds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TypeVar

import torch
import torch.nn.functional as F
from safetensors import SafetensorError
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save
from torch import Tensor, nn

from sia.identity.imprint import Imprint, fitted
from sia.model.config import STATE_DTYPES, AnyConfig

__all__ = [
    "FORMAT_VERSION",
    "MAX_STATE_BYTES",
    "CleanupReport",
    "Dynamics",
    "IdentityState",
    "SelfUpdate",
    "ShockStats",
    "StateFormatError",
    "TurnSummary",
    "advance",
    "distance",
    "low_rank_cleanup",
    "metric_factors",
    "self_step",
    "stabilised_metric",
    "state_from_bytes",
    "state_to_bytes",
    "trace_step",
    "update_self",
    "update_shock_stats",
    "update_trace",
    "welford_step",
]

N = TypeVar("N", float, Tensor)

FORMAT_VERSION = 2  # 2 added the imprint; a version 1 blob (trace and self state only) loads with an empty imprint
READABLE_VERSIONS = (1, 2)
MAX_STATE_BYTES = 64 * 1024 * 1024  # refuse to parse blobs larger than this


class StateFormatError(ValueError):
    """A serialised identity state is malformed; the message says what is wrong."""


@dataclass(frozen=True)
class ShockStats:
    """Running statistics of an identity's message NLL (Welford: count, mean, sum of squared deviations)."""

    count: int = 0
    mean: float = 0.0
    m2: float = 0.0


@dataclass(frozen=True)
class TurnSummary:
    """What a turn leaves behind for the update rules: one identity, or a batch with a leading B dim."""

    queries: Tensor  # ([B,] n_layer, H, d) unit-norm mean query of the turn, Q_t
    keys: Tensor  # ([B,] n_layer, H, d) unit-norm mean key of the turn, K_t
    hidden: Tensor  # ([B,] C) pooled final hidden state z_t

    def row(self, b: int) -> TurnSummary:
        """One identity's summary out of a batched one."""
        return TurnSummary(queries=self.queries[b], keys=self.keys[b], hidden=self.hidden[b])


@dataclass(frozen=True)
class IdentityState:
    """The persistent state of one (persona, user) identity."""

    trace: Tensor  # config.trace_shape in config.state_dtype, stored exactly as the update rule produces it
    self_state: Tensor  # (d_s,) float32, every entry in [-1, 1]
    turns: int = 0
    shock: ShockStats = ShockStats()
    format_version: int = FORMAT_VERSION
    imprint: Imprint | None = None  # the user's own words (sia.identity.imprint); None: nothing imprinted

    @classmethod
    def fresh(cls, config: AnyConfig, initial_trace: Tensor | None = None) -> IdentityState:
        """A new identity: zero trace (or a persona's initial trace), zero self state, no history."""
        dtype = STATE_DTYPES[config.state_dtype]
        if initial_trace is None:
            trace = torch.zeros(config.trace_shape, dtype=dtype)
        else:
            _check_tensor("initial_trace", initial_trace, config.trace_shape, dtype)
            trace = initial_trace.detach().clone()
        return cls(trace=trace, self_state=torch.zeros(config.d_self))

    def validate(self, config: AnyConfig) -> None:
        """Raise StateFormatError unless shapes, dtypes, bounds and counters fit ``config``."""
        if self.format_version != FORMAT_VERSION:
            raise StateFormatError(f"format version {self.format_version} is not supported (expected {FORMAT_VERSION})")
        _check_tensor("trace", self.trace, config.trace_shape, STATE_DTYPES[config.state_dtype])
        _check_tensor("self_state", self.self_state, (config.d_self,))
        if self.self_state.abs().max().item() > 1.0:
            raise StateFormatError("self_state entries must lie in [-1, 1]")
        if self.turns < 0:
            raise StateFormatError(f"turns must be >= 0; got {self.turns}")
        if self.imprint is not None:
            self.imprint.validate(config)
        s = self.shock
        if s.count < 0 or not math.isfinite(s.mean) or not math.isfinite(s.m2) or s.m2 < 0:
            raise StateFormatError(f"shock statistics are invalid: {s}")


def _check_tensor(name: str, tensor: Tensor, shape: tuple[int, ...], dtype: torch.dtype = torch.float32) -> None:
    if not isinstance(tensor, Tensor):
        raise StateFormatError(f"{name} must be a tensor; got {type(tensor).__name__}")
    if tuple(tensor.shape) != shape:
        raise StateFormatError(f"{name} has shape {tuple(tensor.shape)}; expected {shape}")
    if tensor.dtype != dtype:
        raise StateFormatError(f"{name} has dtype {tensor.dtype}; expected {dtype}")
    if not bool(torch.isfinite(tensor).all()):
        raise StateFormatError(f"{name} contains NaN or infinite values")


# ---------------------------------------------------------------------------------------------------------
# The metric attention uses
# ---------------------------------------------------------------------------------------------------------


def _trace_eigen(trace: Tensor) -> tuple[Tensor, Tensor]:
    """The eigenvalues (..., d) and eigenvectors (..., d, d) (columns) of sym(T), float64 on the CPU."""
    # A GPU decomposes a batch of small float64 matrices slowly (a SmolLM2 identity's 30: 25 ms on an H200, 12 ms on
    # its host's CPU; eight identities 175 against 78 ms): the metric is computed on the CPU and handed back.
    trace = trace.float().cpu()
    sym = 0.5 * (trace + trace.transpose(-1, -2))  # (..., d, d)
    eigvals, eigvecs = torch.linalg.eigh(sym.double())
    return eigvals, eigvecs


def stabilised_metric(trace: Tensor, config: AnyConfig) -> Tensor:
    """M = c (o I + rho U tanh(Lambda / tau) U^T) for sym(T) = U Lambda U^T; any leading batch dims; float32 out.

    o = config.metric_offset. Native (o = 1): eigenvalues of M lie in [c (1 - rho), c (1 + rho)] for every
    finite trace, so M is positive definite, distances are non-negative and logits are bounded by
    c (1 + rho) |q - k|^2. Injected (o = 0): M = 0 for a zero trace, eigenvalues in c·rho·(-1, 1).
    """
    d = trace.shape[-1]
    device = trace.device
    eigvals, eigvecs = _trace_eigen(trace)
    squashed = torch.tanh(eigvals / config.metric_temperature)  # (..., d), in (-1, 1)
    deform = (eigvecs * squashed.unsqueeze(-2)) @ eigvecs.transpose(-1, -2)  # U diag(.) U^T
    eye = torch.eye(d, dtype=torch.float64)
    metric = config.metric_base * (config.metric_offset * eye + config.metric_max_deform * deform)
    symmetric: Tensor = 0.5 * (metric + metric.transpose(-1, -2))
    return symmetric.to(device, torch.float32)


def metric_factors(trace: Tensor, config: AnyConfig, rank: int | None = None) -> tuple[Tensor, Tensor]:
    """The ``rank`` eigenpairs of the injected metric M (offset 0) largest in magnitude: an orthonormal basis (..., d, r)
    and its eigenvalues (..., r), float32 on the trace's device, M ~ basis diag(values) basis^T; None: all d (exactly
    M, to within rounding). Eigenvalues lie in c·rho·(-1, 1) and each turn adds a rank-1 term to T, two to sym(T): a
    trace of t turns has at most 2t that are not 0 (the storage dtype's rounding aside), and the decay shrinks the
    oldest. Leaving out eigenvalues of magnitude at most m moves a logit by at most 4m (|u - w|^2 <= 4 for unit u,
    w; docs/attention.md)."""
    if config.metric_offset != 0.0:
        raise ValueError(f"metric_factors is the injected metric's (offset 0); this config's offset is {config.metric_offset}")
    d = trace.shape[-1]
    r = d if rank is None else rank
    if not 1 <= r <= d:
        raise ValueError(f"rank must be in [1, {d}]; got {rank}")
    device = trace.device
    eigvals, eigvecs = _trace_eigen(trace)
    values = config.metric_base * config.metric_max_deform * torch.tanh(eigvals / config.metric_temperature)  # (..., d)
    if r < d:
        top = values.abs().topk(r, dim=-1).indices.sort(dim=-1).values  # (..., r), in eigh's order
        values = values.gather(-1, top)
        eigvecs = eigvecs.gather(-1, top.unsqueeze(-2).expand(*eigvecs.shape[:-1], r))
    return eigvecs.to(device, torch.float32), values.to(device, torch.float32)


# ---------------------------------------------------------------------------------------------------------
# Update rules (pure)
# ---------------------------------------------------------------------------------------------------------


def trace_step(trace: Tensor, keys: Tensor, queries: Tensor, shock: Tensor, *, alpha: float, decay: float) -> Tensor:
    """decay T + alpha tanh(|shock|) (K ⊗ Q) on batched tensors: trace (B, n_layer, H, d, d), keys and
    queries (B, n_layer, H, d), shock (B,). The tensor form used by training; update_trace wraps it."""
    outer = keys.unsqueeze(-1) * queries.unsqueeze(-2)  # (B, n_layer, H, d, d): K_a Q_b
    gate = alpha * torch.tanh(shock.abs())  # (B,)
    if trace.dtype == torch.float32:
        return decay * trace + gate.view(-1, 1, 1, 1, 1) * outer.float()
    # a narrower storage dtype: compute in float32, round once to what is stored
    return (decay * trace.float() + gate.view(-1, 1, 1, 1, 1).float() * outer.float()).to(trace.dtype)


def update_trace(state: IdentityState, summary: TurnSummary, shock: float, *, alpha: float, decay: float) -> IdentityState:
    """T <- decay T + alpha tanh(|shock|) (K_t ⊗ Q_t), per layer and head."""
    if not math.isfinite(shock):
        raise ValueError(f"shock must be finite; got {shock}")
    if alpha < 0 or not 0 < decay <= 1:
        raise ValueError(f"need alpha >= 0 and 0 < decay <= 1; got alpha={alpha}, decay={decay}")
    trace = trace_step(
        state.trace.unsqueeze(0),
        summary.keys.unsqueeze(0),
        summary.queries.unsqueeze(0),
        torch.tensor([shock], dtype=torch.float32, device=state.trace.device),
        alpha=alpha,
        decay=decay,
    )
    return replace(state, trace=trace[0])


class SelfUpdate(nn.Module):
    """g(z, s) = tanh(W [z; s] + b) - s, the learned direction of the self-state update; with ``write_gate``
    g(z, s) = sigma(G [z; s] + b_g) * (tanh(W [z; s] + b) - s), a per-dimension gate that can keep what s holds
    (b = 0 with memory tokens).

    z is the pooled hidden state (width C) or, with K memory tokens, their K final hidden states and the pooled one
    ((K + 1)·C), each standardised over its C features so that every part enters the update at the same scale, then
    each feature standardised across turns by running statistics kept while training (``centre``, ``spread``): what
    every turn has in common is removed, what is left is what this turn says, at unit scale.
    """

    centre: Tensor
    spread: Tensor

    def __init__(self, config: AnyConfig) -> None:
        super().__init__()
        self.parts = config.memory_tokens + 1 if config.memory_tokens else 0  # 0: z is used as it is
        width = config.n_embd * max(1, self.parts) + config.d_self
        # standardised inputs carry no common part, and no bias adds one: the state only holds what turns said
        self.proj = nn.Linear(width, config.d_self, bias=not self.parts)
        self.gate = nn.Linear(width, config.d_self) if config.write_gate else None
        if self.parts:  # (a pooled z needs no statistics: the native model's checkpoints have none)
            self.register_buffer("centre", torch.zeros(config.n_embd * self.parts))
            self.register_buffer("spread", torch.ones(config.n_embd * self.parts))
        self.observed = 0  # batches seen by ``observe`` in this process

    def standardise(self, z: Tensor) -> Tensor:
        if not self.parts:
            return z
        parts = z.reshape(*z.shape[:-1], self.parts, -1)
        return F.layer_norm(parts, parts.shape[-1:]).flatten(-2)

    @torch.no_grad()
    def observe(self, z: Tensor, momentum: float = 0.02) -> None:
        """Training: move the running mean and spread towards those of these turns' standardised z (the first call
        of a fresh update sets them)."""
        if not self.parts:
            return
        x = self.standardise(z.detach().float()).reshape(-1, self.centre.shape[0])
        if x.shape[0] < 2:
            return
        rate = 1.0 if self.observed == 0 and not bool(self.centre.any()) else momentum
        self.centre.lerp_(x.mean(0).to(self.centre.dtype), rate)
        self.spread.lerp_(x.std(0).clamp_min(1e-3).to(self.spread.dtype), rate)
        self.observed += 1

    def inputs(self, z: Tensor) -> Tensor:
        """z as the update reads it: each part standardised, then each feature by the running statistics."""
        if not self.parts:
            return z
        # copies: training moves the statistics in place between turns of one backpropagated episode
        return (self.standardise(z) - self.centre.to(z.dtype, copy=True)) / self.spread.to(z.dtype, copy=True)

    def forward(self, z: Tensor, s: Tensor) -> Tensor:
        """z (..., C or (K + 1)·C), s (..., d_s) -> (..., d_s)."""
        x = torch.cat([self.inputs(z), s], dim=-1)
        step = torch.tanh(self.proj(x)) - s
        if self.gate is not None:
            step = torch.sigmoid(self.gate(x)) * step
        return step


def self_step(s: Tensor, z: Tensor, g: SelfUpdate, *, eta: float) -> Tensor:
    """s + eta g(z, s), clamped to [-1, 1] against rounding; s (..., d_s), z (..., C). Differentiable in s, z, g."""
    step: Tensor = g(z.to(s.dtype), s)
    return (s + eta * step).clamp(-1.0, 1.0)


def update_self(state: IdentityState, summary: TurnSummary, g: SelfUpdate, *, eta: float) -> IdentityState:
    """s <- s + eta g(z, s). For eta in (0, 1] this is a convex step towards tanh(.), so s stays in [-1, 1]."""
    if not 0 < eta <= 1:
        raise ValueError(f"eta must be in (0, 1]; got {eta}")
    return replace(state, self_state=self_step(state.self_state, summary.hidden, g, eta=eta))


def welford_step(count: N, mean: N, m2: N, x: N) -> tuple[N, N, N]:
    """One step of Welford's running mean and sum of squared deviations; floats or batched tensors alike."""
    count = count + 1
    delta = x - mean
    mean = mean + delta / count
    return count, mean, m2 + delta * (x - mean)


def update_shock_stats(stats: ShockStats, nll: float) -> ShockStats:
    """Welford's update of the running NLL statistics with one new message."""
    if not math.isfinite(nll):
        raise ValueError(f"nll must be finite; got {nll}")
    count, mean, m2 = welford_step(float(stats.count), stats.mean, stats.m2, nll)
    return ShockStats(count=int(count), mean=mean, m2=m2)


# ---------------------------------------------------------------------------------------------------------
# Maintenance
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CleanupReport:
    ranks: Tensor  # (n_layer, H) retained rank per head
    energy_kept: Tensor  # (n_layer, H) fraction of squared Frobenius norm kept, 1.0 for a zero trace


def distance(a: IdentityState, b: IdentityState) -> tuple[Tensor, float]:
    """How far ``b`` is from ``a``: per trace layer and head ||T_b - T_a||_F (float64, (n_trace, heads)), and
    ||s_b - s_a||."""
    if a.trace.shape != b.trace.shape or a.self_state.shape != b.self_state.shape:
        raise ValueError(f"states of different shapes: {tuple(a.trace.shape)} vs {tuple(b.trace.shape)}")
    trace = torch.linalg.matrix_norm(b.trace.double() - a.trace.double())
    return trace, float(torch.linalg.vector_norm(b.self_state.double() - a.self_state.double()))


def low_rank_cleanup(state: IdentityState, energy: float = 0.95) -> tuple[IdentityState, CleanupReport]:
    """Keep, per layer and head, the fewest singular components of T holding ``energy`` of ||T||_F^2."""
    if not 0 < energy <= 1:
        raise ValueError(f"energy must be in (0, 1]; got {energy}")
    u, sigma, vh = torch.linalg.svd(state.trace.double())  # (..., d, d), (..., d), (..., d, d)
    power = sigma.square()
    total = power.sum(-1, keepdim=True)  # (n_layer, H, 1)
    cumulative = power.cumsum(-1) / total.clamp_min(torch.finfo(torch.float64).tiny)
    # rank = 1 + number of prefixes still short of the target (at most d, since rounding can leave the full
    # sum a hair under 1); a zero trace keeps rank 0
    short = (cumulative < energy).sum(-1)
    ranks = (short + 1).clamp_max(sigma.shape[-1]) * (total.squeeze(-1) > 0)
    keep = torch.arange(sigma.shape[-1]) < ranks.unsqueeze(-1)  # (n_layer, H, d)
    kept_sigma = sigma * keep
    cleaned = (u * kept_sigma.unsqueeze(-2)) @ vh
    kept_power = kept_sigma.square().sum(-1)
    fraction = torch.where(total.squeeze(-1) > 0, kept_power / total.squeeze(-1).clamp_min(1e-300), torch.ones_like(kept_power))
    new_state = replace(state, trace=cleaned.to(state.trace.dtype))
    return new_state, CleanupReport(ranks=ranks, energy_kept=fraction.float())


# ---------------------------------------------------------------------------------------------------------
# Serialisation: safetensors only, validated on load
# ---------------------------------------------------------------------------------------------------------

_KEYS = {"trace", "self_state", "counters", "shock", "format_version"}
_IMPRINT_KEYS = {f"imprint.{name}" for name in Imprint.blank(0, 0, 0, 0).tensors()}


def state_to_bytes(state: IdentityState) -> bytes:
    """Serialise with safetensors (no pickle). Counters travel as small tensors so they are validated too; the
    imprint's fields under ``imprint.<name>`` when there is one."""
    tensors = {
        "trace": state.trace.contiguous(),
        "self_state": state.self_state.contiguous(),
        "counters": torch.tensor([state.turns, state.shock.count], dtype=torch.int64),
        "shock": torch.tensor([state.shock.mean, state.shock.m2], dtype=torch.float64),
        "format_version": torch.tensor([FORMAT_VERSION], dtype=torch.int64),
    }
    if state.imprint is not None:
        tensors.update({f"imprint.{name}": t.contiguous() for name, t in state.imprint.tensors().items()})
    return st_save(tensors)


def state_from_bytes(blob: bytes, config: AnyConfig, *, max_bytes: int = MAX_STATE_BYTES) -> IdentityState:
    """Parse and validate a blob from ``state_to_bytes``; raise StateFormatError naming what is wrong. An imprint
    stored under another imprint size or precision of the same backbone is checked, then refitted to ``config``'s
    (sia.identity.imprint.fitted)."""
    if not isinstance(blob, bytes | bytearray | memoryview):
        raise StateFormatError(f"state blob must be bytes; got {type(blob).__name__}")
    if len(blob) > max_bytes:
        raise StateFormatError(f"state blob is {len(blob)} bytes; the limit is {max_bytes}")
    try:
        tensors = st_load(bytes(blob))
    except (SafetensorError, ValueError, RuntimeError) as exc:
        raise StateFormatError(f"state blob is not valid safetensors data: {exc}") from exc
    imprinted = set(tensors) >= _IMPRINT_KEYS
    expected = _KEYS | _IMPRINT_KEYS if imprinted else _KEYS
    missing, extra = expected - set(tensors), set(tensors) - expected
    if missing or extra:
        raise StateFormatError(f"state blob keys are wrong: missing {sorted(missing)}, unexpected {sorted(extra)}")
    for name, shape, dtype in (
        ("counters", (2,), torch.int64),
        ("shock", (2,), torch.float64),
        ("format_version", (1,), torch.int64),
    ):
        t = tensors[name]
        if tuple(t.shape) != shape or t.dtype != dtype:
            raise StateFormatError(f"{name} must be {dtype} of shape {shape}; got {t.dtype} {tuple(t.shape)}")
    version = int(tensors["format_version"][0])
    if version not in READABLE_VERSIONS or (imprinted and version < 2):
        raise StateFormatError(f"format version {version} is not supported (expected one of {READABLE_VERSIONS})")
    turns, count = (int(x) for x in tensors["counters"])
    mean, m2 = (float(x) for x in tensors["shock"])
    imprint = Imprint(**{name[len("imprint.") :]: tensors[name] for name in _IMPRINT_KEYS}) if imprinted else None
    state = IdentityState(
        trace=tensors["trace"],
        self_state=tensors["self_state"],
        turns=turns,
        shock=ShockStats(count=count, mean=mean, m2=m2),
        imprint=None if imprint is None else fitted(imprint, config),
    )
    state.validate(config)
    return state


# ---------------------------------------------------------------------------------------------------------
# One turn's evolution of the whole state
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Dynamics:
    """Per-persona rates of the update rules (defaults from the model config)."""

    alpha: float
    decay: float
    eta: float

    def __post_init__(self) -> None:
        if not (math.isfinite(self.alpha) and self.alpha >= 0):
            raise ValueError(f"alpha must be finite and >= 0; got {self.alpha}")
        if not 0 < self.decay <= 1:
            raise ValueError(f"decay must be in (0, 1]; got {self.decay}")
        if not 0 < self.eta <= 1:
            raise ValueError(f"eta must be in (0, 1]; got {self.eta}")

    @classmethod
    def from_config(cls, config: AnyConfig) -> Dynamics:
        return cls(alpha=config.alpha, decay=config.decay, eta=config.eta)


def advance(
    state: IdentityState, summary: TurnSummary, *, shock: float, nll: float, g: SelfUpdate, dynamics: Dynamics
) -> IdentityState:
    """The whole post-turn update: trace, self state, shock statistics, turn counter."""
    state = update_trace(state, summary, shock, alpha=dynamics.alpha, decay=dynamics.decay)
    state = update_self(state, summary, g, eta=dynamics.eta)
    return replace(state, shock=update_shock_stats(state.shock, nll), turns=state.turns + 1)
