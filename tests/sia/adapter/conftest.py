"""What the adapter's tests share: a tiny LLaMA GGUF base (dequantised once per module), a training config of two
rows of one- or two-turn episodes, the models ``train`` builds, and slot values opened so the state is read."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from sia.backbones.llama import LlamaModel
from sia.learn.adapter import train as adapter_train
from sia.learn.adapter.config import TrainConfig
from sia.learn.adapter.trainable import build_model
from tests.sia.conftest import TinyVocab, write_tiny_gguf

# the fact episodes in bytes need more than the tiny base's 256 positions
ADAPTER = {"d_self": 8, "memory_tokens": 2, "write_gate": True, "eta": 1.0, "trace_layers": [1], "block_size": 2048}


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    """One torch thread, as the configs here ask of train(), which sets it; given back afterwards."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory, tiny_vocab: TinyVocab) -> Path:
    """A tiny LLaMA GGUF, its dequantised copy cached beside it in models/ once for this module."""
    return write_tiny_gguf(tmp_path_factory.mktemp("learn") / "tiny.gguf", tiny_vocab).path


@pytest.fixture
def cache(base: Path) -> Path:
    return base.parent / "models"


@pytest.fixture
def config(base: Path, tmp_path: Path) -> TrainConfig:
    """Two rows of one- or two-turn episodes; lr = min_lr and no warm-up, so the learning rate is one constant. No
    write stage, one question an episode, a distillation every 4th step, the read at lr and the read-out standardised
    per call: what the tests here were written against (the recipe's defaults differ)."""
    return TrainConfig(
        base=str(base),
        model=dict(ADAPTER),
        out_dir=str(tmp_path / "run"),
        batch_size=2,
        steps=4,
        lr=1e-2,
        read_lr=None,
        min_lr=1e-2,
        warmup_steps=0,
        write_stage_steps=0,
        curriculum=[[0, 1]],
        probes_per_episode=1,
        distill_every=4,
        readout_momentum=None,
        eval_every=1000,
        eval_episodes=2,
        eval_between=1,
        checkpoint_every=1000,
        threads=1,
        precision="fp32",
    )


@pytest.fixture
def built(monkeypatch: pytest.MonkeyPatch) -> list[LlamaModel]:
    """Every model ``train`` builds, in order (the trained weights, to compare runs)."""
    models: list[LlamaModel] = []

    def keep(*args: Any, **kwargs: Any) -> Any:
        model, ref = build_model(*args, **kwargs)
        models.append(model)
        return model, ref

    monkeypatch.setattr(adapter_train, "build_model", keep)
    return models


def open_read(model: LlamaModel, seed: int) -> None:
    """Nonzero slot values (they start at zero), so the self state changes what the model reads."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for attn in model.attentions:
            attn.self_value.weight.copy_(torch.randn(attn.self_value.weight.shape, generator=generator) * 0.3)
