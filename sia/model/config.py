"""The model configuration: the single source of truth for shapes, dynamics and stabilisation.

A checkpoint carries its config (``to_file``/``from_file``), so a saved model always rebuilds exactly.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Self

import torch

from sia.model.language import UNTOLD

ATTENTION_VARIANTS = ("trace", "dot")
POOLING_VARIANTS = ("mean", "attention")


READ_SHIFT_BOUND = 20.0  # the read shift's range, either way: e^20 is past any logit the slots reach

STATE_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def _real(value: object) -> bool:
    """Whether a config value is a plain number (an int or a float, not a bool)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@dataclass
class IdentityConfig:
    """The identity-state fields every model family shares: its size, its dynamics, its metric and its shock."""

    # --- identity state ---
    d_self: int = 16  # self-state dimension d_s
    pooling: str = "mean"  # how a turn's hidden states pool into z: "mean", or "attention" (a learned score per token)
    memory_tokens: int = 0  # K > 0: z is the final hidden states of K learned tokens read after each turn (LLaMA only)
    write_gate: bool = False  # the self update is gated per dimension, s + eta sigma(G[z; s]) (tanh(W[z; s]) - s)

    # --- identity dynamics (defaults; a persona may override them) ---
    alpha: float = 0.1  # plasticity: how strongly a turn imprints the trace
    decay: float = 0.95  # lambda: temporal decay of the trace per turn
    eta: float = 0.5  # self-state step size, in (0, 1]

    # --- metric stabilisation (docs/attention.md, "Stabilising the metric") ---
    metric_max_deform: float = 0.5  # rho in [0, 1): how far the trace may move the metric's eigenvalues
    metric_temperature: float = 1.0  # tau > 0: trace eigenvalue scale at which the deformation saturates

    # --- shock (docs/attention.md, "Shock") ---
    shock_prior_mean: float = 2.0  # nats/token assumed before an identity has any history
    shock_prior_std: float = 1.0
    shock_prior_weight: float = 2.0  # pseudo-count of the prior in the running statistics
    shock_clip: float = 8.0  # standardised shock is clipped to [-clip, clip]

    # --- files: a checkpoint carries its config ---
    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Self:
        data = drop_removed(data)
        check_fields(cls, data, "config")
        return cls(**data)

    def to_file(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n")

    @classmethod
    def from_file(cls, path: str | Path) -> Self:
        return cls.from_dict(read_json_object(path))

    def _check_identity(self) -> None:
        if not isinstance(self.d_self, int) or self.d_self <= 0:
            raise ValueError(f"d_self must be a positive integer; got {self.d_self!r}")
        if self.pooling not in POOLING_VARIANTS:
            raise ValueError(f"pooling must be one of {POOLING_VARIANTS}; got {self.pooling!r}")
        if not isinstance(self.memory_tokens, int) or isinstance(self.memory_tokens, bool) or self.memory_tokens < 0:
            raise ValueError(f"memory_tokens must be an integer >= 0; got {self.memory_tokens!r}")
        if not isinstance(self.write_gate, bool):
            raise ValueError(f"write_gate must be true or false; got {self.write_gate!r}")
        if not self.alpha >= 0.0:
            raise ValueError(f"alpha (plasticity) must be >= 0; got {self.alpha}")
        if not 0.0 < self.decay <= 1.0:
            raise ValueError(f"decay (lambda) must be in (0, 1]; got {self.decay}")
        if not 0.0 < self.eta <= 1.0:
            raise ValueError(f"eta must be in (0, 1] so the self state stays in [-1, 1]; got {self.eta}")
        if not 0.0 <= self.metric_max_deform < 1.0:
            raise ValueError(
                f"metric_max_deform must be in [0, 1) to keep the metric positive definite; got {self.metric_max_deform}"
            )
        if not self.metric_temperature > 0.0:
            raise ValueError(f"metric_temperature must be > 0; got {self.metric_temperature}")
        if not self.shock_prior_std > 0.0:
            raise ValueError(f"shock_prior_std must be > 0; got {self.shock_prior_std}")
        if not self.shock_prior_weight > 0.0:
            raise ValueError(f"shock_prior_weight must be > 0; got {self.shock_prior_weight}")
        if not self.shock_clip > 0.0:
            raise ValueError(f"shock_clip must be > 0; got {self.shock_clip}")


@dataclass
class ModelConfig(IdentityConfig):
    """The native SIA model: byte-level, trained from scratch, Trace Tensor Attention replaces dot products."""

    # --- transformer shape ---
    vocab_size: int = 260  # the byte tokenizer: 256 bytes + 4 special tokens
    block_size: int = 512  # longest context (tokens) the position table covers
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128  # residual width; value/head width = n_embd // n_head
    mlp_ratio: int = 4
    dropout: float = 0.0

    # --- attention variant (registry in sia/model/native.py) ---
    attention: str = "trace"  # "trace": TTA + self slot; "dot": plain dot-product attention, no state (the twin)

    def __post_init__(self) -> None:
        positive = ("vocab_size", "block_size", "n_layer", "n_head", "n_embd", "mlp_ratio")
        for name in positive:
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive integer; got {value!r}")
        if self.n_embd % self.n_head != 0:
            raise ValueError(f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})")
        if self.head_dim < 2:
            raise ValueError(f"n_embd // n_head must be at least 2 (one query/key column + the bias slot); got {self.head_dim}")
        if self.attention not in ATTENTION_VARIANTS:
            raise ValueError(f"attention must be one of {ATTENTION_VARIANTS}; got {self.attention!r}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1); got {self.dropout}")
        if self.memory_tokens:
            raise ValueError("the native model writes from pooled hidden states; memory_tokens must be 0")
        self._check_identity()

    # --- derived values ---
    @property
    def head_dim(self) -> int:
        """Value width per head; also the width the attention kernel runs at."""
        return self.n_embd // self.n_head

    @property
    def qk_dim(self) -> int:
        """Query/key width d: one less than head_dim, leaving exactly the slot of the key-bias column."""
        return self.head_dim - 1

    @property
    def metric_base(self) -> float:
        """c = 1 / (2 sqrt(d)): with the metric c·I the cross term of the distance is q·k / sqrt(d)."""
        return 1.0 / (2.0 * math.sqrt(self.qk_dim))

    @property
    def metric_offset(self) -> float:
        """The metric is c (offset I + rho deformation): the native model's attention *is* the metric, offset 1."""
        return 1.0

    @property
    def trace_shape(self) -> tuple[int, int, int, int]:
        """(trace layers, trace heads, d, d): one trace per layer and head."""
        return (self.n_layer, self.n_head, self.qk_dim, self.qk_dim)

    @property
    def trace_layer_ids(self) -> list[int]:
        return list(range(self.n_layer))

    @property
    def imprint_tokens(self) -> int:
        """The native model keeps no imprint."""
        return 0

    @property
    def imprint_shape(self) -> tuple[int, int, int, int]:
        return (self.n_layer, self.n_head, 0, self.head_dim)

    @property
    def imprint_bits(self) -> int:
        return 8

    @property
    def imprint_ask_bias(self) -> float:
        return 0.0

    @property
    def imprint_copy(self) -> float:
        return 0.0

    @property
    def imprint_untold(self) -> list[str] | None:
        return None

    @property
    def imprint_untold_by_label(self) -> list[str] | None:
        return None

    @property
    def imprint_echo(self) -> list[str] | None:
        return None

    @property
    def state_dtype(self) -> str:
        return "float32"


@dataclass
class LlamaConfig(IdentityConfig):
    """A LLaMA-family backbone with Trace Tensor Attention and the self slot injected (docs/attention.md, "Injection").

    The backbone fields come from the base checkpoint (``from_hf``); the defaults are SmolLM2-135M-Instruct's.
    """

    # --- backbone shape ---
    vocab_size: int = 49152
    block_size: int = 8192  # context length in tokens
    n_layer: int = 30
    n_head: int = 9  # query heads
    n_kv_head: int = 3  # key/value heads (grouped-query attention: n_head / n_kv_head queries share one)
    n_embd: int = 576
    head_dim: int = 64
    intermediate_size: int = 1536  # SwiGLU hidden width
    rope_theta: float = 100000.0
    norm_eps: float = 1e-5  # RMSNorm epsilon
    tie_embeddings: bool = True

    # --- injection ---
    attention: str = "trace"  # "trace": base logits + metric deformation + self slot; "dot": the base model, no state
    d_self: int = 64
    self_slots: int = 1  # self-slot key/value pairs per key/value head in every layer, each read from s
    slot_rank: int | None = None  # the rank of each layer's maps from s to the slots' keys and values; None: full
    # a per-token read gate: every layer adds g_h·x_i (x_i the query token's normalised input, one g per query head,
    # zero at start) to the slots' logits, so the read can open on some tokens (answers about the user) and shut on others
    slot_gate: bool = False
    # the read's strength this adapter serves at: every slot's logit lowered by it (its attention weight times about
    # e^-shift). Not a shape: a calibration of memory against language, set by ``sia export --read-shift``
    read_shift: float = 0.0
    weights_dtype: str = "float32"  # storage dtype of the identity parameters in a checkpoint (loading casts to float32)
    trace_layers: list[int] | None = None  # layers carrying a trace; None: every third layer from 0
    trace_per_head: bool = True  # a trace per key/value head, or one shared by the layer's heads
    state_dtype: str = "float16"  # storage dtype of the trace: float32, float16 or bfloat16
    metric_scale: float = 2.0  # c: the metric's eigenvalues stay in c·rho·(-1, 1); logits move by at most 4·c·rho
    # the eigenpairs of each trace layer's metric that attention carries, the largest in magnitude (a trace layer's keys
    # are this much wider than the base model's, not head_dim); the ones left out move a logit by at most 4 times their
    # largest magnitude (sia.identity.state.metric_factors). None: all head_dim, the metric exactly
    metric_rank: int | None = None
    # --- the imprint (sia.identity.imprint): the user's own words as key/value entries, read beside the self slots ---
    imprint_tokens: int = 0  # N: entries (tokens) per layer and key/value head; 0: no imprint
    imprint_bits: int = 8  # an entry's key and value: 8 (int8) or 4 (two a byte), one float16 scale per vector
    imprint_span: int = 16  # the longest span one clause imprints, in tokens
    imprint_per_turn: int = 40  # the most tokens one message imprints
    imprint_min_shock: float = 4.0  # a clause is imprinted only if a token of it surprises the identity this much (nats)
    # a message that asks the persona something, or says nothing of its writer (no "I", "my", "we"...), is mostly not
    # about the user: its spans' scores are multiplied by this, so its chatter goes before what the user told of
    # themself when the imprint is full (``imprint.aside``). 1: every message alike
    imprint_aside_weight: float = 1.0
    # in a message that corrects what the user said before, the clause carrying each correction ("ah no sorry, 21 May")
    # is imprinted first whatever its shock (a newer value surprises little right after the older one) and scores this
    # many nats more, so later chatter does not push it out (``imprint.mends``). 0: such a clause is ranked as any
    imprint_mend_bonus: float = 0.0
    # the imprint's read adapter: a low-rank change of every layer's query, value and output maps, applied only in rows
    # whose imprint holds something (so a fresh identity stays the base model), trained to answer from the user's words
    imprint_read_rank: int = 0  # 0: none
    # the imprint's per-token read gate: every layer adds g_h·x_i + b_h (x_i the reading token's normalised input, one
    # per query head, zero at start) to the imprinted entries' logits, so ordinary tokens can shut the imprint and
    # answers about the user open it; applied only where entries are present (a fresh identity stays the base model)
    imprint_gate: bool = False
    imprint_kinds_layer: int | None = None  # the layer whose input the kind tagger reads; None: no tagger (kinds unknown)
    # a clause's kind is stored with its span when the tagger's mean probability of it reaches this (the ask head's match
    # and eviction read it: a labelled span goes after the unlabelled ones); only a label reaching 1/2 puts the clause
    # first in the turn's choice and replaces the older spans of its kind
    imprint_label_min: float = 0.5
    # the imprint's strength, as read_shift is the slots': every imprinted entry's logit lowered by it (memory against
    # language; measured in docs/model.md)
    imprint_shift: float = 0.0
    # matching the question's kind to the entries' (the kind tagger's labels): a head on the tagger's layer tells what
    # kind of fact a message asks about; its entries' logits are raised by this, another kind's lowered by it, those
    # of unknown kind left alone, for the whole turn. 0: no such head (every entry read alike)
    imprint_ask_bias: float = 0.0
    # the kinds of fact (keys of sia.model.language.UNTOLD) for which a question the ask head is sure of, asked where
    # the imprint holds entries but none of that kind, is answered by saying the user has not told it ("I don't think
    # you've told me your favourite colour. What is it?") instead of being read from the imprint; None: none. Where the
    # imprint keeps its spans' text, a span naming a value of the kind (sia.model.language.names_kind) keeps it away
    imprint_untold: list[str] | None = None
    # the kinds of imprint_untold answered so where the imprint does not keep every span's text (SIA_STORE_TURN_TEXT=
    # false), the tagger's labels alone deciding: a kind whose clauses the tagger leaves unlabelled too often is better
    # read than said untold there; None: every kind of imprint_untold
    imprint_untold_by_label: list[str] | None = None
    # the kinds of fact (keys of sia.model.language.UNTOLD) whose recall replies open by saying back the user's own
    # clause: a question the ask head takes for one of them (its likeliest kind, p(none) < 1/2), asked where the imprint
    # holds entries, is answered "You told me you ..." and the read goes on from there ("I restore pipe organs" -> "You
    # told me you restore pipe organs"; sia.model.language.ECHO_OPENING, ImprintEntries.echoed); None: none
    imprint_echo: list[str] | None = None
    # the imprint's copy read: each next token's distribution mixed with the imprinted tokens, an entry's token weighted
    # by the attention the query heads of ``imprint_copy_layers`` (or ``imprint_copy_heads``) give that entry (their
    # mean), times this (and by the ask head's 1 - p(no fact asked)): p = (p_model + lam·a) / (1 + lam·|a|). Needs the
    # entries' token ids: an imprint that keeps no text (SIA_STORE_TURN_TEXT=false) is read without it. 0: none
    imprint_copy: float = 0.0
    imprint_copy_layers: list[int] | None = None  # the layers whose attention points the copy; None: the last third
    # [layer, query head] pairs whose attention points the copy (their layers are the copy layers); None: every query
    # head of imprint_copy_layers
    imprint_copy_heads: list[list[int]] | None = None

    def __post_init__(self) -> None:
        positive = ("vocab_size", "block_size", "n_layer", "n_head", "n_kv_head", "n_embd", "head_dim", "intermediate_size")
        for name in positive:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"{name} must be a positive integer; got {value!r}")
        if self.n_head % self.n_kv_head != 0:
            raise ValueError(f"n_head ({self.n_head}) must be a multiple of n_kv_head ({self.n_kv_head})")
        if self.head_dim % 2 != 0:
            raise ValueError(f"head_dim must be even for rotary embeddings; got {self.head_dim}")
        if not (self.rope_theta > 0 and self.norm_eps > 0):
            raise ValueError(f"rope_theta and norm_eps must be > 0; got {self.rope_theta}, {self.norm_eps}")
        if self.attention not in ATTENTION_VARIANTS:
            raise ValueError(f"attention must be one of {ATTENTION_VARIANTS}; got {self.attention!r}")
        if not isinstance(self.self_slots, int) or isinstance(self.self_slots, bool) or self.self_slots < 1:
            raise ValueError(f"self_slots must be an integer >= 1; got {self.self_slots!r}")
        if self.slot_rank is not None:
            full = min(self.d_self, self.n_kv_head * self.self_slots * self.head_dim)
            if not isinstance(self.slot_rank, int) or isinstance(self.slot_rank, bool) or not 1 <= self.slot_rank < full:
                raise ValueError(f"slot_rank must be an integer in [1, {full}) (or null: full rank); got {self.slot_rank!r}")
        if not isinstance(self.slot_gate, bool):
            raise ValueError(f"slot_gate must be true or false; got {self.slot_gate!r}")
        if self.weights_dtype not in STATE_DTYPES:
            raise ValueError(f"weights_dtype must be one of {sorted(STATE_DTYPES)}; got {self.weights_dtype!r}")
        shift = self.read_shift
        if not _real(shift) or not -READ_SHIFT_BOUND <= shift <= READ_SHIFT_BOUND:
            raise ValueError(f"read_shift must be a number in [-{READ_SHIFT_BOUND}, {READ_SHIFT_BOUND}]; got {shift!r}")
        self.read_shift = float(shift)
        if self.trace_layers is None:
            self.trace_layers = list(range(0, self.n_layer, 3))
        layers = self.trace_layers
        if not all(isinstance(i, int) and 0 <= i < self.n_layer for i in layers) or len(set(layers)) != len(layers):
            raise ValueError(f"trace_layers must be distinct layer indices in [0, {self.n_layer}); got {layers}")
        self.trace_layers = sorted(layers)
        if self.state_dtype not in STATE_DTYPES:
            raise ValueError(f"state_dtype must be one of {sorted(STATE_DTYPES)}; got {self.state_dtype!r}")
        if not self.metric_scale > 0.0:
            raise ValueError(f"metric_scale must be > 0; got {self.metric_scale}")
        rank = self.metric_rank
        if rank is not None and (not isinstance(rank, int) or isinstance(rank, bool) or not 1 <= rank <= self.head_dim):
            raise ValueError(f"metric_rank must be null or an integer in [1, head_dim={self.head_dim}]; got {rank!r}")
        for name in ("imprint_tokens", "imprint_span", "imprint_per_turn", "imprint_read_rank"):
            value, least = getattr(self, name), 1 if name in ("imprint_span", "imprint_per_turn") else 0
            if not isinstance(value, int) or isinstance(value, bool) or value < least:
                raise ValueError(f"{name} must be an integer >= {least}; got {value!r}")
        if not isinstance(self.imprint_gate, bool):
            raise ValueError(f"imprint_gate must be true or false; got {self.imprint_gate!r}")
        if self.imprint_bits not in (4, 8) or isinstance(self.imprint_bits, bool):
            raise ValueError(f"imprint_bits must be 8 or 4; got {self.imprint_bits!r}")
        if self.imprint_bits == 4 and self.head_dim % 2:
            raise ValueError(f"imprint_bits 4 packs two values a byte: head_dim must be even; got {self.head_dim}")
        aside = self.imprint_aside_weight
        if not _real(aside) or not 0 < aside <= 1:
            raise ValueError(f"imprint_aside_weight must be a number in (0, 1]; got {aside!r}")
        self.imprint_aside_weight = float(aside)
        mend = self.imprint_mend_bonus
        if not _real(mend) or not 0 <= mend < math.inf:
            raise ValueError(f"imprint_mend_bonus must be a finite number of nats >= 0; got {mend!r}")
        self.imprint_mend_bonus = float(mend)
        imprint_shift = self.imprint_shift
        if not _real(imprint_shift) or not math.isfinite(imprint_shift):
            raise ValueError(f"imprint_shift must be a finite number; got {imprint_shift!r}")
        self.imprint_shift = float(imprint_shift)
        kinds = self.imprint_kinds_layer
        if kinds is not None and (not isinstance(kinds, int) or isinstance(kinds, bool) or not 0 <= kinds < self.n_layer):
            raise ValueError(f"imprint_kinds_layer must be a layer index in [0, {self.n_layer}) or null; got {kinds!r}")
        label = self.imprint_label_min
        if not _real(label) or not 0 < label <= 0.5:
            raise ValueError(f"imprint_label_min must be a probability in (0, 0.5]; got {label!r}")
        self.imprint_label_min = float(label)
        ask = self.imprint_ask_bias
        if not _real(ask) or not math.isfinite(ask) or ask < 0:
            raise ValueError(f"imprint_ask_bias must be a finite number >= 0; got {ask!r}")
        self.imprint_ask_bias = float(ask)
        if ask and (kinds is None or not self.imprint_tokens):
            raise ValueError("imprint_ask_bias needs an imprint and its kind tagger (imprint_kinds_layer)")
        for name in ("imprint_untold", "imprint_untold_by_label", "imprint_echo"):  # kinds whose replies the ask head decides
            listed = getattr(self, name)
            if listed is None:
                continue
            if not isinstance(listed, list) or not all(isinstance(k, str) and k in UNTOLD for k in listed):
                raise ValueError(f"{name} must be a list of kinds among {sorted(UNTOLD)}; got {listed!r}")
            if listed and not ask:
                raise ValueError(f"{name} needs the ask head (imprint_ask_bias > 0)")
            setattr(self, name, sorted(set(listed)))
        unchecked = set(self.imprint_untold_by_label or ()) - set(self.imprint_untold or ())
        if unchecked:
            raise ValueError(f"imprint_untold_by_label must be kinds of imprint_untold; {sorted(unchecked)} are not")
        if not math.isfinite(self.imprint_min_shock):
            raise ValueError(f"imprint_min_shock must be a finite number of nats; got {self.imprint_min_shock}")
        self._check_copy()
        self._check_identity()

    def _check_copy(self) -> None:
        copy = self.imprint_copy
        if not _real(copy) or not math.isfinite(copy) or copy < 0:
            raise ValueError(f"imprint_copy must be a finite number >= 0; got {copy!r}")
        self.imprint_copy = float(copy)
        if copy and not self.imprint_tokens:
            raise ValueError("imprint_copy needs an imprint (imprint_tokens > 0)")
        heads = self.imprint_copy_heads
        if heads is not None:
            if (
                not isinstance(heads, list)
                or not heads
                or not all(isinstance(p, (list, tuple)) and len(p) == 2 for p in heads)
                or not all(isinstance(i, int) and not isinstance(i, bool) for p in heads for i in p)
                or not all(0 <= p[0] < self.n_layer and 0 <= p[1] < self.n_head for p in heads)
                or len({tuple(p) for p in heads}) != len(heads)
            ):
                raise ValueError(
                    f"imprint_copy_heads must be distinct [layer, query head] pairs, layers in [0, {self.n_layer}), "
                    f"heads in [0, {self.n_head}); got {heads!r}"
                )
            self.imprint_copy_heads = sorted([int(p[0]), int(p[1])] for p in heads)
            of_heads = sorted({p[0] for p in self.imprint_copy_heads})
            if self.imprint_copy_layers is not None and sorted(self.imprint_copy_layers) != of_heads:
                raise ValueError(f"imprint_copy_layers {self.imprint_copy_layers} are not imprint_copy_heads' layers {of_heads}")
            self.imprint_copy_layers = of_heads
        if self.imprint_copy_layers is None:
            self.imprint_copy_layers = list(range(self.n_layer - max(1, self.n_layer // 3), self.n_layer))
        layers = self.imprint_copy_layers
        if (
            not isinstance(layers, list)
            or not layers
            or not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < self.n_layer for i in layers)
            or len(set(layers)) != len(layers)
        ):
            raise ValueError(f"imprint_copy_layers must be distinct layer indices in [0, {self.n_layer}); got {layers!r}")
        self.imprint_copy_layers = sorted(layers)

    def copy_heads(self, layer: int) -> list[int] | None:
        """The query heads of a copy layer whose attention points the copy read; None: every one."""
        if self.imprint_copy_heads is None:
            return None
        return [head for at, head in self.imprint_copy_heads if at == layer]

    # --- derived values ---
    @property
    def qk_dim(self) -> int:
        """The width the metric acts on: a key/value head's pre-rotation query/key width."""
        return self.head_dim

    @property
    def metric_base(self) -> float:
        return self.metric_scale

    @property
    def metric_offset(self) -> float:
        """Injected: the metric deforms the base logits and vanishes for a zero trace, offset 0."""
        return 0.0

    @property
    def trace_layer_ids(self) -> list[int]:
        assert self.trace_layers is not None  # set in __post_init__
        return self.trace_layers

    @property
    def trace_heads(self) -> int:
        return self.n_kv_head if self.trace_per_head else 1

    @property
    def trace_shape(self) -> tuple[int, int, int, int]:
        """(trace layers, trace heads, d, d)."""
        return (len(self.trace_layer_ids), self.trace_heads, self.head_dim, self.head_dim)

    @property
    def imprint_shape(self) -> tuple[int, int, int, int]:
        """(layers, key/value heads, N entries, d): the imprint's keys and values."""
        return (self.n_layer, self.n_kv_head, self.imprint_tokens, self.head_dim)

    @property
    def state_bytes(self) -> int:
        """Bytes of the trace, the self state and the imprint in a stored identity (the container adds a few hundred):
        an imprint entry costs, per layer and key/value head, a key and a value of ``imprint_bits`` a number and their
        float16 scales, plus 24 bytes of bookkeeping: 2·(d + 2) bytes in int8, 2·(d/2 + 2) in 4 bits (float16 would
        cost 4·d)."""
        n = self.trace_shape[0] * self.trace_shape[1] * self.trace_shape[2] * self.trace_shape[3]
        per_head = 2 * (self.head_dim * self.imprint_bits // 8 + 2)
        imprint = self.imprint_tokens * (self.n_layer * self.n_kv_head * per_head + 24)
        return n * STATE_DTYPES[self.state_dtype].itemsize + 4 * self.d_self + imprint

    # --- from a base checkpoint ---
    @classmethod
    def from_hf(cls, hf: dict[str, Any], **overrides: Any) -> LlamaConfig:
        """The backbone fields of a Hugging Face LLaMA ``config.json``, plus any identity fields given."""
        try:
            n_head = int(hf["num_attention_heads"])
            fields_ = {
                "vocab_size": int(hf["vocab_size"]),
                "block_size": int(hf.get("max_position_embeddings", 2048)),
                "n_layer": int(hf["num_hidden_layers"]),
                "n_head": n_head,
                "n_kv_head": int(hf.get("num_key_value_heads") or n_head),
                "n_embd": int(hf["hidden_size"]),
                "head_dim": int(hf.get("head_dim") or int(hf["hidden_size"]) // n_head),
                "intermediate_size": int(hf["intermediate_size"]),
                "rope_theta": float(hf.get("rope_theta", 10000.0)),
                "norm_eps": float(hf.get("rms_norm_eps", 1e-6)),
                "tie_embeddings": bool(hf.get("tie_word_embeddings", False)),
            }
        except KeyError as exc:
            raise ValueError(f"the base model's config.json lacks {exc.args[0]!r}") from exc
        scaling = hf.get("rope_scaling")
        if scaling and scaling.get("rope_type", scaling.get("type", "default")) != "default":
            raise ValueError(f"rope_scaling {scaling!r} is not supported; only plain RoPE")
        if hf.get("attention_bias") or hf.get("mlp_bias"):
            raise ValueError("LLaMA checkpoints with attention or MLP biases are not supported")
        overrides = drop_removed(overrides)
        check_fields(cls, overrides, "config")
        return cls(**{**fields_, **overrides})


AnyConfig = ModelConfig | LlamaConfig


def read_json_object(path: str | Path) -> dict[str, Any]:
    """A JSON file holding one object; ValueError naming the file otherwise."""
    try:
        data = json.loads(Path(path).read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object of config fields")
    return data


# Options that were removed, each with the one value an old config may still carry: the behaviour that remains.
# fresh_write (the write reading each turn in a pass of its own with a fresh identity) recalled less than the write
# after the reply; the last commit that had it is 65d69af.
REMOVED_FIELDS: dict[str, object] = {"fresh_write": False}


def drop_removed(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` without the keys of removed options that hold their remaining value (an old checkpoint's config);
    ValueError for a key that asks for a removed behaviour."""
    kept = dict(data)
    for name, remaining in REMOVED_FIELDS.items():
        if name in kept and kept.pop(name) is not remaining:
            raise ValueError(
                f"{name}={data[name]!r}: the {name} option was removed; only {remaining!r}, the behaviour that remains, "
                f"is accepted from an old config (or leave the key out)"
            )
    return kept


def check_fields(cls: type, data: dict[str, Any], what: str) -> None:
    """Refuse keys that are not fields of the dataclass ``cls``, listing the known ones."""
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f"unknown {what} keys {unknown}; known keys are {sorted(known)}")
