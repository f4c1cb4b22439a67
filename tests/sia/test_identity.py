from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sia.identity.state import (
    Dynamics,
    IdentityState,
    SelfUpdate,
    ShockStats,
    StateFormatError,
    TurnSummary,
    advance,
    distance,
    low_rank_cleanup,
    stabilised_metric,
    state_from_bytes,
    state_to_bytes,
    update_self,
    update_shock_stats,
    update_trace,
)
from sia.model.config import ModelConfig
from tests.conftest import random_state, tiny_config


def _summary(config: ModelConfig, seed: int) -> TurnSummary:
    g = torch.Generator().manual_seed(seed)
    shape = (config.n_layer, config.n_head, config.qk_dim)
    q = torch.nn.functional.normalize(torch.randn(*shape, generator=g), dim=-1)
    k = torch.nn.functional.normalize(torch.randn(*shape, generator=g), dim=-1)
    return TurnSummary(queries=q, keys=k, hidden=torch.randn(config.n_embd, generator=g))


def test_fresh_state_shapes(config: ModelConfig) -> None:
    state = IdentityState.fresh(config)
    assert state.trace.shape == (2, 2, 15, 15) and state.trace.dtype == torch.float32
    assert state.self_state.shape == (4,) and state.turns == 0 and state.shock == ShockStats()
    state.validate(config)
    with pytest.raises(StateFormatError, match="initial_trace has shape"):
        IdentityState.fresh(config, initial_trace=torch.zeros(2, 2, 3, 3))


def test_trace_update_is_the_rule(config: ModelConfig) -> None:
    state = random_state(config, 0)
    summary = _summary(config, 1)
    new = update_trace(state, summary, shock=-1.3, alpha=0.2, decay=0.9)
    l, h = 1, 0
    expected = 0.9 * state.trace[l, h] + 0.2 * math.tanh(1.3) * torch.outer(summary.keys[l, h], summary.queries[l, h])
    torch.testing.assert_close(new.trace[l, h], expected)
    assert new is not state and not torch.equal(new.trace, state.trace)
    torch.testing.assert_close(state.trace, random_state(config, 0).trace)  # input untouched
    # zero shock imprints nothing: only decay acts
    torch.testing.assert_close(update_trace(state, summary, 0.0, alpha=0.2, decay=0.9).trace, 0.9 * state.trace)
    with pytest.raises(ValueError, match="finite"):
        update_trace(state, summary, float("nan"), alpha=0.2, decay=0.9)


def test_metric_spectrum_is_bounded(config: ModelConfig) -> None:
    c, rho = config.metric_base, config.metric_max_deform
    for scale in (0.0, 0.1, 10.0, 1e6):
        metric = stabilised_metric(random_state(config, 3, scale).trace, config)
        torch.testing.assert_close(metric, metric.transpose(-1, -2))
        eig = torch.linalg.eigvalsh(metric.double())
        assert eig.min() >= c * (1 - rho) - 1e-6 and eig.max() <= c * (1 + rho) + 1e-6
    identity = stabilised_metric(torch.zeros(1, 4, 4), config)
    torch.testing.assert_close(identity[0], c * torch.eye(4))
    # a large positive direction saturates at c (1 + rho)
    big = torch.diag(torch.tensor([100.0, 0.0, 0.0, 0.0])).unsqueeze(0)
    assert stabilised_metric(big, config)[0, 0, 0].item() == pytest.approx(c * (1 + rho), rel=1e-5)


@settings(max_examples=5, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    alpha=st.floats(0.0, 5.0),
    decay=st.floats(0.5, 1.0),
    shock_scale=st.sampled_from([0.1, 3.0, 1e4]),
)
def test_a_thousand_random_turns_stay_bounded(seed: int, alpha: float, decay: float, shock_scale: float) -> None:
    """Drive 1 000 turns with random summaries and shocks; logits stay finite, spectra stay in bounds."""
    config = tiny_config(n_layer=1, n_head=2, n_embd=16)  # d = 7
    c, rho = config.metric_base, config.metric_max_deform
    g = torch.Generator().manual_seed(seed)
    state = IdentityState.fresh(config)
    d = config.qk_dim
    q = torch.randn(2, 8, d, generator=g)  # probe queries/keys for the logits check
    k = torch.randn(2, 8, d, generator=g)
    bound_t = 0.0  # ||T||_F <= decay^t ||T_0|| + alpha sum decay^i  since ||K ⊗ Q||_F = 1
    for turn in range(1000):
        keys = torch.nn.functional.normalize(torch.randn(1, 2, d, generator=g), dim=-1)
        queries = torch.nn.functional.normalize(torch.randn(1, 2, d, generator=g), dim=-1)
        shock = float(torch.randn((), generator=g)) * shock_scale
        state = update_trace(state, TurnSummary(queries, keys, torch.zeros(16)), shock, alpha=alpha, decay=decay)
        bound_t = decay * bound_t + alpha
        assert state.trace.norm(dim=(-2, -1)).max() <= bound_t * (1 + 1e-5) + 1e-6
        if turn % 50 == 0 or turn == 999:
            metric = stabilised_metric(state.trace, config)[0]  # (H, d, d)
            eig = torch.linalg.eigvalsh(metric.double())
            assert eig.min() >= c * (1 - rho) - 1e-6 and eig.max() <= c * (1 + rho) + 1e-6
            diff = q.unsqueeze(2) - k.unsqueeze(1)  # (H, 8, 8, d)
            logits = -torch.einsum("hijd,hde,hije->hij", diff, metric, diff)
            assert bool(torch.isfinite(logits).all())
            assert logits.max() <= 1e-6
            assert (logits >= -c * (1 + rho) * diff.square().sum(-1) * (1 + 1e-5)).all()


def test_self_update_is_bounded_and_follows_the_rule(config: ModelConfig) -> None:
    torch.manual_seed(0)
    g = SelfUpdate(config)
    torch.nn.init.normal_(g.proj.weight, std=10.0)  # saturate tanh
    state = random_state(config, 0)
    for seed in range(50):
        summary = _summary(config, seed)
        new = update_self(state, summary, g, eta=0.7)
        expected = state.self_state + 0.7 * (torch.tanh(g.proj(torch.cat([summary.hidden, state.self_state]))) - state.self_state)
        torch.testing.assert_close(new.self_state, expected.clamp(-1, 1))
        assert new.self_state.abs().max() <= 1.0
        state = new
    assert state.self_state.norm() <= math.sqrt(config.d_self)
    with pytest.raises(ValueError, match="eta"):
        update_self(state, _summary(config, 0), g, eta=1.5)


def test_shock_statistics_match_numpy() -> None:
    values = [2.0, 3.5, 1.0, 4.25, 2.75]
    stats = ShockStats()
    for v in values:
        stats = update_shock_stats(stats, v)
    t = torch.tensor(values, dtype=torch.float64)
    assert stats.count == 5
    assert stats.mean == pytest.approx(t.mean().item())
    assert stats.m2 / stats.count == pytest.approx(t.var(unbiased=False).item())


def test_advance_updates_everything(config: ModelConfig, model: torch.nn.Module) -> None:
    state = IdentityState.fresh(config)
    new = advance(state, _summary(config, 0), shock=2.0, nll=3.0, g=model.self_update, dynamics=Dynamics.from_config(config))  # type: ignore[arg-type]
    assert new.turns == 1 and new.shock.count == 1 and new.shock.mean == 3.0
    assert new.trace.abs().max() > 0 and new.self_state.abs().max() > 0
    assert state.turns == 0 and state.trace.abs().max() == 0
    with pytest.raises(ValueError, match="decay"):
        Dynamics(alpha=0.1, decay=1.5, eta=0.5)


def test_low_rank_cleanup_keeps_the_energy(config: ModelConfig) -> None:
    g = torch.Generator().manual_seed(0)
    d = config.qk_dim
    u = torch.randn(2, 2, d, 2, generator=g)
    w = torch.randn(2, 2, 2, d, generator=g)
    trace = 5 * (u @ w) + 1e-3 * torch.randn(2, 2, d, d, generator=g)  # rank 2 + small noise
    trace[1, 1] = 0.0  # a zero head keeps rank 0
    state = IdentityState(trace=trace, self_state=torch.zeros(config.d_self))
    cleaned, report = low_rank_cleanup(state, energy=0.95)
    assert report.ranks.tolist() == [[2, 2], [2, 0]]
    assert bool((report.energy_kept >= 0.95).all())
    assert (cleaned.trace - trace).norm() / trace.norm() < 1e-3
    torch.testing.assert_close(torch.linalg.matrix_rank(cleaned.trace[0, 0]), torch.tensor(2))
    full, report_full = low_rank_cleanup(state, energy=1.0)
    torch.testing.assert_close(full.trace, trace, atol=1e-5, rtol=0)
    assert report_full.ranks[0, 0] == d
    _, report_one = low_rank_cleanup(state, energy=0.3)
    assert report_one.ranks[0, 0] == 1
    with pytest.raises(ValueError, match="energy"):
        low_rank_cleanup(state, energy=0.0)


def test_serialisation_round_trip_is_bit_exact(config: ModelConfig) -> None:
    state = random_state(config, 5)
    state = IdentityState(state.trace, state.self_state, turns=7, shock=ShockStats(7, 2.123456789, 0.5))
    back = state_from_bytes(state_to_bytes(state), config)
    assert torch.equal(back.trace, state.trace) and torch.equal(back.self_state, state.self_state)
    assert back.turns == 7 and back.shock == state.shock and back.format_version == 2


def _blob(config: ModelConfig, **tensors: torch.Tensor) -> bytes:
    from safetensors.torch import save

    base = {
        "trace": torch.zeros(config.n_layer, config.n_head, config.qk_dim, config.qk_dim),
        "self_state": torch.zeros(config.d_self),
        "counters": torch.tensor([0, 0]),
        "shock": torch.tensor([0.0, 0.0], dtype=torch.float64),
        "format_version": torch.tensor([1]),
    }
    base.update(tensors)
    return save({k: v for k, v in base.items() if v.numel() >= 0 and k != "drop"})


@pytest.mark.parametrize(
    "make,message",
    [
        (lambda c: b"not a safetensors blob", "not valid safetensors"),
        (lambda c: state_to_bytes(IdentityState.fresh(c))[:-7], "not valid safetensors"),
        (lambda c: _blob(c, trace=torch.full((2, 2, 15, 15), float("nan"))), "NaN"),
        (lambda c: _blob(c, trace=torch.zeros(2, 2, 14, 14)), "trace has shape"),
        (lambda c: _blob(c, trace=torch.zeros(2, 2, 15, 15, dtype=torch.float64)), "dtype"),
        (lambda c: _blob(c, self_state=torch.full((4,), 2.0)), r"\[-1, 1\]"),
        (lambda c: _blob(c, format_version=torch.tensor([3])), "format version 3"),
        (lambda c: _blob(c, extra=torch.zeros(1)), "unexpected"),
        (lambda c: _blob(c, counters=torch.tensor([-1, 0])), "turns must be"),
        (lambda c: _blob(c, counters=torch.tensor([0.0, 0.0])), "counters must be"),
    ],
)
def test_bad_blobs_raise_clear_errors(config: ModelConfig, make, message: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(StateFormatError, match=message):
        state_from_bytes(make(config), config)


def test_missing_key_and_size_cap(config: ModelConfig) -> None:
    from safetensors.torch import save

    with pytest.raises(StateFormatError, match="missing"):
        state_from_bytes(save({"trace": torch.zeros(2, 2, 15, 15)}), config)
    blob = state_to_bytes(IdentityState.fresh(config))
    with pytest.raises(StateFormatError, match="limit"):
        state_from_bytes(blob, config, max_bytes=len(blob) - 1)
    with pytest.raises(StateFormatError, match="must be bytes"):
        state_from_bytes("text", config)  # type: ignore[arg-type]
    # a blob for another model shape is refused, not silently reshaped
    other = tiny_config(n_layer=3)
    with pytest.raises(StateFormatError, match="trace has shape"):
        state_from_bytes(state_to_bytes(IdentityState.fresh(other)), config)


def test_distance_between_states(config: ModelConfig) -> None:
    a, b = random_state(config, 0), random_state(config, 1)
    trace, self_norm = distance(a, b)
    assert trace.shape == a.trace.shape[:2] and trace.dtype == torch.float64
    assert float(trace[1, 0]) == pytest.approx(float((b.trace[1, 0].double() - a.trace[1, 0].double()).pow(2).sum().sqrt()))
    assert self_norm == pytest.approx(float((b.self_state.double() - a.self_state.double()).norm())) and self_norm > 0
    same_trace, same_self = distance(a, a)
    assert same_trace.abs().max() == 0 and same_self == 0
    other = IdentityState.fresh(tiny_config(n_layer=config.n_layer + 1))
    with pytest.raises(ValueError, match="different shapes"):
        distance(a, other)
