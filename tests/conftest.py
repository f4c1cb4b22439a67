from __future__ import annotations

import pytest
import torch

from sia.config import ModelConfig
from sia.identity import IdentityState
from sia.model import SIAModel


def tiny_config(**overrides: object) -> ModelConfig:
    base: dict[str, object] = dict(n_layer=2, n_head=2, n_embd=32, d_self=4, block_size=128)
    base.update(overrides)
    return ModelConfig(**base)  # type: ignore[arg-type]


@pytest.fixture
def config() -> ModelConfig:
    return tiny_config()


@pytest.fixture
def model(config: ModelConfig) -> SIAModel:
    torch.manual_seed(0)
    return SIAModel(config).eval()


def random_state(config: ModelConfig, seed: int, scale: float = 1.0) -> IdentityState:
    """A non-trivial identity: a random non-symmetric trace and a random self state in [-1, 1]."""
    g = torch.Generator().manual_seed(seed)
    d = config.qk_dim
    trace = scale * torch.randn(config.n_layer, config.n_head, d, d, generator=g)
    self_state = torch.rand(config.d_self, generator=g) * 2 - 1
    return IdentityState(trace=trace, self_state=self_state, turns=3)


def sharpen(model: SIAModel) -> SIAModel:
    """Scale an untrained model's attention and self-slot maps up to trained-like magnitudes, in place.

    At the 0.02-std init attention is nearly uniform and logits nearly flat, so no state can move a sampled
    token; after this the identity state visibly matters, as it does in a trained model.
    """
    with torch.no_grad():
        for attn in model.attentions:
            attn.q_proj.weight.mul_(20)
            attn.k_proj.weight.mul_(20)
            attn.self_key.weight.mul_(50)
            attn.self_value.weight.mul_(50)
        model.wte.weight.mul_(10)
    return model
