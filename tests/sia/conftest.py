"""Fixtures for the LLaMA backbone: tiny GGUF files written here, and the bundled SmolLM2 converted once per session."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from sia.backbones.weights import bundled_gguf, cache_entry, file_sha256, gguf_to_hf

# SmolLM2's chat template (ChatML with a default system prompt)
CHATML = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CORPUS = [
    "Hello, world! hello there, how are you today?",
    "The user asks the assistant a question and the assistant answers.",
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face.",
    "What is the capital of France? The capital of France is Paris.",
    "system user assistant im_start im_end",
]


@dataclass(frozen=True)
class TinyVocab:
    """A byte-level BPE vocabulary in GGUF form: 3 control tokens, the 256 byte symbols, learned merges, then "12"."""

    tokens: list[str]
    merges: list[str]
    token_types: list[int]


@pytest.fixture(scope="session")
def tiny_vocab() -> TinyVocab:
    return build_tiny_vocab()


def build_tiny_vocab() -> TinyVocab:
    bpe = Tokenizer(models.BPE())
    # digits kept apart while learning, so the only digit merge is the "1 2" added below
    bpe.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    bpe.train_from_iterator(CORPUS * 20, trainer)
    model = json.loads(bpe.to_str())["model"]
    vocab: dict[str, int] = model["vocab"]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    tokens = sorted(vocab, key=vocab.__getitem__)
    assert [vocab[t] for t in tokens] == list(range(len(tokens))) and tokens[:3] == SPECIALS
    tokens.append("12")
    merges.append("1 2")
    return TinyVocab(tokens, merges, [3 if t in SPECIALS else 1 for t in tokens])


# the tiny LLaMA's shape: 2 layers, width 64, 4 query / 2 kv heads of width 16
LAYERS, WIDTH, HEADS, KV_HEADS, HEAD_DIM, FFN = 2, 64, 4, 2, 16, 128
CONTEXT, ROPE_THETA, RMS_EPS = 256, 50000.0, 1e-5


def llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """What llama.cpp's convert_hf_to_gguf does to q_proj/k_proj rows (pairs (i, i + d/2) made adjacent)."""
    out, width = w.shape
    return w.reshape(n_head, 2, out // n_head // 2, width).swapaxes(1, 2).reshape(out, width)


def tiny_weights(vocab_size: int, tied: bool, seed: int = 0) -> dict[str, np.ndarray]:
    """Random float32 weights under their Hugging Face names."""
    rng = np.random.default_rng(seed)
    d, f, q, kv = WIDTH, FFN, HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM

    def mat(rows: int, cols: int) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) * 0.1).astype(np.float32)

    w = {
        "model.embed_tokens.weight": mat(vocab_size, d),
        "model.norm.weight": (1 + 0.1 * rng.standard_normal(d)).astype(np.float32),
    }
    if not tied:
        w["lm_head.weight"] = mat(vocab_size, d)
    for n in range(LAYERS):
        p = f"model.layers.{n}."
        w |= {
            p + "input_layernorm.weight": (1 + 0.1 * rng.standard_normal(d)).astype(np.float32),
            p + "self_attn.q_proj.weight": mat(q, d),
            p + "self_attn.k_proj.weight": mat(kv, d),
            p + "self_attn.v_proj.weight": mat(kv, d),
            p + "self_attn.o_proj.weight": mat(d, q),
            p + "post_attention_layernorm.weight": (1 + 0.1 * rng.standard_normal(d)).astype(np.float32),
            p + "mlp.gate_proj.weight": mat(f, d),
            p + "mlp.up_proj.weight": mat(f, d),
            p + "mlp.down_proj.weight": mat(d, f),
        }
    return w


def gguf_name(hf: str) -> str:
    """The llama.cpp name of a Hugging Face LLaMA tensor (written out here, independently of sia.backbones.weights)."""
    fixed = {
        "model.embed_tokens.weight": "token_embd.weight",
        "model.norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight",
    }
    if hf in fixed:
        return fixed[hf]
    n, rest = hf.removeprefix("model.layers.").split(".", 1)
    suffix = {
        "input_layernorm.weight": "attn_norm",
        "self_attn.q_proj.weight": "attn_q",
        "self_attn.k_proj.weight": "attn_k",
        "self_attn.v_proj.weight": "attn_v",
        "self_attn.o_proj.weight": "attn_output",
        "post_attention_layernorm.weight": "ffn_norm",
        "mlp.gate_proj.weight": "ffn_gate",
        "mlp.up_proj.weight": "ffn_up",
        "mlp.down_proj.weight": "ffn_down",
    }[rest]
    return f"blk.{n}.{suffix}.weight"


@dataclass(frozen=True)
class TinyGGUF:
    path: Path
    original: dict[str, np.ndarray]  # the float weights the file was made from (HF names, HF layout)
    expected: dict[str, np.ndarray]  # what a correct conversion yields: the original after the file's quantisation


def write_tiny_gguf(
    path: Path,
    vocab: TinyVocab,
    quant: str = "F32",
    tied: bool = False,
    pre: str = "smollm",
    architecture: str = "llama",
) -> TinyGGUF:
    """A tiny LLaMA GGUF as llama.cpp writes one: q/k rows permuted, matrices in `quant` (F32, F16 or Q4_1 with a
    Q8_0 embedding, like the bundled SmolLM2), norms in F32."""
    original = tiny_weights(len(vocab.tokens), tied)
    writer = gguf.GGUFWriter(path, architecture)
    writer.add_block_count(LAYERS)
    writer.add_context_length(CONTEXT)
    writer.add_embedding_length(WIDTH)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_rope_freq_base(ROPE_THETA)
    writer.add_layer_norm_rms_eps(RMS_EPS)
    writer.add_rope_dimension_count(HEAD_DIM)
    writer.add_vocab_size(len(vocab.tokens))
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(vocab.tokens)
    writer.add_token_types(vocab.token_types)
    writer.add_token_merges(vocab.merges)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_pad_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHATML)
    expected: dict[str, np.ndarray] = {}
    for name, w in original.items():
        qtype = GGMLQuantizationType.F32
        if w.ndim == 2 and quant == "F16":
            qtype = GGMLQuantizationType.F16
        elif w.ndim == 2 and quant == "Q4_1":
            qtype = GGMLQuantizationType.Q8_0 if name == "model.embed_tokens.weight" else GGMLQuantizationType.Q4_1
        stored = w
        if name.endswith("q_proj.weight"):
            stored = llama_cpp_permute(w, HEADS)
        elif name.endswith("k_proj.weight"):
            stored = llama_cpp_permute(w, KV_HEADS)
        data = gguf.quants.quantize(stored, qtype)
        writer.add_tensor(gguf_name(name), data, raw_dtype=qtype)
        # quantisation works row by row, so it commutes with the row permutation
        expected[name] = gguf.quants.dequantize(gguf.quants.quantize(w, qtype), qtype).reshape(w.shape)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return TinyGGUF(path, original, expected)


@pytest.fixture
def make_tiny_gguf(tmp_path: Path, tiny_vocab: TinyVocab) -> Callable[..., TinyGGUF]:
    """write_tiny_gguf into this test's tmp_path: make_tiny_gguf(name, quant=..., tied=..., pre=...)."""

    def make(name: str = "tiny.gguf", **options: object) -> TinyGGUF:
        return write_tiny_gguf(tmp_path / name, tiny_vocab, **options)  # type: ignore[arg-type]

    return make


@pytest.fixture(scope="session")
def smollm2_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model cache holding the bundled SmolLM2-135M-Instruct GGUF converted to float32, once per test session
    (cache/<sha256>/, where load_model looks for it)."""
    try:
        path = bundled_gguf()
    except ValueError as exc:
        pytest.skip(f"the bundled SmolLM2 weights are not installed: {exc}")
    cache = tmp_path_factory.mktemp("models")
    gguf_to_hf(path, cache_entry(cache, file_sha256(path)))
    return cache


@pytest.fixture(scope="session")
def smollm2_dir(smollm2_cache: Path) -> Path:
    """The converted SmolLM2 as a Hugging Face directory."""
    return next(p for p in smollm2_cache.iterdir() if p.is_dir())


def hf_tiny(**changes: object) -> dict[str, object]:
    """A tiny random LLaMA's Hugging Face config fields (byte-sized vocabulary), with ``changes``."""
    fields: dict[str, object] = dict(
        vocab_size=300,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        rope_theta=10000.0,
        rms_norm_eps=1e-5,
        max_position_embeddings=512,
        tie_word_embeddings=True,
    )
    return {**fields, **changes}
