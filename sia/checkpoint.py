"""Checkpoints: a directory with config.json and model.safetensors (weights only, never pickle)."""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from safetensors.torch import load_model, save_model

from sia.config import ModelConfig
from sia.model import SIAModel

__all__ = ["DEFAULT_CHECKPOINT", "load_checkpoint", "load_default_model", "save_checkpoint"]

log = logging.getLogger(__name__)

DEFAULT_CHECKPOINT = Path(__file__).parent / "checkpoints" / "default"
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"


def save_checkpoint(model: SIAModel, directory: str | Path) -> Path:
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    model.config.to_file(out / CONFIG_FILE)
    save_model(model, str(out / WEIGHTS_FILE))
    return out


def load_checkpoint(directory: str | Path, *, device: str | torch.device = "cpu") -> SIAModel:
    """Rebuild the model from its own config and load the weights strictly (missing/extra keys raise)."""
    path = Path(directory)
    for name in (CONFIG_FILE, WEIGHTS_FILE):
        if not (path / name).is_file():
            raise ValueError(f"{path} is not a checkpoint: {name} is missing")
    model = SIAModel(ModelConfig.from_file(path / CONFIG_FILE))
    missing, unexpected = load_model(model, str(path / WEIGHTS_FILE), strict=True, device=str(device))
    if missing or unexpected:  # strict=True already raises; kept as an invariant
        raise ValueError(f"checkpoint weights do not match the model: missing {missing}, unexpected {unexpected}")
    return model.to(device).eval()


def load_default_model(checkpoint: str | Path | None = None) -> SIAModel:
    """The named checkpoint, else the bundled one, else an untrained model of the default config (seed 0)."""
    if checkpoint is not None:
        return load_checkpoint(checkpoint)
    if (DEFAULT_CHECKPOINT / WEIGHTS_FILE).is_file():
        return load_checkpoint(DEFAULT_CHECKPOINT)
    log.warning("no bundled checkpoint at %s: using an untrained model (seed 0); its replies are noise", DEFAULT_CHECKPOINT)
    torch.manual_seed(0)
    return SIAModel(ModelConfig()).eval()
