from __future__ import annotations

from pathlib import Path

import pytest

from sia.model.config import ModelConfig


def test_derived_values() -> None:
    c = ModelConfig(n_embd=128, n_head=4)
    assert (c.head_dim, c.qk_dim) == (32, 31)
    assert c.metric_base == pytest.approx(1 / (2 * 31**0.5))


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"n_embd": 130, "n_head": 4}, "divisible"),
        ({"n_layer": 0}, "n_layer must be a positive integer"),
        ({"n_embd": 4, "n_head": 4}, "at least 2"),
        ({"decay": 0.0}, "decay"),
        ({"decay": 1.1}, "decay"),
        ({"eta": 0.0}, "eta"),
        ({"alpha": -1.0}, "alpha"),
        ({"metric_max_deform": 1.0}, "metric_max_deform"),
        ({"metric_temperature": 0.0}, "metric_temperature"),
        ({"shock_prior_std": 0.0}, "shock_prior_std"),
        ({"dropout": 1.0}, "dropout"),
    ],
)
def test_bad_values_raise(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ModelConfig(**kwargs)  # type: ignore[arg-type]


def test_file_round_trip(tmp_path: Path) -> None:
    c = ModelConfig(n_layer=3, alpha=0.25, metric_max_deform=0.3)
    c.to_file(tmp_path / "c.json")
    assert ModelConfig.from_file(tmp_path / "c.json") == c
    (tmp_path / "bad.json").write_text('{"n_layer": 2, "width": 3}')
    with pytest.raises(ValueError, match="unknown config keys"):
        ModelConfig.from_file(tmp_path / "bad.json")
    (tmp_path / "junk.json").write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        ModelConfig.from_file(tmp_path / "junk.json")
