"""Soak: ten thousand turns on one identity with random shocks; the state stays finite and in its bounds."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from server.core.config import Settings
from server.db import migrate
from server.runtime.services import Services
from server.store import Store
from sia.checkpoint import NATIVE_CHECKPOINT, load_checkpoint
from sia.identity.shock import standardised_shock
from sia.identity.state import Dynamics, IdentityState, TurnSummary, advance, stabilised_metric, state_from_bytes, state_to_bytes
from sia.model.config import ModelConfig
from sia.model.generate import Sampling
from sia.model.native import SIAModel

TURNS = 150  # real turns (the 10 000-turn soak drives the update rules directly)


@pytest.fixture(scope="module")
def bundled() -> SIAModel:
    return load_checkpoint(NATIVE_CHECKPOINT)


def _check_bounds(state: IdentityState, bound_t: float, config: ModelConfig) -> None:
    """Finite; s in [-1, 1]; ||T||_F within the geometric bound; metric eigenvalues in c [1 - rho, 1 + rho]."""
    c, rho = config.metric_base, config.metric_max_deform
    assert bool(torch.isfinite(state.trace).all()) and bool(torch.isfinite(state.self_state).all())
    assert float(state.self_state.abs().max()) <= 1.0
    assert float(state.trace.norm(dim=(-2, -1)).max()) <= bound_t * (1 + 1e-4) + 1e-6
    eig = torch.linalg.eigvalsh(stabilised_metric(state.trace, config).double())
    assert float(eig.min()) >= c * (1 - rho) - 1e-6 and float(eig.max()) <= c * (1 + rho) + 1e-6


@pytest.mark.slow
def test_ten_thousand_turns_of_the_bundled_model_state_stay_bounded(bundled: SIAModel) -> None:
    """The bundled model's state shape and learned self update, 10 000 turns, heavy-tailed surprise."""
    model = bundled
    config = model.config
    dynamics = Dynamics.from_config(config)
    g = torch.Generator().manual_seed(0)
    rng = random.Random(0)
    state = IdentityState.fresh(config)
    shape = (config.n_layer, config.n_head, config.qk_dim)
    bound_t = 0.0
    with torch.no_grad():
        for turn in range(10_000):
            summary = TurnSummary(
                queries=torch.nn.functional.normalize(torch.randn(*shape, generator=g), dim=-1),
                keys=torch.nn.functional.normalize(torch.randn(*shape, generator=g), dim=-1),
                hidden=torch.randn(config.n_embd, generator=g) * rng.choice([0.1, 1.0, 30.0]),
            )
            # most messages ordinary, some wildly surprising, some from a user who always writes oddly
            nll = rng.choice([2.0 + rng.gauss(0, 0.3), rng.uniform(0, 40), 9.0 + rng.gauss(0, 0.1)])
            shock = standardised_shock(nll, state.shock, config)
            assert abs(shock) <= config.shock_clip
            state = advance(state, summary, shock=shock, nll=nll, g=model.self_update, dynamics=dynamics)
            bound_t = dynamics.decay * bound_t + dynamics.alpha
            if turn % 500 == 0 or turn == 9_999:
                _check_bounds(state, bound_t, config)
    assert state.turns == 10_000 and state.shock.count == 10_000
    again = state_from_bytes(state_to_bytes(state), config)  # and it still serialises and validates
    assert torch.equal(again.trace, state.trace) and torch.equal(again.self_state, state.self_state)


@pytest.mark.slow
def test_real_turns_through_the_runtime_stay_bounded(bundled: SIAModel, tmp_path: Path) -> None:
    """Real turns with the bundled model through the store: ordinary, hostile and noise messages."""
    settings = Settings(data_dir=tmp_path)
    migrate.upgrade(settings)
    store = Store(settings)
    services = Services.over(bundled, store)
    services.personas.ensure_defaults()
    rng = random.Random(1)
    messages = ["Hi there!", "My favourite colour is green.", "I HATE YOU!!!", "What's my name?", "tell me about cats"]
    config = services.identities.config
    bound_t = 0.0
    alpha, decay = config.alpha, config.decay
    for i in range(TURNS):
        message = rng.choice(messages) if rng.random() < 0.8 else "".join(chr(rng.randint(33, 0x2FFF)) for _ in range(40))
        out = services.turns.turn("sia", "soak", message, Sampling(max_tokens=8, temperature=1.0, seed=i))
        assert out.turn == i and abs(out.shock) <= config.shock_clip
        bound_t = decay * bound_t + alpha
    _, state = services.identities.state("sia", "soak")
    _check_bounds(state, bound_t, config)
    assert services.store.get_identity("sia", "soak").turn_count == TURNS
    store.close()
