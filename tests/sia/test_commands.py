from __future__ import annotations

from pathlib import Path

import pytest
import torch

from sia.checkpoint import save_checkpoint
from sia.commands import build_parser, main, natural_options, sampling_choices
from sia.identity.state import state_from_bytes
from sia.model.native import SIAModel


@pytest.fixture
def checkpoint(model: SIAModel, tmp_path: Path) -> Path:
    return save_checkpoint(model, tmp_path / "ckpt")


def test_generate_keeps_the_identity_in_a_file(
    checkpoint: Path, model: SIAModel, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state_file = tmp_path / "me.safetensors"
    args = ["generate", "--checkpoint", str(checkpoint), "--state", str(state_file), "--max-tokens", "8", "--seed", "1"]
    assert main([*args[:1], "Hello", *args[1:]]) == 0
    first = state_from_bytes(state_file.read_bytes(), model.config)
    assert first.turns == 1
    assert main([*args[:1], "Again", *args[1:]]) == 0
    second = state_from_bytes(state_file.read_bytes(), model.config)
    assert second.turns == 2 and not torch.equal(first.trace, second.trace)
    assert capsys.readouterr().out.count("\n") >= 2


def test_chat_reads_turns_from_stdin(checkpoint: Path, model: SIAModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    state_file = tmp_path / "chat.safetensors"
    monkeypatch.setattr("sys.stdin", io.StringIO("first\nsecond\n\nignored\n"))
    assert main(["chat", "--checkpoint", str(checkpoint), "--state", str(state_file), "--max-tokens", "4"]) == 0
    assert state_from_bytes(state_file.read_bytes(), model.config).turns == 2


def test_a_corrupt_state_file_is_an_error_and_left_alone(checkpoint: Path, tmp_path: Path) -> None:
    state_file = tmp_path / "bad.safetensors"
    state_file.write_bytes(b"garbage")
    assert main(["generate", "hi", "--checkpoint", str(checkpoint), "--state", str(state_file)]) == 2
    assert state_file.read_bytes() == b"garbage"


def test_bad_options_are_errors(checkpoint: Path) -> None:
    assert main(["generate", "hi", "--checkpoint", str(checkpoint), "--temperature", "-1"]) == 2
    assert main(["generate", "hi", "--checkpoint", str(checkpoint.parent / "nope")]) == 2


def test_a_logit_bias_and_the_openai_penalties_are_options(checkpoint: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A bias of +100 makes every greedy token the byte model's token 100 ("d"); a bad pair or a token outside the
    vocabulary is an error."""
    args = ["generate", "hi", "--checkpoint", str(checkpoint), "--temperature", "0", "--max-tokens", "6"]
    assert main([*args, "--logit-bias", "100=100", "--frequency-penalty", "0.5", "--presence-penalty", "0.5"]) == 0
    assert capsys.readouterr().out.strip() == "Dddddd"  # the reply's first letter a capital
    with pytest.raises(SystemExit):
        main([*args, "--logit-bias", "d=1"])
    assert main([*args, "--logit-bias", "260=1"]) == 2
    assert main([*args, "--presence-penalty", "3"]) == 2


def test_a_logit_bias_once_is_an_option(checkpoint: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--logit-bias-once reaches the sampling (left out: the persona's); with it the +100 bias on "d" holds only until
    the reply holds a "d", and the +50 on "x" then takes over."""
    args = ["generate", "hi", "--checkpoint", str(checkpoint), "--temperature", "0", "--max-tokens", "6"]
    parse = build_parser().parse_args
    assert sampling_choices(parse([*args, "--logit-bias-once"])).logit_bias_once is True
    assert sampling_choices(parse([*args, "--no-logit-bias-once"])).logit_bias_once is False
    assert sampling_choices(parse(args)).logit_bias_once is None
    assert sampling_choices(parse([*args, "--recall-temperature", "0.2"])).recall_temperature == 0.2
    assert sampling_choices(parse(args)).recall_temperature is None
    assert sampling_choices(parse([*args, "--exclaim"])).exclaim is True
    assert sampling_choices(parse([*args, "--no-exclaim"])).exclaim is False and sampling_choices(parse(args)).exclaim is None
    assert sampling_choices(parse([*args, "--address", ", sir"])).address == ", sir"
    assert sampling_choices(parse(args)).address is None
    assert main([*args, "--logit-bias", "100=100", "--logit-bias", "120=50", "--logit-bias-once"]) == 0
    once = capsys.readouterr().out.strip()
    assert once.startswith("Dx") and "d" not in once[1:]


def test_the_natural_eval_plays_privacy_mode_when_asked() -> None:
    """--no-text reaches the natural set's options as privacy mode (no token ids kept); without it the text is kept."""
    parse = build_parser().parse_args
    args = ["eval", "--natural", "tune", "--depths", "4", "--modes", "state", "--users", "3"]
    options = natural_options(parse(args))
    assert options.keep_text and options.part == "tune" and options.depths == (4,) and options.users == 3
    assert natural_options(parse([*args, "--no-text"])).keep_text is False


def test_the_bundled_model_answers_and_keeps_its_state(
    smollm2_cache: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """No --checkpoint: the shipped SmolLM2 checkpoint answers, and its identity state is kept in the file."""
    from sia.checkpoint import load_model

    model = load_model(cache_dir=smollm2_cache)
    state_file = tmp_path / "me.safetensors"
    args = ["generate", "What is the capital of France?", "--state", str(state_file), "--temperature", "0", "--max-tokens", "12"]
    assert main([*args, "--cache", str(smollm2_cache), "--persona", "pip"]) == 0
    assert "Paris" in capsys.readouterr().out
    state = state_from_bytes(state_file.read_bytes(), model.config)
    assert state.turns == 1 and state.trace.dtype == torch.float16
