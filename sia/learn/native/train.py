"""``sia train``: train the model on the project's dialogue corpus the way serving uses it.

Every step takes a batch of episodes and plays them turn by turn from fresh identities. Each turn is a
teacher-forced forward (sia.learn.native.episodes.forward_turn) under the current state; afterwards the trace and self
state advance by the serving rules. The earlier turns' text is *not* in the context of later turns, except
in a small share of batches (``transcript_prob``) that carry the whole transcript so far, so that the
model also reads context when it has it. Gradients flow through the self state across all turns of an
episode (episodes are 4 to 6 turns, so no truncation is needed); the trace is carried without gradient.

Loss per turn: cross-entropy of the reply tokens, plus ``user_loss_weight`` times that of the message
tokens (it keeps the model's NLL of user messages, i.e. shock, meaningful). Adam with linear warm-up and
cosine decay, gradient clipping. Checkpoints (weights, config, tokenizer, optimizer, step) are safetensors
and JSON, and a run resumes from its last checkpoint; the batch of step i depends only on (seed, i).
"""

from __future__ import annotations

import json
import logging
import math
import random
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

from sia.checkpoint import load_checkpoint, save_checkpoint
from sia.identity.state import Dynamics
from sia.learn.native.corpus import FACTS, Episode, Probe, make_corpus, short_episode
from sia.learn.native.episodes import EncodedTurn, StateBatch, batch_turns, encode_turn, forward_turn
from sia.model.config import ModelConfig, check_fields, read_json_object
from sia.model.native import SIAModel
from sia.model.tokenizer import ByteTokenizer
from sia.personas import persona_preamble

__all__ = ["RecallProbe", "TrainConfig", "encode_episode_turns", "train"]

log = logging.getLogger(__name__)


@dataclass
class TrainConfig:
    model: dict[str, Any] = field(default_factory=dict)  # ModelConfig fields; missing ones take defaults
    out_dir: str = "runs/default"
    seed: int = 0
    train_episodes: int = 20000
    heldout_episodes: int = 300
    batch_size: int = 16
    steps: int = 2000
    lr: float = 2e-3
    min_lr: float = 2e-4
    warmup_steps: int = 100
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    user_loss_weight: float = 0.3
    answer_weight: float = 1.0  # weight of the tokens of a recalled value in a probe reply (1 = like any reply token)
    transcript_prob: float = 0.1  # share of batches whose turns see the whole transcript so far
    recall_weight: float = 0.0  # weight of the auxiliary loss reading each probe's value off the self state (0 = off)
    short_episode_steps: int = 0  # curriculum: the first N steps train on episodes cut to fact, one turn, probe
    eval_every: int = 200  # held-out loss every N steps
    checkpoint_every: int = 200
    threads: int | None = None  # torch threads; None keeps torch's default

    def __post_init__(self) -> None:
        self.model_config()  # validates the model section
        for name in ("train_episodes", "heldout_episodes", "batch_size", "steps", "eval_every", "checkpoint_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1; got {getattr(self, name)}")
        if not 0 < self.min_lr <= self.lr:
            raise ValueError(f"need 0 < min_lr <= lr; got min_lr={self.min_lr}, lr={self.lr}")
        if not 0 <= self.transcript_prob <= 1:
            raise ValueError(f"transcript_prob must be in [0, 1]; got {self.transcript_prob}")
        nonnegative = (self.user_loss_weight, self.answer_weight, self.recall_weight, self.warmup_steps, self.short_episode_steps)
        if min(nonnegative) < 0 or self.grad_clip <= 0:
            raise ValueError(
                "user_loss_weight, answer_weight, recall_weight, warmup_steps and short_episode_steps must be >= 0"
                " and grad_clip > 0"
            )

    def model_config(self) -> ModelConfig:
        return ModelConfig.from_dict(self.model)

    @classmethod
    def from_file(cls, path: str | Path) -> TrainConfig:
        data = read_json_object(path)
        check_fields(cls, data, "training")
        return cls(**data)

    def to_file(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(asdict(self), indent=2) + "\n")


# ---------------------------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------------------------


def encode_episode_turns(tok: ByteTokenizer, episode: Episode, *, transcript: bool, block_size: int) -> list[EncodedTurn]:
    """Every turn of an episode, encoded with the persona preamble and, if asked, the transcript so far.

    The transcript is cut from the oldest turn so that each encoded turn fits ``block_size``.
    """
    preamble = tok.encode(persona_preamble(episode.persona))
    history: list[list[int]] = []
    encoded = []
    answers = {p.turn: (p.prefix, p.answer) for p in episode.probes}
    for index, turn in enumerate(episode.turns):
        bare = encode_turn(tok, preamble, turn.user, turn.reply)
        if len(bare.ids) > block_size:
            raise ValueError(f"a turn of {len(bare.ids)} tokens does not fit block_size {block_size}")
        context = list(preamble)
        if transcript:
            room = block_size - len(bare.ids)
            kept: list[int] = []
            for past in reversed(history):
                if len(kept) + len(past) > room:
                    break
                kept = past + kept
            context += kept
        encoded.append(encode_turn(tok, context, turn.user, turn.reply, answer=answers.get(index)))
        history.append(bare.ids[len(preamble) :])
    return encoded


class RecallProbe(nn.Module):
    """A training-only linear read-out of the fact values from the self state entering a probe turn.

    Its cross-entropy (over the candidates of the probed fact) is an auxiliary loss that asks the self state
    to hold each stated value in a linearly readable form; the gradient reaches the turn that stated the
    value through the self-state updates in between. The read-out is not part of the model's checkpoint.
    """

    def __init__(self, d_self: int) -> None:
        super().__init__()
        self.spans: dict[str, tuple[int, int]] = {}  # fact -> [start, end) of its values among the logits
        start = 0
        for fact, values in FACTS.items():
            self.spans[fact] = (start, start + len(values))
            start += len(values)
        self.proj = nn.Linear(d_self, start)

    def loss(self, self_state: Tensor, probes: list[Probe]) -> Tensor:
        """Summed cross-entropy of each probe's answer from its row of self_state (len(probes), d_s)."""
        logits: Tensor = self.proj(self_state)  # (P, n_values)
        total: Tensor = logits.new_zeros(())
        for row, probe in zip(logits, probes, strict=True):
            a, b = self.spans[probe.fact]
            target = torch.tensor(probe.candidates.index(probe.answer), device=logits.device)
            total = total + F.cross_entropy(row[a:b], target)
        return total


def _episode_batch(corpus: tuple[Episode, ...], rng: random.Random, size: int) -> list[Episode]:
    return [corpus[rng.randrange(len(corpus))] for _ in range(size)]


def episode_loss(
    model: SIAModel,
    episodes: list[Episode],
    tok: ByteTokenizer,
    dynamics: Dynamics,
    *,
    transcript: bool,
    user_weight: float,
    answer_weight: float = 1.0,
    recall: RecallProbe | None = None,
    recall_weight: float = 0.0,
) -> tuple[Tensor, int]:
    """Mean weighted token loss over all turns of the episodes, played from fresh identities; and #tokens.

    With a ``recall`` read-out, ``recall_weight`` times its mean cross-entropy over the probes is added.
    """
    config = model.config
    device = model.wte.weight.device
    per_episode = [encode_episode_turns(tok, e, transcript=transcript, block_size=config.block_size) for e in episodes]
    state = StateBatch.fresh(config, len(episodes), device)
    total = torch.zeros((), device=device)
    weight_sum = 0.0
    n_tokens = 0
    recall_total, n_probes = torch.zeros((), device=device), 0
    for t in range(max(len(turns) for turns in per_episode)):
        if recall is not None and model.stateful:
            probes = [(b, p) for b, e in enumerate(episodes) for p in e.probes if p.turn == t]
            if probes:
                rows = torch.tensor([b for b, _ in probes], device=device)
                recall_total = recall_total + recall.loss(state.self_state[rows], [p for _, p in probes])
                n_probes += len(probes)
        batch = batch_turns([turns[t] if t < len(turns) else None for turns in per_episode], pad_id=tok.pad_id, device=device)
        out = forward_turn(model, batch, state, dynamics)
        active = batch.active.view(-1, 1)
        weights = batch.reply_targets.float() + user_weight * batch.message_targets.float()
        weights = (weights + (answer_weight - 1.0) * batch.answer_targets.float()) * active
        total = total + (out.token_nll * weights).sum()
        weight_sum += float(weights.sum())
        n_tokens += int((batch.summary_mask & batch.active.view(-1, 1)).sum())
        state = out.state
    loss = total / max(weight_sum, 1.0)
    if n_probes:
        loss = loss + recall_weight * recall_total / n_probes
    return loss, n_tokens


# ---------------------------------------------------------------------------------------------------------
# Checkpoints that resume
# ---------------------------------------------------------------------------------------------------------

TRAINER_FILE = "trainer.json"
OPTIMIZER_FILE = "optimizer.safetensors"
RECALL_FILE = "recall_probe.safetensors"  # the training-only read-out of RecallProbe


def _export(model: SIAModel, tok: ByteTokenizer, directory: Path) -> None:
    """A loadable checkpoint (config, weights) with its tokenizer, as ``sia`` commands expect."""
    save_checkpoint(model, directory)
    tok.to_file(directory / "tokenizer.json")


def _save_resumable(
    directory: Path,
    model: SIAModel,
    optimizer: torch.optim.Optimizer,
    step: int,
    history: dict[str, Any],
    recall: RecallProbe | None = None,
) -> None:
    tmp = directory.with_name(directory.name + ".tmp")
    _export(model, ByteTokenizer(), tmp)
    if recall is not None:
        save_file({k: v.contiguous() for k, v in recall.state_dict().items()}, str(tmp / RECALL_FILE))
    state = optimizer.state_dict()
    tensors: dict[str, Tensor] = {}
    for index, entry in state["state"].items():
        for name, value in entry.items():
            tensors[f"{index}.{name}"] = torch.as_tensor(value).contiguous()
    save_file(tensors, str(tmp / OPTIMIZER_FILE))
    (tmp / TRAINER_FILE).write_text(json.dumps({"step": step, "param_groups": state["param_groups"], "history": history}))
    if directory.exists():
        for child in directory.iterdir():
            child.unlink()
        directory.rmdir()
    tmp.rename(directory)


def _load_resumable(directory: Path, optimizer: torch.optim.Optimizer) -> tuple[SIAModel, int, dict[str, Any]]:
    model = load_checkpoint(directory)
    meta = json.loads((directory / TRAINER_FILE).read_text())
    flat = load_file(str(directory / OPTIMIZER_FILE))
    state: dict[int, dict[str, Tensor]] = {}
    for key, value in flat.items():
        index, name = key.split(".", 1)
        state.setdefault(int(index), {})[name] = value
    optimizer_state = {"state": state, "param_groups": meta["param_groups"]}
    return model, int(meta["step"]), {"history": meta["history"], "optimizer": optimizer_state}


# ---------------------------------------------------------------------------------------------------------
# The loop
# ---------------------------------------------------------------------------------------------------------


def _lr(config: TrainConfig, step: int) -> float:
    if step < config.warmup_steps:
        return config.lr * (step + 1) / config.warmup_steps
    progress = (step - config.warmup_steps) / max(1, config.steps - config.warmup_steps)
    return config.min_lr + 0.5 * (config.lr - config.min_lr) * (1 + math.cos(math.pi * min(1.0, progress)))


@torch.no_grad()
def heldout_loss(
    model: SIAModel, episodes: tuple[Episode, ...], tok: ByteTokenizer, dynamics: Dynamics, batch_size: int
) -> float:
    model.eval()
    losses, weights = 0.0, 0
    for start in range(0, len(episodes), batch_size):
        chunk = list(episodes[start : start + batch_size])
        loss, _ = episode_loss(model, chunk, tok, dynamics, transcript=False, user_weight=0.0)
        losses += float(loss) * len(chunk)
        weights += len(chunk)
    model.train()
    return losses / max(weights, 1)


def _progress(step: int, total: int, loss: float, tokens_per_s: float, elapsed: float, steps_done: int) -> None:
    """One progress line; `elapsed` seconds went into the last `steps_done` steps (this process's share of a resumed run)."""
    width = 30
    done = int(width * step / total)
    eta = elapsed / max(steps_done, 1) * (total - step)
    bar = "#" * done + "-" * (width - done)
    sys.stderr.write(f"\r[{bar}] {step}/{total} loss {loss:.4f} {tokens_per_s:,.0f} tok/s eta {eta / 60:.1f} min ")
    sys.stderr.flush()


def train(config: TrainConfig, *, progress: bool = True) -> Path:
    """Run (or resume) training; returns the output directory holding the final checkpoint and its plots."""
    if config.threads:
        torch.set_num_threads(config.threads)
    out = Path(config.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    config.to_file(out / "train_config.json")
    tok = ByteTokenizer()
    corpus = make_corpus(config.seed, config.train_episodes, config.heldout_episodes)
    model_config = config.model_config()
    dynamics = Dynamics.from_config(model_config)
    resume_dir = out / "checkpoint"

    torch.manual_seed(config.seed)
    model = SIAModel(model_config)
    # built after the model, so the model's initial weights do not depend on whether it is used
    recall = RecallProbe(model_config.d_self) if config.recall_weight > 0 and model.stateful else None

    def adamw() -> torch.optim.Optimizer:
        params = [*model.parameters(), *(recall.parameters() if recall is not None else ())]
        return torch.optim.AdamW(params, lr=config.lr, weight_decay=config.weight_decay, betas=(0.9, 0.98))

    optimizer = adamw()
    step = 0
    history: dict[str, Any] = {"step": [], "loss": [], "heldout_step": [], "heldout_loss": [], "seconds": 0.0}
    if (resume_dir / TRAINER_FILE).is_file():
        model, step, saved = _load_resumable(resume_dir, optimizer)
        if model.config != model_config:
            raise ValueError(f"{resume_dir} holds a model of another config; use a fresh out_dir")
        if recall is not None:
            recall.load_state_dict(load_file(str(resume_dir / RECALL_FILE)))
        optimizer = adamw()
        optimizer.load_state_dict(saved["optimizer"])
        history = saved["history"]
        log.info("resuming %s at step %d", resume_dir, step)
    model.train()
    log.info(
        "model: %s attention, %d parameters; corpus: %d train / %d held-out episodes",
        model_config.attention,
        model.num_parameters(),
        len(corpus.train),
        len(corpus.heldout),
    )

    started, window_tokens, window_start = time.perf_counter(), 0, time.perf_counter()
    run_started, run_first_step = started, step  # for the progress line's ETA (started is reset at each save)
    smoothed = float("nan")
    while step < config.steps:
        rng = random.Random(config.seed * 1_000_003 + step)  # the batch depends on (seed, step) only: resumable
        episodes = _episode_batch(corpus.train, rng, config.batch_size)
        if step < config.short_episode_steps:
            episodes = [short_episode(e) for e in episodes]
        transcript = rng.random() < config.transcript_prob
        for group in optimizer.param_groups:
            group["lr"] = _lr(config, step)
        loss, n_tokens = episode_loss(
            model,
            episodes,
            tok,
            dynamics,
            transcript=transcript,
            user_weight=config.user_loss_weight,
            answer_weight=config.answer_weight,
            recall=recall,
            recall_weight=config.recall_weight,
        )
        optimizer.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
        optimizer.step()
        step += 1
        value = float(loss.detach())
        smoothed = value if math.isnan(smoothed) else 0.95 * smoothed + 0.05 * value
        history["step"].append(step)
        history["loss"].append(value)
        window_tokens += n_tokens
        if progress:
            rate = window_tokens / max(time.perf_counter() - window_start, 1e-9)
            _progress(step, config.steps, smoothed, rate, time.perf_counter() - run_started, step - run_first_step)
        if step % config.eval_every == 0 or step == config.steps:
            held = heldout_loss(model, corpus.heldout, tok, dynamics, config.batch_size * 4)
            history["heldout_step"].append(step)
            history["heldout_loss"].append(held)
            log.info("step %d: train loss %.4f, held-out loss %.4f", step, smoothed, held)
            if corpus.heldout and held < history.get("best_heldout_loss", math.inf):
                # early stopping without stopping: the checkpoint of the lowest held-out loss so far
                history["best_heldout_loss"], history["best_step"] = held, step
                _export(model, tok, out / "best")
            window_tokens, window_start = 0, time.perf_counter()
        if step % config.checkpoint_every == 0 or step == config.steps:
            history["seconds"] = float(history["seconds"]) + time.perf_counter() - started
            started = time.perf_counter()
            _save_resumable(resume_dir, model, optimizer, step, history, recall)
    if progress:
        sys.stderr.write("\n")
    model.eval()
    _export(model, tok, out / "final")
    (out / "history.json").write_text(json.dumps(history))
    plot_losses(history, out / "loss.png")
    log.info("trained %d steps in %.1f min; final checkpoint in %s", step, float(history["seconds"]) / 60, out / "final")
    return out


def plot_losses(history: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    steps, losses = history["step"], history["loss"]
    if losses:
        k = max(1, len(losses) // 100)
        smooth = [sum(losses[max(0, i - k) : i + 1]) / len(losses[max(0, i - k) : i + 1]) for i in range(len(losses))]
        ax.plot(steps, smooth, label="train (smoothed)")
    if history["heldout_loss"]:
        ax.plot(history["heldout_step"], history["heldout_loss"], "o-", label="held-out (replies)")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats/token)")
    ax.set_yscale("log")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
