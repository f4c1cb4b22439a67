"""Shared fixtures: tiny model configs, random identity states, and the real PostgreSQL.

PostgreSQL tests use the server named by SIA_TEST_POSTGRES_URL (.ci/run sets it to the local server); each
test gets a database of its own, dropped afterwards. Without a reachable server those tests skip, saying why.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from sia.checkpoint import save_checkpoint
from sia.identity.state import IdentityState
from sia.model.config import ModelConfig
from sia.model.native import SIAModel


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


def tiny_model() -> SIAModel:
    torch.manual_seed(0)
    return sharpen(SIAModel(tiny_config(block_size=256)).eval())


@pytest.fixture
def checkpoint_dir(tmp_path: Path) -> Path:
    """The tiny model saved as a checkpoint, for subprocesses."""
    return save_checkpoint(tiny_model(), tmp_path / "checkpoint")


POSTGRES_ENV = "SIA_TEST_POSTGRES_URL"


def _postgres_admin_url() -> str:
    url = os.environ.get(POSTGRES_ENV)
    if not url:
        pytest.skip(f"{POSTGRES_ENV} is not set; set it to a PostgreSQL server URL to run the PostgreSQL tests")
    return url


@pytest.fixture
def postgres_url() -> Iterator[str]:
    """A fresh, empty PostgreSQL database for one test."""
    admin_url = make_url(_postgres_admin_url()).set(drivername="postgresql+psycopg")
    name = f"sia_test_{uuid.uuid4().hex[:12]}"
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
    except Exception as exc:  # no server reachable: the PostgreSQL half of the suite cannot run here
        admin.dispose()
        pytest.skip(f"PostgreSQL at {admin_url.render_as_string(hide_password=True)} is not usable: {exc}")
    try:
        yield admin_url.set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()
