from __future__ import annotations

import json
from pathlib import Path

import pytest

from sia.model.config import LlamaConfig, ModelConfig


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


@pytest.mark.parametrize("cls", [ModelConfig, LlamaConfig])
def test_a_removed_option_is_read_from_an_old_config_only_as_the_behaviour_that_remains(
    cls: type[ModelConfig] | type[LlamaConfig], tmp_path: Path
) -> None:
    """An old checkpoint's config may carry ``"fresh_write": false`` (the write after the reply, the one that
    remains): it loads as if the key were absent. ``true`` asked for the removed option: a clear error."""
    c = cls(d_self=8)
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**c.to_dict(), "fresh_write": False}))
    assert cls.from_file(path) == c
    assert "fresh_write" not in c.to_dict()
    for value in (True, 1, "false"):
        with pytest.raises(ValueError, match="the fresh_write option was removed"):
            cls.from_dict({**c.to_dict(), "fresh_write": value})


def test_a_removed_option_given_over_a_base_config_is_refused_unless_it_asks_for_what_remains() -> None:
    hf = {
        "vocab_size": 300,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "hidden_size": 32,
        "intermediate_size": 64,
    }
    assert LlamaConfig.from_hf(hf, d_self=8, fresh_write=False) == LlamaConfig.from_hf(hf, d_self=8)
    with pytest.raises(ValueError, match="the fresh_write option was removed"):
        LlamaConfig.from_hf(hf, d_self=8, fresh_write=True)


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"imprint_tokens": 8, "imprint_bits": 2}, "imprint_bits must be 8 or 4"),
        ({"imprint_tokens": 8, "imprint_bits": True}, "imprint_bits must be 8 or 4"),
        ({"imprint_tokens": -1}, "imprint_tokens must be an integer >= 0"),
        ({"imprint_tokens": 8, "imprint_copy": -1.0}, "imprint_copy must be a finite number >= 0"),
        ({"imprint_tokens": 8, "imprint_copy": float("nan")}, "imprint_copy must be a finite number >= 0"),
        ({"imprint_copy": 2.0}, "imprint_copy needs an imprint"),
        ({"imprint_tokens": 8, "imprint_copy_layers": [99]}, "imprint_copy_layers must be distinct layer indices"),
        ({"imprint_tokens": 8, "imprint_copy_layers": [1, 1]}, "imprint_copy_layers must be distinct layer indices"),
        ({"imprint_tokens": 8, "imprint_copy_layers": []}, "imprint_copy_layers must be distinct layer indices"),
        ({"imprint_tokens": 8, "imprint_copy_heads": []}, "imprint_copy_heads must be distinct"),
        ({"imprint_tokens": 8, "imprint_copy_heads": [[1, 99]]}, "imprint_copy_heads must be distinct"),
        ({"imprint_tokens": 8, "imprint_copy_heads": [[1, 0], [1, 0]]}, "imprint_copy_heads must be distinct"),
        ({"imprint_tokens": 8, "imprint_copy_heads": [[1, True]]}, "imprint_copy_heads must be distinct"),
        ({"imprint_tokens": 8, "imprint_copy_heads": [3]}, "imprint_copy_heads must be distinct"),
        (
            {"imprint_tokens": 8, "imprint_copy_heads": [[1, 0]], "imprint_copy_layers": [1, 2]},
            "are not imprint_copy_heads' layers",
        ),
    ],
)
def test_bad_imprint_settings_raise(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        LlamaConfig(**kwargs)  # type: ignore[arg-type]


def test_the_copy_read_points_with_the_last_third_of_the_layers_by_default() -> None:
    assert LlamaConfig(n_layer=30, imprint_tokens=8).imprint_copy_layers == list(range(20, 30))
    assert LlamaConfig(n_layer=4, imprint_tokens=8, imprint_copy_layers=[3, 1]).imprint_copy_layers == [1, 3]
    named = LlamaConfig(n_layer=4, imprint_tokens=8, imprint_copy_heads=[[3, 2], [1, 0], [3, 0]])
    assert named.imprint_copy_layers == [1, 3] and named.copy_heads(3) == [0, 2] and named.copy_heads(1) == [0]
    assert LlamaConfig(n_layer=4, imprint_tokens=8).copy_heads(3) is None
