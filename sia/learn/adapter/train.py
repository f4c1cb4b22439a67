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
"""

from __future__ import annotations

import json
import logging
import math
import random
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

from sia.backbones.chat_tokenizer import ChatTokenizer
from sia.backbones.llama import LlamaModel, bfloat16_products_fast
from sia.backbones.weights import read_hf, resolve_base
from sia.checkpoint import (
    BASE_FILE,
    DEFAULT_CACHE,
    DEFAULT_CHECKPOINT,
    BaseRef,
    load_identity,
    save_llama_checkpoint,
    source_digest,
)
from sia.identity.state import Dynamics
from sia.learn.adapter import facts
from sia.learn.adapter.unroll import (
    Carry,
    Rendered,
    persona_contexts,
    probe_logits,
    render_turn,
    score_candidates,
    span,
    transcript,
    write_turn,
)
from sia.model.config import LlamaConfig, check_fields, read_json_object
from sia.personas import PERSONAS

__all__ = [
    "ReadOut",
    "TrainConfig",
    "build_model",
    "heldout_recall",
    "train",
]

log = logging.getLogger(__name__)

READOUT_FILE = "readout.safetensors"
OPTIMIZER_FILE = "optimizer.safetensors"
TRAINER_FILE = "trainer.json"
ADAPTER_DIR = "adapter"  # the finished run's checkpoint to serve (``last`` keeps float32 weights to resume from)
HISTORY_FILE = "history.jsonl"
GATE_PARAMETERS = ("slot_bias", "self_update.gate.bias")  # scalars that open and shut: their own learning rate
READ_PARAMETERS = ("self_key", "self_value", "slot_gate")  # the slots' key and value maps, the read gate: config.read_lr


def _named(name: str, parts: Sequence[str]) -> bool:
    """Whether one of the dotted parts of parameter ``name`` is in ``parts``."""
    return any(part in parts for part in name.split("."))


def _is_read(name: str) -> bool:
    return _named(name, READ_PARAMETERS)


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
        LlamaConfig(**self.model)  # validates the injection fields

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


class ReadOut(nn.Module):
    """Training only: per fact kind, a linear classifier of the self state over that kind's training values.

    The states are standardised first, so that what tells users apart is what counts, at any scale. With ``momentum``
    null, across the rows of each call: a turn at which few episodes of the batch are still playing then gives a noisy
    standardisation, one episode alone a zero input, and the write no signal. With a momentum (the shipped recipe's),
    by running first and second moments of the states, moved by that share at every training call: one row is read
    as well as many."""

    def __init__(self, d_self: int, momentum: float | None = None) -> None:
        super().__init__()
        if momentum is not None and not 0 < momentum <= 1:
            raise ValueError(f"the read-out's momentum must be in (0, 1] or None; got {momentum}")
        self.heads = nn.ModuleDict({kind: nn.Linear(d_self, len(facts.values(kind, "train"))) for kind in facts.KINDS})
        self.index = {kind: {v: i for i, v in enumerate(facts.values(kind, "train"))} for kind in facts.KINDS}
        self.momentum = momentum
        self.moments: Tensor
        self.updates: Tensor
        self.register_buffer("moments", torch.zeros(2, d_self))  # running mean of s and of s², per feature
        self.register_buffer("updates", torch.zeros((), dtype=torch.long))  # 0: no running moments (standardise per call)

    @classmethod
    def saved(cls, path: str | Path, d_self: int) -> ReadOut:
        """The read-out saved at ``path``, for self states of ``d_self`` features."""
        readout = cls(d_self)
        readout.load(path)
        return readout

    def standardise(self, s: Tensor, update: bool = False) -> Tensor:
        """s (N, d_s) standardised per feature: by the running moments where there are any (moved first, with
        ``update`` and a momentum), else across the N rows."""
        s = s.float()
        if update and self.momentum is not None:
            with torch.no_grad():
                share = 1.0 if int(self.updates) == 0 else self.momentum
                self.moments.lerp_(torch.stack([s.mean(0), (s * s).mean(0)]), share)
                self.updates += 1
        if int(self.updates) > 0:
            mean, square = self.moments[0], self.moments[1]
            return (s - mean) / ((square - mean * mean).clamp_min(0).sqrt() + 1e-3)
        return (s - s.mean(0)) / (s.std(0) + 1e-3) if s.shape[0] > 1 else s

    def loss(self, s: Tensor, stated: list[facts.Fact], update: bool = False) -> tuple[Tensor, float]:
        """s (N, d_s): row i should name stated[i]'s value; mean cross-entropy over rows, and the share named right.
        ``update``: a training call, which moves the running moments (with a momentum). The rows of one kind are
        read together and the share is counted on the device: one host read per call, not one per row."""
        s = self.standardise(s, update)
        total, right = s.new_zeros(()), s.new_zeros((), dtype=torch.long)
        for kind in dict.fromkeys(fact.kind for fact in stated):
            rows = [i for i, fact in enumerate(stated) if fact.kind == kind]
            picked = s[torch.tensor(rows, device=s.device)]
            targets = torch.tensor([self.index[kind][stated[i].value] for i in rows], device=s.device)
            logits = self.heads[kind](picked)
            total = total + F.cross_entropy(logits, targets, reduction="sum")
            right = right + (logits.argmax(-1) == targets).sum()
        return total / len(stated), int(right) / len(stated)

    def load(self, path: str | Path) -> None:
        """The read-out saved at ``path``; one saved before running moments existed standardises per call."""
        tensors = load_file(str(path))
        if any(key.startswith("spell.") for key in tensors):
            raise ValueError(f"the read-out at {path} reads names and cities as tokens, which this trainer no longer does")
        if "moments" not in tensors:
            tensors = {**tensors, "moments": torch.zeros_like(self.moments), "updates": torch.zeros_like(self.updates)}
        self.load_state_dict(tensors)


# ---------------------------------------------------------------------------------------------------------
# Model and data
# ---------------------------------------------------------------------------------------------------------


def base_ref(config: TrainConfig) -> tuple[Path, BaseRef]:
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


@dataclass(frozen=True)
class Example:
    episode: facts.Episode
    context: list[int]  # the persona's system block
    distill_at: int  # the ordinary turn whose reply is distilled from the transcript teacher (-1: none)
    asked: tuple[int, ...]  # the probes asked this step


def _kinds(rng: random.Random, config: TrainConfig) -> tuple[str, ...] | None:
    """The kinds of a training episode's facts drawn by ``config.kind_weights`` (None: make_episode draws them)."""
    return None if config.kind_weights is None else facts.draw_kinds(rng, config.n_facts, config.kind_weights)


def sample_batch(config: TrainConfig, model: LlamaModel, step: int) -> list[Example]:
    """The batch of ``step``: a function of (seed, step) only, so a resumed run sees the same data."""
    rng = random.Random(f"{config.seed}:{step}")
    tok = model.tokenizer
    top = config.max_between(step)
    batch = []
    if step < config.write_stage_steps:  # the write stage: one statement turn per episode, nothing asked
        for _ in range(config.write_stage_batch):
            episode = facts.make_episode(rng, "train", between=0, kinds=_kinds(rng, config), n_facts=config.n_facts, opening=0)
            context = tok.system_prompt(PERSONAS[rng.choice(sorted(PERSONAS))].system_prompt)
            batch.append(Example(episode, context, -1, ()))
        return batch
    for _ in range(config.batch_size):
        between = rng.randint(*config.between_range(top))  # the stage's depths, down to min_between (or half its most)
        episode = facts.make_episode(rng, "train", between=between, kinds=_kinds(rng, config), n_facts=config.n_facts)
        persona = rng.choice(sorted(PERSONAS))
        context = tok.system_prompt(PERSONAS[persona].system_prompt)
        ordinary = [t for t in range(1, len(episode.turns)) if t != episode.stated_at]
        distill_at = rng.choice(ordinary) if ordinary and step % config.distill_every == 0 else -1
        asked = tuple(sorted(rng.sample(range(len(episode.probes)), min(config.probes_per_episode, len(episode.probes)))))
        batch.append(Example(episode, context, distill_at, asked))
    return batch


# ---------------------------------------------------------------------------------------------------------
# One step's loss
# ---------------------------------------------------------------------------------------------------------


def episode_losses(
    model: LlamaModel, readout: ReadOut, batch: list[Example], config: TrainConfig, dynamics: Dynamics
) -> dict[str, Tensor]:
    """The step's losses. The read's losses (the answer, the distillation) read a detached state and train the read
    only; the write learns from the read-out (and, with ``rank_to_write``, from the ranking term). The read's gradient
    would shut the write (gate closed, state constant; measured: the distillation alone took the held-out read-out
    from 89 % to 25 % in 150 steps)."""
    tok = model.tokenizer
    assert isinstance(tok, ChatTokenizer)
    B = len(batch)
    carry = Carry.fresh(model, B)
    readout_terms: list[Tensor] = []
    readout_right: list[float] = []
    distill_terms: list[Tensor] = []
    n_turns = max(len(ex.episode.turns) for ex in batch)
    for t in range(n_turns):
        active = [b for b, ex in enumerate(batch) if t < len(ex.episode.turns)]
        for grad in (True, False):
            rows = [b for b in active if (batch[b].distill_at == t) == grad]
            if not rows:
                continue
            turns = [
                render_turn(tok, batch[b].context, batch[b].episode.turns[t].user, batch[b].episode.turns[t].reply) for b in rows
            ]
            part, logits, _ = write_turn(model, carry.take(rows), turns, dynamics, grad_tokens=grad, read_detached=True)
            carry = carry.put(rows, part)
            if grad and config.distill_weight > 0:
                examples = [batch[b] for b in rows]
                distill_terms.append(_distill(model, examples, turns, logits))
        # read-out of every stated fact from each state from the statement on
        stated = [b for b in active if t >= batch[b].episode.stated_at]
        if stated and config.readout_weight > 0:
            owners = [b for b in stated for _ in batch[b].episode.facts]
            said = [f for b in stated for f in batch[b].episode.facts]
            term, right = readout.loss(carry.self_state[torch.tensor(owners, device=model.device)], said, update=True)
            readout_terms.append(term)
            readout_right.append(right)
    reading = Carry(carry.self_state.detach(), carry.trace, carry.shock)  # the read's losses stop at the state
    zero = carry.self_state.new_zeros((), dtype=torch.float32)
    asked = any(ex.asked for ex in batch)
    answer, named_value = _answer_loss(model, reading, batch, config, ranked=not config.rank_to_write) if asked else (zero, zero)
    if asked and config.rank_to_write:
        answer = answer + config.rank_weight * _ranking_loss(model, carry, batch)
    readout_loss = torch.stack(readout_terms).mean() if readout_terms else zero
    distill = torch.stack(distill_terms).mean() if distill_terms else zero
    spread = carry.self_state.detach().float().std(0).mean()  # how much the final states differ between users
    named = answer.new_tensor(sum(readout_right) / max(1, len(readout_right)))  # training read-out accuracy
    return {
        "answer": answer,
        "readout": readout_loss,
        "distill": distill,
        "spread": spread,
        "readout_acc": named,
        "answer_acc": named_value,
    }


def _answer_loss(
    model: LlamaModel, carry: Carry, batch: list[Example], config: TrainConfig, ranked: bool = True
) -> tuple[Tensor, Tensor]:
    """The probes' reply cross-entropy (value tokens weighted ``value_weight``; with ``rank_weight`` and ``ranked``,
    plus the ranking term among the kind's values), and the share of probes whose value's first token is the model's
    most likely next token there (the training-side twin of held-out recall)."""
    tok = model.tokenizer
    assert isinstance(tok, ChatTokenizer)
    rows, owners, spans, asking, choices = [], [], [], [], []
    for b, ex in enumerate(batch):
        for probe in (ex.episode.probes[j] for j in ex.asked):
            turn = render_turn(tok, ex.context, probe.question, probe.reply)
            head = len(tok.encode(probe.reply_prefix))
            if ranked and config.rank_weight > 0:
                choices.append(_value_choices(tok, ex, probe, turn, head))
            rows.append(turn.tokens)
            asking.append(len(turn.tokens) - turn.message[0])  # the question and the reply: what is differentiated
            owners.append(b)
            spans.append(
                (
                    turn.reply[0],
                    turn.reply[1],
                    turn.reply[0] + head,
                    turn.reply[0] + len(tok.encode(f"{probe.reply_prefix} {probe.value}")),
                )
            )
    tail = max(len(r) - sp[0] + 1 for r, sp in zip(rows, spans, strict=True))
    logits = probe_logits(model, carry.take(owners), rows, tail=tail, grad_tail=max(tail, *asking))
    total, weight, named = logits.new_zeros((), dtype=torch.float32), 0.0, 0
    at_value = []
    for i, (row, (a, e, va, ve)) in enumerate(zip(rows, spans, strict=True)):
        target = torch.tensor(row[a:e], device=logits.device)
        predicted = span(logits[i], len(row), a, e).float()  # (n, V)
        ce = F.cross_entropy(predicted, target, reduction="none")  # (n,)
        w = torch.ones_like(ce)
        w[va - a : ve - a] = config.value_weight
        total = total + (ce * w).sum()
        weight += float(w.sum())
        named += int(int(predicted[va - a].argmax()) == row[va])
        at_value.append(predicted[va - a])
    answer = total / weight
    if choices:
        answer = answer + config.rank_weight * _ranking(torch.stack(at_value), choices)
    return answer, total.new_tensor(named / len(rows))


def _ranking_loss(model: LlamaModel, carry: Carry, batch: list[Example]) -> Tensor:
    """The ranking term alone (``rank_to_write``): each probe's turn cut before its value, read under ``carry`` as
    given (its gradient reaches whatever made the state), the cross-entropy among the first tokens of the kind's
    values at the last position, averaged over the probes. The same figure as ``_answer_loss``'s term."""
    tok = model.tokenizer
    assert isinstance(tok, ChatTokenizer)
    rows, owners, asking, choices = [], [], [], []
    for b, ex in enumerate(batch):
        for probe in (ex.episode.probes[j] for j in ex.asked):
            turn = render_turn(tok, ex.context, probe.question, probe.reply)
            head = len(tok.encode(probe.reply_prefix))
            value_at = turn.reply[0] + head
            choices.append(_value_choices(tok, ex, probe, turn, head))
            rows.append(turn.tokens[:value_at])
            asking.append(value_at - turn.message[0])
            owners.append(b)
    logits = probe_logits(model, carry.take(owners), rows, tail=1, grad_tail=max(asking))[:, -1].float()  # (probes, V)
    return _ranking(logits, choices)


def _ranking(at_value: Tensor, choices: Sequence[tuple[list[int], int]]) -> Tensor:
    """The ranking term: the mean over probes of a cross-entropy among each probe's value choices (``_value_choices``),
    from its logits (probes, V) where the value begins."""
    terms = [
        F.cross_entropy(row[torch.tensor(ids, device=row.device)].unsqueeze(0), torch.tensor([truth], device=row.device))
        for row, (ids, truth) in zip(at_value, choices, strict=True)
    ]
    return torch.stack(terms).mean()


def _value_choices(tok: ChatTokenizer, ex: Example, probe: facts.Probe, turn: Rendered, head: int) -> tuple[list[int], int]:
    """The distinct tokens each value of ``probe``'s kind (in ``ex``'s split) begins with after the reply's prefix
    (``head`` tokens of ``turn``'s reply), and the index among them of the token the reply's own value begins with
    (added where no value's encoding began so)."""
    prefix, values = probe.reply_prefix, facts.values(probe.kind, ex.episode.split)
    true_id = turn.tokens[turn.reply[0] + head]
    firsts = (tok.encode(f"{prefix} {value}") for value in values)
    ids = list(dict.fromkeys(enc[head] for enc in firsts if len(enc) > head))
    if true_id not in ids:
        ids.append(true_id)
    return ids, ids.index(true_id)


def _distill(model: LlamaModel, examples: list[Example], turns: list[Any], student: Tensor) -> Tensor:
    """KL(teacher || student) per reply token of each example's turn ``distill_at``; the teacher is the base model
    (a fresh state) reading the whole transcript up to that turn."""
    tok = model.tokenizer
    assert isinstance(tok, ChatTokenizer)
    rows, spans = [], []
    for ex in examples:
        exchanges = [(x.user, x.reply) for x in ex.episode.turns[: ex.distill_at + 1]]
        tokens, reply_spans = transcript(tok, ex.context, exchanges)
        rows.append(tokens)
        spans.append(reply_spans[-1])
    with torch.no_grad():
        tail = max(len(r) - a + 1 for r, (a, _) in zip(rows, spans, strict=True))
        teacher = probe_logits(model, Carry.fresh(model, len(rows)), rows, tail=tail)
    terms = []
    for i, (row, (a, e), turn) in enumerate(zip(rows, spans, turns, strict=True)):
        p = F.log_softmax(span(teacher[i], len(row), a, e).float(), dim=-1)  # (n, V)
        q = F.log_softmax(span(student[i], len(turn.tokens), *turn.reply).float(), dim=-1)
        terms.append(F.kl_div(q, p, log_target=True, reduction="batchmean"))
    return torch.stack(terms).mean()


# ---------------------------------------------------------------------------------------------------------
# Held-out recall, the figure training is steered by
# ---------------------------------------------------------------------------------------------------------


@torch.no_grad()
def unroll_states(model: LlamaModel, episodes: list[facts.Episode], contexts: list[list[int]], dynamics: Dynamics) -> Carry:
    """The state of each episode after its last turn (every row written as the service writes it)."""
    tok = model.tokenizer
    assert isinstance(tok, ChatTokenizer)
    carry = Carry.fresh(model, len(episodes))
    for t in range(max(len(e.turns) for e in episodes)):
        rows = [b for b, e in enumerate(episodes) if t < len(e.turns)]
        turns = [render_turn(tok, contexts[b], episodes[b].turns[t].user, episodes[b].turns[t].reply) for b in rows]
        part, _, _ = write_turn(model, carry.take(rows), turns, dynamics, grad_tokens=True)
        carry = carry.put(rows, part)
    return carry


def probe_accuracy(
    model: LlamaModel, carry: Carry, episodes: list[facts.Episode], contexts: list[list[int]], chunk: int = 8
) -> Tensor:
    """(episodes, facts) bool: whether the true value ranks first among its kind's candidates under each state."""
    tok = model.tokenizer
    assert isinstance(tok, ChatTokenizer)
    right = torch.zeros(len(episodes), len(episodes[0].probes), dtype=torch.bool)
    jobs = [(b, j) for b, e in enumerate(episodes) for j in range(len(e.probes))]
    for start in range(0, len(jobs), chunk):
        part = jobs[start : start + chunk]
        probes = [episodes[b].probes[j] for b, j in part]
        prompts = [tok.turn_prompt(p.question, contexts[b])[0] for (b, _), p in zip(part, probes, strict=True)]
        candidates = [facts.values(p.kind, episodes[b].split) for (b, _), p in zip(part, probes, strict=True)]
        scores = score_candidates(model, carry.take([b for b, _ in part]), prompts, [p.reply_prefix for p in probes], candidates)
        for (b, j), p, sc, values in zip(part, probes, scores, candidates, strict=True):
            right[b, j] = values[int(sc.argmax())] == p.value
    return right


def heldout_set(model: LlamaModel, n: int, between: int, seed: int = 1) -> tuple[list[facts.Episode], list[list[int]]]:
    episodes = facts.episodes("heldout", n, seed, between=between, kinds=("colour", "pet", "hobby"))
    contexts = persona_contexts(model, n)
    return episodes, contexts


@torch.no_grad()
def heldout_readout(model: LlamaModel, readout: ReadOut, n: int, dynamics: Dynamics, between: int = 0) -> dict[str, float]:
    """The training read-out's accuracy on held-out statements of colour, pet and hobby (values it has seen, wordings
    it has not), from the state ``between`` unrelated turns after the statement turn; chance is 1/6."""
    episodes = facts.episodes("heldout", n, 2, between=between, kinds=("colour", "pet", "hobby"))
    carry = unroll_states(model, episodes, persona_contexts(model, n), dynamics)
    said = [f for e in episodes for f in e.facts]
    owners = torch.tensor([b for b, e in enumerate(episodes) for _ in e.facts], device=model.device)
    return {"readout": readout.loss(carry.self_state[owners], said)[1]}


def heldout_recall(model: LlamaModel, n: int, between: int, dynamics: Dynamics) -> dict[str, float]:
    episodes, contexts = heldout_set(model, n, between)
    carry = unroll_states(model, episodes, contexts, dynamics)
    right = probe_accuracy(model, carry, episodes, contexts)
    return {"per_fact": float(right.float().mean()), "all": float(right.all(dim=1).float().mean())}


# ---------------------------------------------------------------------------------------------------------
# Checkpoints
# ---------------------------------------------------------------------------------------------------------


def _save(
    directory: Path, model: LlamaModel, ref: BaseRef, readout: ReadOut, optimizer: torch.optim.Optimizer, step: int
) -> None:
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


def _resume(directory: Path, model: LlamaModel, readout: ReadOut, optimizer: torch.optim.Optimizer) -> int:
    from safetensors.torch import load_file as load

    identity = load(str(directory / "identity.safetensors"))
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


def _start_from(directory: Path, model: LlamaModel, ref: BaseRef, readout: ReadOut) -> None:
    """``config.init``: the identity parameters of the checkpoint at ``directory`` (its read-out, if it has one)."""
    if not (directory / BASE_FILE).is_file():
        raise ValueError(f"init {directory} is not a SIA checkpoint over a pretrained base (no {BASE_FILE})")
    if BaseRef.read(directory / BASE_FILE).sha256 != ref.sha256:
        raise ValueError(f"init {directory} was trained over other base weights than this run's")
    load_identity(model, directory)
    if (directory / READOUT_FILE).is_file():
        readout.load(directory / READOUT_FILE)


# ---------------------------------------------------------------------------------------------------------
# The loop
# ---------------------------------------------------------------------------------------------------------


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
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    gates = [p for n, p in named if n.endswith(GATE_PARAMETERS)]
    read = [p for n, p in named if _is_read(n)]
    rest = [p for n, p in named if not (n.endswith(GATE_PARAMETERS) or _is_read(n))]
    read_lr = config.lr if config.read_lr is None else config.read_lr
    optimizer = torch.optim.AdamW(
        [
            {"params": rest, "lr": config.lr, "weight_decay": config.weight_decay, "peak": config.lr},
            {"params": read, "lr": read_lr, "weight_decay": config.weight_decay, "peak": read_lr},
            {"params": gates, "lr": config.gate_lr, "weight_decay": 0.0, "peak": config.gate_lr},
            {"params": list(readout.parameters()), "lr": config.readout_lr, "weight_decay": 0.0, "peak": config.readout_lr},
        ]
    )
    step = 0
    last = out / "last"
    if (last / TRAINER_FILE).is_file():
        step = _resume(last, model, readout, optimizer)
        log.info("resumed %s at step %d", last, step)
    elif config.init is not None:
        _start_from(Path(config.init), model, ref, readout)
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
            _save(last, model, ref, readout, optimizer, step)
        if step == config.steps:  # what a deployment serves: the identity parameters in config.model's weights_dtype
            save_llama_checkpoint(model, out / ADAPTER_DIR, ref)
        if progress:
            _progress(
                step, config.steps, {k: float(v.detach()) for k, v in losses.items()}, done_here / (time.perf_counter() - started)
            )
    if progress:
        sys.stderr.write("\n")
    return out
