"""What an adapter run trains: the backbone, frozen, with fresh identity parameters that alone require a gradient,
and the optimizer's parameter groups (each with its own peak learning rate)."""

from __future__ import annotations

from pathlib import Path

import torch

from sia.backbones.chat_tokenizer import ChatTokenizer
from sia.backbones.llama import LlamaModel
from sia.backbones.weights import read_hf, resolve_base
from sia.checkpoint import BASE_FILE, DEFAULT_CACHE, DEFAULT_CHECKPOINT, BaseRef, source_digest
from sia.learn.adapter.config import TrainConfig
from sia.learn.adapter.readout import ReadOut
from sia.model.config import LlamaConfig

__all__ = ["GATE_PARAMETERS", "READ_PARAMETERS", "base_ref", "build_model", "make_optimizer"]

GATE_PARAMETERS = ("slot_bias", "self_update.gate.bias")  # scalars that open and shut: their own learning rate
READ_PARAMETERS = ("self_key", "self_value", "slot_gate")  # the slots' key and value maps, the read gate: config.read_lr


def _is_read(name: str) -> bool:
    """Whether one of the dotted parts of parameter ``name`` is in READ_PARAMETERS."""
    return any(part in READ_PARAMETERS for part in name.split("."))


def base_ref(config: TrainConfig) -> tuple[Path, BaseRef]:
    """Where ``config.base`` is (the bundled checkpoint's base where null) and the reference a checkpoint keeps of it."""
    if config.base is None:
        ref = BaseRef.read(DEFAULT_CHECKPOINT / BASE_FILE)
        return ref.locate(DEFAULT_CHECKPOINT), ref
    path = Path(config.base).resolve()
    return path, BaseRef(sha256=source_digest(path), path=str(path))


def build_model(config: TrainConfig, cache_dir: Path = DEFAULT_CACHE) -> tuple[LlamaModel, BaseRef]:
    """The backbone with fresh adapter parameters of ``config.model``, the slot open at ``config.slot_bias``."""
    path, ref = base_ref(config)
    hf_dir = resolve_base(path, cache_dir, sha256=ref.sha256 if path.is_file() else None)
    hf_config, tensors = read_hf(hf_dir)
    model_config = LlamaConfig.from_hf(hf_config, **config.model)
    model = LlamaModel.from_base(model_config, ChatTokenizer.from_dir(hf_dir), tensors, seed=config.seed)
    model.init_identity(config.seed, slot_bias=config.slot_bias)
    identity = model.identity_state_dict()
    for name, p in model.named_parameters():
        p.requires_grad_(name in identity)
    return model, ref


def make_optimizer(config: TrainConfig, model: LlamaModel, readout: ReadOut) -> torch.optim.AdamW:
    """AdamW over four groups, each keeping its peak learning rate (``peak``) for the schedule: the write and the rest
    of the adapter (lr), the read (read_lr), the gates (gate_lr, no weight decay), the read-out (readout_lr)."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    gates = [p for n, p in named if n.endswith(GATE_PARAMETERS)]
    read = [p for n, p in named if _is_read(n)]
    rest = [p for n, p in named if not (n.endswith(GATE_PARAMETERS) or _is_read(n))]
    read_lr = config.lr if config.read_lr is None else config.read_lr
    return torch.optim.AdamW(
        [
            {"params": rest, "lr": config.lr, "weight_decay": config.weight_decay, "peak": config.lr},
            {"params": read, "lr": read_lr, "weight_decay": config.weight_decay, "peak": read_lr},
            {"params": gates, "lr": config.gate_lr, "weight_decay": 0.0, "peak": config.gate_lr},
            {"params": list(readout.parameters()), "lr": config.readout_lr, "weight_decay": 0.0, "peak": config.readout_lr},
        ]
    )
