"""A training run's checkpoint (its ``last/``): a servable SIA checkpoint in float32, the read-out, the optimizer's
state and the step, so that a stopped run resumes bit for bit; and a run started from another checkpoint's
identity parameters (``init``)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor

from sia.backbones.llama import LlamaModel
from sia.checkpoint import BASE_FILE, BaseRef, load_identity, save_llama_checkpoint
from sia.learn.adapter.readout import READOUT_FILE, ReadOut
from sia.model.config import read_json_object

__all__ = ["OPTIMIZER_FILE", "TRAINER_FILE", "resume_run", "save_run", "start_from"]

OPTIMIZER_FILE = "optimizer.safetensors"
TRAINER_FILE = "trainer.json"


def save_run(
    directory: Path, model: LlamaModel, ref: BaseRef, readout: ReadOut, optimizer: torch.optim.Optimizer, step: int
) -> None:
    """The run at ``step`` into ``directory``, written beside it first and then moved in: a run stopped while saving
    keeps its previous checkpoint."""
    tmp = directory.with_name(directory.name + ".tmp")
    if tmp.exists():
        for child in tmp.iterdir():
            child.unlink()
    save_llama_checkpoint(model, tmp, ref, exact=True)
    save_file({k: v.contiguous() for k, v in readout.state_dict().items()}, str(tmp / READOUT_FILE))
    state = optimizer.state_dict()
    tensors = {f"{i}.{name}": torch.as_tensor(v).contiguous() for i, entry in state["state"].items() for name, v in entry.items()}
    save_file(tensors, str(tmp / OPTIMIZER_FILE))
    (tmp / TRAINER_FILE).write_text(json.dumps({"step": step, "param_groups": state["param_groups"]}))
    if directory.exists():
        for child in directory.iterdir():
            child.unlink()
        directory.rmdir()
    tmp.rename(directory)


def resume_run(directory: Path, model: LlamaModel, readout: ReadOut, optimizer: torch.optim.Optimizer) -> int:
    """The identity parameters, read-out and optimizer state saved in ``directory``, loaded in place; the step reached."""
    identity = load_file(str(directory / "identity.safetensors"))
    missing = set(model.identity_state_dict()) - set(identity)
    if missing:
        raise ValueError(f"{directory} lacks adapter tensors {sorted(missing)[:3]}; was it made with another config?")
    model.load_state_dict(identity, strict=False)
    readout.load(directory / READOUT_FILE)
    meta = read_json_object(directory / TRAINER_FILE)
    state: dict[int, dict[str, Tensor]] = {}
    for key, value in load_file(str(directory / OPTIMIZER_FILE)).items():
        index, name = key.split(".", 1)
        state.setdefault(int(index), {})[name] = value
    optimizer.load_state_dict({"state": state, "param_groups": meta["param_groups"]})
    return int(meta["step"])


def start_from(directory: Path, model: LlamaModel, ref: BaseRef, readout: ReadOut) -> None:
    """``config.init``: the identity parameters of the checkpoint at ``directory`` (its read-out, if it has one)."""
    if not (directory / BASE_FILE).is_file():
        raise ValueError(f"init {directory} is not a SIA checkpoint over a pretrained base (no {BASE_FILE})")
    if BaseRef.read(directory / BASE_FILE).sha256 != ref.sha256:
        raise ValueError(f"init {directory} was trained over other base weights than this run's")
    load_identity(model, directory)
    if (directory / READOUT_FILE).is_file():
        readout.load(directory / READOUT_FILE)
