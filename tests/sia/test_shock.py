from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from sia.identity.shock import message_nll, pooled_moments, standardised_shock
from sia.identity.state import ShockStats, update_shock_stats
from sia.model.config import ModelConfig


def test_message_nll_is_the_masked_mean_cross_entropy() -> None:
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 5, 11, generator=g)
    targets = torch.randint(0, 11, (2, 5), generator=g)
    mask = torch.tensor([[0, 1, 1, 0, 1], [1, 1, 1, 1, 1]], dtype=torch.bool)
    nll = message_nll(logits, targets, mask)
    manual0 = F.cross_entropy(logits[0, [1, 2, 4]], targets[0, [1, 2, 4]])
    torch.testing.assert_close(nll[0], manual0)
    torch.testing.assert_close(nll[1], F.cross_entropy(logits[1], targets[1]))
    with pytest.raises(ValueError, match="at least one message token"):
        message_nll(logits, targets, torch.zeros(2, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match="disagree"):
        message_nll(logits, targets[:, :4], mask)


def test_first_turn_is_measured_against_the_prior() -> None:
    config = ModelConfig(shock_prior_mean=2.0, shock_prior_std=0.5)
    assert standardised_shock(3.0, ShockStats(), config) == pytest.approx(2.0)
    assert standardised_shock(2.0, ShockStats(), config) == pytest.approx(0.0)
    assert pooled_moments(ShockStats(), config) == pytest.approx((2.0, 0.5))


def test_pooled_moments_equal_the_moments_of_prior_and_data() -> None:
    """With prior weight n0 the pooled moments equal those of the data plus n0 pseudo-samples at mu0 +- sigma0."""
    config = ModelConfig(shock_prior_mean=1.0, shock_prior_std=0.5, shock_prior_weight=2.0)
    data = [2.0, 3.0, 2.5, 4.0]
    stats = ShockStats()
    for x in data:
        stats = update_shock_stats(stats, x)
    pseudo = torch.tensor([0.5, 1.5, *data], dtype=torch.float64)  # mean 1, std 0.5 for the prior pair
    mean, std = pooled_moments(stats, config)
    assert mean == pytest.approx(pseudo.mean().item())
    assert std == pytest.approx(pseudo.std(unbiased=False).item())


def test_a_user_who_always_writes_oddly_stops_shocking() -> None:
    config = ModelConfig()
    stats = ShockStats()
    shocks = []
    for _ in range(200):
        shocks.append(standardised_shock(6.0, stats, config))
        stats = update_shock_stats(stats, 6.0)
    assert shocks[0] == pytest.approx(4.0)  # (6 - 2) / 1 against the prior
    assert abs(shocks[-1]) < 0.2 and abs(shocks[-1]) < abs(shocks[5]) < abs(shocks[0])
    # and a normal message is now the surprising one
    assert standardised_shock(2.0, stats, config) < -1.0


def test_shock_is_clipped_and_validated() -> None:
    config = ModelConfig(shock_clip=3.0)
    assert standardised_shock(1e9, ShockStats(), config) == 3.0
    assert standardised_shock(-1e9, ShockStats(), config) == -3.0
    with pytest.raises(ValueError, match="finite"):
        standardised_shock(math.nan, ShockStats(), config)
