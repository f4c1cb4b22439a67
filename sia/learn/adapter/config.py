"""The adapter trainer's configuration (``sia train`` with a config that names a ``base``): one flat JSON object whose
keys are TrainConfig's fields. The defaults are the shipped recipe's first stage; a config states what differs."""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from sia.learn.adapter import facts
from sia.model.config import LlamaConfig, check_fields, read_json_object

__all__ = ["TrainConfig"]


@dataclass
class TrainConfig:
    """One adapter training run. The defaults are the shipped recipe's first stage (configs/train-smollm2.json), so a
    config file states only what differs; its keys are these fields, flat, and any other key is refused."""

    # --- the run ------------------------------------------------------------------------------------------------
    base: str | None = None  # a GGUF file or HF directory; None: the bundled SmolLM2-135M-Instruct
    model: dict[str, Any] = field(default_factory=dict)  # LlamaConfig injection fields (backbone fields come from the base)
    out_dir: str = "runs/smollm2"
    # a SIA checkpoint (a shipped adapter, or a run's last/) whose identity parameters start this run instead of
    # fresh ones, its read-out too where it has one; its config must be this run's model. Unused when resuming.
    init: str | None = None
    seed: int = 0
    steps: int = 1500
    checkpoint_every: int = 25
    slot_bias: float = 0.0  # where the slot's bias starts: open, so the read has a gradient

    # --- optimisation: AdamW, linear warm-up then cosine decay to min_lr ----------------------------------------------
    lr: float = 2e-3
    gate_lr: float = 1e-2
    read_lr: float | None = 1e-3  # the slots' keys and values (the read); None: lr. Measured: 2e-3 with 4 slots diverged
    readout_lr: float = 1e-2  # the read-out must grow from nothing to name values: it learns fast or the write gets no signal
    min_lr: float = 2e-4
    warmup_steps: int = 20
    # [[step, length], ...]: from each step on, the cosine decays as if the run had that many steps (null: steps);
    # a run lengthened or shortened while it trained, stated so that one command replays it
    cosine_steps: list[list[int]] | None = None
    weight_decay: float = 0.0
    grad_clip: float = 1.0

    # --- curriculum and data ---------------------------------------------------------------------------------------
    batch_size: int = 6
    write_stage_steps: int = 100  # first stage: statement turns alone, read-out only (many examples per step, cheap)
    write_stage_batch: int = 24
    curriculum: list[list[int]] = field(default_factory=lambda: [[0, 2], [250, 4]])  # [step, max turns]
    # the fewest unrelated turns an episode gets: null, half the stage's most (at least 1); a number, that many (at most
    # the stage's most), so that shallower depths than the stage's keep being trained; 0 includes questions asked
    # right after the statement
    min_between: int | None = None
    n_facts: int = 3
    # how often each fact kind is drawn into a training episode, relative to the others: {kind: weight}, a kind not
    # named weighs 1, 0 never drawn (facts.draw_kinds); null: n_facts kinds drawn uniformly
    kind_weights: dict[str, float] | None = None
    probes_per_episode: int = 3  # questions asked per episode each step (read-out covers every fact anyway)
    distill_every: int = 2  # distil from the transcript teacher every N steps (its transcript forward is the dearest part)

    # --- losses ------------------------------------------------------------------------------------------------------
    value_weight: float = 3.0
    # the answer's ranking term: a cross-entropy among the first tokens of the kind's values (facts.values) where the
    # value begins, added to the answer with this weight; 0: off. Held-out misses mostly rank the truth second
    rank_weight: float = 0.0
    # the ranking term reads the state undetached, in a probe pass of its own that stops at the value's first token:
    # the write learns from the read's ranking of the kind's values as well as from the read-out (the reply's
    # cross-entropy and the distillation still stop at the state; needs rank_weight > 0)
    rank_to_write: bool = False
    readout_weight: float = 1.0
    # how the read-out standardises the states it names facts from: null, across each turn's rows of the batch (few
    # at a deep turn, where only the longer episodes still play); a number in (0, 1], by running moments of the
    # states moved by that share at every turn (ReadOut)
    readout_momentum: float | None = 0.05
    distill_weight: float = 1.0

    # --- evaluation during training: held-out recall (the read-out's accuracy during the write stage) -----------------
    eval_every: int = 100
    eval_episodes: int = 12
    eval_between: int = 4

    # --- runtime -------------------------------------------------------------------------------------------------
    threads: int | None = 2  # torch threads; None: torch's default
    device: str = "cpu"
    precision: str = (
        "auto"  # "bf16" autocast, "fp32", or "auto": bf16 where its matrix products are fast (GPU; CPU with native bf16)
    )

    def __post_init__(self) -> None:
        names = (
            "batch_size",
            "steps",
            "eval_every",
            "eval_episodes",
            "checkpoint_every",
            "n_facts",
            "probes_per_episode",
            "distill_every",
        )
        for name in names:
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"{name} must be an integer >= 1; got {getattr(self, name)!r}")
        if self.read_lr is not None and not self.read_lr > 0:
            raise ValueError(f"read_lr must be > 0 (or null: lr); got {self.read_lr}")
        if not 0 < self.min_lr <= self.lr or self.gate_lr <= 0 or self.readout_lr <= 0:
            raise ValueError(f"need 0 < min_lr <= lr and gate_lr, readout_lr > 0; got {self.min_lr}, {self.lr}, {self.gate_lr}")
        if (
            min(
                self.value_weight,
                self.rank_weight,
                self.readout_weight,
                self.distill_weight,
                self.warmup_steps,
                self.weight_decay,
            )
            < 0
        ):
            raise ValueError("loss weights, warmup_steps and weight_decay must be >= 0")
        if self.grad_clip <= 0:
            raise ValueError(f"grad_clip must be > 0; got {self.grad_clip}")
        stages = self.curriculum
        if not stages or any(len(s) != 2 or s[1] < 1 for s in stages) or stages[0][0] != 0:
            raise ValueError(f"curriculum must be [[0, turns], [step, turns], ...] with turns >= 1; got {stages}")
        if [s[0] for s in stages] != sorted(s[0] for s in stages):
            raise ValueError(f"curriculum steps must increase; got {stages}")
        if self.min_between is not None and (
            isinstance(self.min_between, bool) or not isinstance(self.min_between, int) or self.min_between < 0
        ):
            raise ValueError(f"min_between must be an integer >= 0 or null; got {self.min_between!r}")
        spans = self.cosine_steps
        if spans is not None:
            if not spans or any(len(c) != 2 or c[1] <= self.warmup_steps for c in spans) or spans[0][0] != 0:
                raise ValueError(
                    f"cosine_steps must be [[0, length], [step, length], ...] with length > warmup_steps; got {spans}"
                )
            if [c[0] for c in spans] != sorted({c[0] for c in spans}):
                raise ValueError(f"cosine_steps' steps must increase; got {spans}")
        if self.readout_momentum is not None and (
            isinstance(self.readout_momentum, bool)
            or not isinstance(self.readout_momentum, (int, float))
            or not 0 < self.readout_momentum <= 1
        ):
            raise ValueError(f"readout_momentum must be a number in (0, 1] or null; got {self.readout_momentum!r}")
        if not isinstance(self.rank_to_write, bool) or (self.rank_to_write and not self.rank_weight > 0):
            raise ValueError(f"rank_to_write must be true or false, and true needs rank_weight > 0; got {self.rank_to_write!r}")
        if self.kind_weights is not None:
            if not isinstance(self.kind_weights, dict):
                raise ValueError(f"kind_weights must be an object {{kind: weight}} or null; got {self.kind_weights!r}")
            facts.draw_kinds(random.Random(0), self.n_facts, self.kind_weights)  # validates kinds, weights and n_facts
        if self.precision not in ("auto", "bf16", "fp32"):
            raise ValueError(f"precision must be auto, bf16 or fp32; got {self.precision!r}")
        LlamaConfig.from_dict(self.model)  # validates the injection fields (an unknown one: ValueError)

    def cosine_length(self, step: int) -> int:
        """How many steps the cosine spans at ``step`` (``cosine_steps``, or the run's length)."""
        if self.cosine_steps is None:
            return self.steps
        return next(length for start, length in reversed(self.cosine_steps) if start <= step)

    def max_between(self, step: int) -> int:
        """The curriculum: the most unrelated turns between statement and question at ``step``."""
        return max(turns for start, turns in self.curriculum if start <= step)

    def between_range(self, top: int) -> tuple[int, int]:
        """The fewest and the most unrelated turns of an episode in a stage whose most is ``top``."""
        return (max(1, top // 2) if self.min_between is None else min(self.min_between, top)), top

    @classmethod
    def from_file(cls, path: str | Path) -> TrainConfig:
        data = read_json_object(path)
        check_fields(cls, data, "training config")
        return cls(**data)

    def to_file(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(asdict(self), indent=2) + "\n")
