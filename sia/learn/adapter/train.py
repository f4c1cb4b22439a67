"""``sia train`` for a pretrained backbone: teach the identity adapter to carry what users say.

The backbone stays frozen; what trains is the adapter (LlamaModel.identity_state_dict: the memory tokens and the
gated self update that write, the self slot's key, value and bias at every layer that read) plus a training-only
read-out. Every step plays a batch of fact-dialogue episodes (sia.learn.adapter.facts) turn by turn from fresh
identities, exactly as the service would (sia.learn.adapter.unroll), then asks about each fact from the final state.

Loss, per step:
- answer: cross-entropy of each probe's reply, the value's tokens weighted ``value_weight``, under the final state
  and with nothing of the conversation in context; with ``rank_weight`` > 0 plus that weight times a cross-entropy
  over the kind's values alone where the value begins (their first tokens: the margin the eval's ranking needs);
- read-out: after every turn from the statement on, a linear classifier per fact kind must name each stated value
  from the self state alone (against state collapse: it gives the write a gradient from step 0);
- distillation: on one ordinary turn per episode, KL(teacher || student) over the reply, the teacher being the
  base model with the whole transcript in context, the student the stateful model with only that turn.
The answer and the distillation read the state detached: they train the read. The read-out's gradient (and the
ranking term's, with ``rank_to_write``) runs through the self state across every turn of an episode
(backpropagation through time) into the write; the turn tokens themselves are differentiated only in the turns a
loss reads (see unroll.write_turn). A curriculum grows the number of unrelated turns between statement and question.
bf16 autocast, AdamW with warm-up and cosine decay, a higher learning rate for the gates; resumable checkpoints
(safetensors and JSON); held-out recall during training.

This module is the loop; its parts are modules of their own: config (TrainConfig), trainable (the model and the
optimizer's groups), batch (a step's episodes), losses, readout (the training read-out), heldout (the figures
during training), run_checkpoint (a run's last/, resumed bit for bit).
"""

from __future__ import annotations

import json
import logging
import math
import sys
import time
from pathlib import Path
from typing import Any

import torch

from sia.backbones.packed_linear import bfloat16_products_fast
from sia.checkpoint import DEFAULT_CACHE, save_llama_checkpoint
from sia.identity.state import Dynamics
from sia.learn.adapter.batch import sample_batch
from sia.learn.adapter.config import TrainConfig
from sia.learn.adapter.heldout import heldout_readout, heldout_recall
from sia.learn.adapter.losses import episode_losses
from sia.learn.adapter.readout import ReadOut
from sia.learn.adapter.run_checkpoint import TRAINER_FILE, resume_run, save_run, start_from
from sia.learn.adapter.trainable import build_model, make_optimizer

__all__ = ["ADAPTER_DIR", "HISTORY_FILE", "TRAINER_FILE", "TrainConfig", "train", "use_bf16"]

log = logging.getLogger(__name__)

ADAPTER_DIR = "adapter"  # the finished run's checkpoint to serve (``last`` keeps float32 weights to resume from)
HISTORY_FILE = "history.jsonl"


def _keep_history(history: Path, step: int) -> None:
    """Drop the records of steps after ``step``: a run stopped between checkpoints redoes them when it resumes."""
    if not history.is_file():
        return
    lines = history.read_text().splitlines()
    kept = [line for line in lines if line.strip() and json.loads(line)["step"] <= step]
    if len(kept) != len(lines):
        history.write_text("".join(line + "\n" for line in kept))


def use_bf16(precision: str, device: torch.device) -> bool:
    """Whether to autocast to bfloat16: asked for, or "auto" and bf16 products are not slower than fp32 here.

    CPUs without native bf16 instructions emulate it: measured 86x slower than fp32 for a 200x576x1536 product."""
    if precision != "auto":
        return precision == "bf16"
    if device.type == "cuda":
        return True
    return bfloat16_products_fast()


def _lr(config: TrainConfig, step: int, peak: float) -> float:
    """Linear warm-up, then cosine decay to min_lr (scaled to the group's peak); the warm-up starts again when the
    write stage ends, since the read and its fresh optimizer state begin to learn only then."""
    scale = peak / config.lr
    if step < config.warmup_steps:
        return peak * (step + 1) / config.warmup_steps
    progress = (step - config.warmup_steps) / max(1, config.cosine_length(step) - config.warmup_steps)
    cosine = config.min_lr + 0.5 * (config.lr - config.min_lr) * (1 + math.cos(math.pi * min(1.0, progress)))
    since = step - config.write_stage_steps
    rewarm = (since + 1) / config.warmup_steps if config.write_stage_steps and 0 <= since < config.warmup_steps else 1.0
    return cosine * scale * rewarm


def _progress(step: int, total: int, losses: dict[str, float], rate: float) -> None:
    width = 30
    done = int(width * step / total)
    eta = (total - step) / max(rate, 1e-9) / 60
    parts = " ".join(f"{k} {v:.3f}" for k, v in losses.items())
    sys.stderr.write(
        f"\r[{'#' * done}{'-' * (width - done)}] {step}/{total} {parts} {rate * 60:.1f} steps/min eta {eta:.0f} min "
    )
    sys.stderr.flush()


def train(config: TrainConfig, *, progress: bool = True, cache_dir: Path = DEFAULT_CACHE) -> Path:
    """Run (or resume) training; returns the output directory, whose ``last/`` is a servable checkpoint."""
    if config.threads:
        torch.set_num_threads(config.threads)
    out = Path(config.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    config.to_file(out / "train.json")
    device = torch.device(config.device)
    model, ref = build_model(config, cache_dir)
    model.to(device).train()
    torch.manual_seed(config.seed)  # the read-out's initial weights
    readout = ReadOut(model.config.d_self, config.readout_momentum).to(device)
    optimizer = make_optimizer(config, model, readout)
    step = 0
    last = out / "last"
    if (last / TRAINER_FILE).is_file():
        step = resume_run(last, model, readout, optimizer)
        log.info("resumed %s at step %d", last, step)
    elif config.init is not None:
        start_from(Path(config.init), model, ref, readout)
        log.info("started from the identity parameters of %s", config.init)
    if config.readout_momentum is None:  # standardise per call, whatever read-out an init brought its moments from
        readout.updates.zero_()
    dynamics = Dynamics.from_config(model.config)
    history = out / HISTORY_FILE
    _keep_history(history, step)
    amp = torch.autocast(device.type, dtype=torch.bfloat16, enabled=use_bf16(config.precision, device))
    started, done_here = time.perf_counter(), 0
    while step < config.steps:
        for group in optimizer.param_groups:
            group["lr"] = _lr(config, step, group["peak"])
        with amp:
            losses = episode_losses(model, readout, sample_batch(config, model, step), config, dynamics)
        total = losses["answer"] + config.readout_weight * losses["readout"] + config.distill_weight * losses["distill"]
        optimizer.zero_grad(set_to_none=True)
        total.backward()  # type: ignore[no-untyped-call]
        norm = torch.nn.utils.clip_grad_norm_([p for g in optimizer.param_groups for p in g["params"]], config.grad_clip)
        optimizer.step()
        step += 1
        done_here += 1
        record: dict[str, Any] = {
            "step": step,
            "loss": float(total.detach()),
            **{k: float(v.detach()) for k, v in losses.items()},
        }
        slot_bias = torch.cat([attn.slot_bias.detach().float() for attn in model.attentions if attn.stateful]).mean()
        record.update(grad_norm=float(norm), max_between=config.max_between(step - 1), slot_bias=float(slot_bias))
        if model.config.slot_gate:  # how far the read gate has moved from zero
            record["slot_gate"] = float(
                torch.stack([a.slot_gate.weight.detach().float().norm() for a in model.attentions if a.gated]).mean()
            )
        if step % config.eval_every == 0 or step == config.steps:
            model.eval()
            with amp:
                if step <= config.write_stage_steps:  # what the write stage teaches: the state names held-out facts
                    record["heldout_readout"] = heldout_readout(model, readout, config.eval_episodes * 4, dynamics)
                else:
                    record["heldout"] = heldout_recall(model, config.eval_episodes, config.eval_between, dynamics)
            model.train()
            log.info("step %d held-out: %s", step, record.get("heldout", record.get("heldout_readout")))
        with history.open("a") as f:
            f.write(json.dumps(record) + "\n")
        if step % config.checkpoint_every == 0 or step == config.steps:
            save_run(last, model, ref, readout, optimizer, step)
        if step == config.steps:  # what a deployment serves: the identity parameters in config.model's weights_dtype
            save_llama_checkpoint(model, out / ADAPTER_DIR, ref)
        if progress:
            _progress(
                step, config.steps, {k: float(v.detach()) for k, v in losses.items()}, done_here / (time.perf_counter() - started)
            )
    if progress:
        sys.stderr.write("\n")
    return out
