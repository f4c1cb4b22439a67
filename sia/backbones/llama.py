"""A LLaMA-family causal LM with Trace Tensor Attention and the self slot injected into every layer's attention
(sia.backbones.injected_attention; docs/attention.md, "Injecting into a pretrained model"): the pretrained logits
stay, the identity adds to them, and a fresh identity reads exactly as the base model.

Notation: B batch, L tokens in this call, C residual width, H query heads, H_kv key/value heads, d head width,
d_s self-state width, K memory tokens.
"""

from __future__ import annotations

import copy
import math
import re
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import replace

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from sia.backbones.injected_attention import (
    CLOSED_GATE,
    CopyPlan,
    EntryReads,
    InjectedAttention,
    InjectedLayer,
    row_starts,
)
from sia.backbones.packed_linear import (
    NO_BFLOAT16_PACKING,
    PACKED_DTYPES,
    Linear,
    Stacked,
    bfloat16_packing_available,
    cast,
    packing_available,
)
from sia.backbones.slot_maps import LowRank, init_slot_map
from sia.identity.imprint import KINDS, ImprintEntries, asks_a_fact
from sia.identity.state import SelfUpdate, TurnSummary, metric_factors
from sia.model.conditioning import Conditioning
from sia.model.config import LlamaConfig
from sia.model.generate import likeliest
from sia.model.identity_model import IdentityModel, ModelOutput, WordsRead
from sia.model.kv_cache import KVCache
from sia.model.summary_sums import SummarySums
from sia.model.tokenizer import Tokenizer

__all__ = ["IDENTITY_PARAMETERS", "LlamaModel", "asks_a_fact", "copied", "hf_name"]

# Untrained, the slot is shut: its value is zero, and any mass it took would dilute the base model's attention. A
# finite bias cannot shut it everywhere (some heads' logits all lie far below zero, e.g. -15, where a slot at -12
# still wins), so it starts at the closed gate; training starts it open (e.g. at 0) to give the read a gradient.
UNTRAINED_SLOT_BIAS = CLOSED_GATE
PREFIX_READS = 8  # the shared prefixes (personas' prompts) whose base read read_words keeps
# names SIA adds
IDENTITY_PARAMETERS = (
    "self_key", "self_value", "slot_bias", "slot_gate", "self_update", "pool", "memory", "imprint_read", "imprint_kind",
    "imprint_gate", "imprint_ask",
)  # fmt: skip


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        """weight · x / sqrt(mean(x²) + eps), the statistics in float32, as the pretrained models compute it. A float32
        x goes through torch's fused form, the same operations in the same order (bit for bit the same, tested) in one
        call instead of seven: a decoding step normalises 61 times."""
        if x.dtype == torch.float32 and self.weight.dtype == torch.float32:
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        h = cast(x, torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * cast(h, x.dtype)


class SwiGLU(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.gate_proj = Linear(config.n_embd, config.intermediate_size, bias=False)
        self.up_proj = Linear(config.n_embd, config.intermediate_size, bias=False)
        self.down_proj = Linear(config.intermediate_size, config.n_embd, bias=False)
        self.gate_up = Stacked([self.gate_proj, self.up_proj])  # inference's one product of the two

    def forward(self, x: Tensor) -> Tensor:
        if torch.is_grad_enabled():
            out: Tensor = self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
            return out
        both = self.gate_up(x)  # (..., 2·I): the gate's and the up map's products
        n = self.gate_proj.out_features
        out = self.down_proj(F.silu(both[..., :n]) * both[..., n:])
        return out


class Block(nn.Module):
    def __init__(self, config: LlamaConfig, has_trace: bool) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(config.n_embd, config.norm_eps)
        self.attn = InjectedAttention(config, has_trace)
        self.mlp_norm = RMSNorm(config.n_embd, config.norm_eps)
        self.mlp = SwiGLU(config)

    def forward(
        self,
        x: Tensor,
        lc: InjectedLayer | None,
        rope: tuple[Tensor, Tensor],
        cache: KVCache | None,
        layer: int,
        attn_mask: Tensor | None,
        starts: list[int] | None = None,
        capture: list[tuple[Tensor, Tensor]] | None = None,
        unread: Tensor | None = None,
        reads: EntryReads | None = None,
    ) -> tuple[Tensor, Tensor]:
        h = self.attn_norm(x)  # (B, L, C), also the input the turn summary reads
        x = x + self.attn(h, lc, rope, cache, layer, attn_mask, starts, capture, unread, reads)
        x = x + self.mlp(self.mlp_norm(x))
        return x, h


# the copy read's least pointer weight on an entry that goes on a word right after the reply gave its previous piece,
# where the model would go on the word too: with weight w its share of the mixture is then at least w / (1 + |a|),
# about a half for the bundled weight of 1, so a greedy reply finishes the word it began as the user wrote it
# (experiments/LOG.md, 2026-12-04 (i))
COMPLETION = 1.0


def copied(
    logits: Tensor,
    pointer: Tensor,
    plan: CopyPlan,
    previous: Tensor,
    unfinished: Tensor | None = None,
) -> Tensor:
    """The copy read (config.imprint_copy): logits (B, L, V) -> log-probabilities of the model's distribution mixed
    with the imprinted tokens, p = (softmax(logits) + a) / (1 + |a|), a(v) the attention ``pointer`` (B, L, N) gives
    the entries whose token is v, each times its weight (the entries' ``CopyPlan``, made once a turn). An entry that
    goes on a word is copied only right after the token before it in its span: ``previous`` (B, L) the token each
    position reads (so "Magenta" is copied as " Mag" then "enta", never "enta" alone). Where ``unfinished`` (B, L) says
    the model itself would go on the word (its likeliest token a word's inner piece), such an entry's pointer is at
    least COMPLETION: the word is finished as imprinted ("Lub" + "umbashi", not "Lub" + "amba"), while a word the model
    ends ("if I remember") is left alone. A row whose weights are all 0 keeps its logits as they are."""
    going_on = plan.goes_on & (plan.after == previous.unsqueeze(-1))  # (B, L, N)
    at = plan.begins | going_on
    pointer = pointer.float()
    if unfinished is not None:
        pointer = torch.where(going_on & unfinished.unsqueeze(-1), pointer.clamp_min(COMPLETION), pointer)
    a = pointer * at * plan.weight  # (B, L, N)
    norm = torch.log1p(a.sum(-1, keepdim=True))  # (B, L, 1): log(1 + |a|)
    mixed = F.log_softmax(logits.float(), dim=-1) - norm  # every token not held: log(p / (1 + |a|))
    # the held tokens alone: each entry's a summed over the entries holding its token, so the vocabulary is passed
    # over twice, not once per term of the mixture
    ids = plan.tokens.unsqueeze(1).expand_as(a)  # (B, L, N)
    pointed = a @ plan.same  # (B, L, N): each entry's token's a
    # log(0) = -inf where nothing points, its gradient taken at 1 (0 · inf would make it NaN)
    pointed = torch.where(pointed > 0, pointed, 1.0).log().masked_fill(pointed <= 0, float("-inf"))
    held = torch.logaddexp(mixed.gather(-1, ids), pointed - norm)  # (B, L, N): log((p + a) / (1 + |a|))
    # in place where nothing learns from it (the gather above keeps ``mixed`` for its gradient)
    mixed = (mixed.scatter(-1, ids, held) if mixed.requires_grad else mixed.scatter_(-1, ids, held)).to(logits.dtype)
    return mixed if plan.every_row else torch.where(plan.copying.view(-1, 1, 1), mixed, logits)


def _copying(layers: Sequence[object]) -> InjectedLayer | None:
    """The first copy layer's conditioning where some row copies (config.imprint_copy), else None."""
    for lc in layers:
        if isinstance(lc, InjectedLayer) and lc.copy_plan is not None:
            return lc if lc.copy_plan.any_row else None
    return None


def _untrained_ask(head: nn.Linear) -> None:
    """An ask head that asks for no kind whatever it reads: p(none) = 1 - 10·e^-40, so every entry's bias is 0 to
    within 1e-16 of config.imprint_ask_bias."""
    head.weight.zero_()
    head.bias.zero_()
    head.bias[0] = 40.0


class LlamaModel(IdentityModel):
    """A pretrained LLaMA-family backbone whose attention one identity state per batch row deforms."""

    # exact_rows (IdentityModel) is set by pack_weights(bfloat16): padded rows then attend one by one (``row_starts``)
    # and the slots are conditioned row by row, so that with its row-independent products a batched row computes bit
    # for bit what it does alone

    def __init__(self, config: LlamaConfig, tokenizer: Tokenizer, *, init: bool = True) -> None:
        super().__init__()
        self.config: LlamaConfig = config
        if tokenizer.vocab_size > config.vocab_size:
            raise ValueError(f"the tokenizer has {tokenizer.vocab_size} tokens; the model only {config.vocab_size}")
        self.tokenizer = tokenizer
        self._word_starts: Tensor | None = None  # (V,) bool: which tokens begin a word (the copy read's), made once
        self.trace_layers = config.trace_layer_ids
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        # the base model's keys and values of the prefixes read_words was told are shared (a persona's prompt), newest last
        self._prefix_reads: OrderedDict[tuple[object, ...], tuple[list[Tensor], list[Tensor]]] = OrderedDict()
        self._prefix_lock = threading.Lock()
        blocks = [Block(config, i in self.trace_layers) for i in range(config.n_layer)]
        self.blocks = nn.ModuleList(blocks)
        self.attentions = [block.attn for block in blocks]  # typed views of the registered modules
        self.stacks = [stack for block in blocks for stack in (block.attn.qkv, block.mlp.gate_up)]  # inference's products
        self.norm_f = RMSNorm(config.n_embd, config.norm_eps)
        self.lm_head = Linear(config.n_embd, config.vocab_size, bias=False)
        if config.tie_embeddings:
            self.lm_head.weight = self.wte.weight
        self.self_update = SelfUpdate(config)
        self.pool = nn.Linear(config.n_embd, 1) if config.pooling == "attention" else None
        # K learned input embeddings read after each turn; their final hidden states are the write's z
        self.memory = nn.Parameter(torch.zeros(config.memory_tokens, config.n_embd)) if config.memory_tokens else None
        # the imprint's kind tagger: what kind of fact each token of a message states, from one layer's input
        kinds = config.imprint_kinds_layer
        self.imprint_kind = nn.Linear(config.n_embd, len(KINDS)) if kinds is not None else None
        # what kind of fact a message asks about (KINDS[0]: none), from the mean of the same layer's input over it
        self.imprint_ask = nn.Linear(config.n_embd, len(KINDS)) if config.imprint_ask_bias else None
        self.inv_freq: Tensor
        self.register_buffer("inv_freq", self._inv_freq(), persistent=False)  # (d/2,)
        self.read_shift = config.read_shift  # every slot's logit lowered by this at conditioning (set_read_shift)
        if init:
            self.init_identity(seed=0)

    def _inv_freq(self) -> Tensor:
        c = self.config
        return 1.0 / (c.rope_theta ** (torch.arange(0, c.head_dim, 2, dtype=torch.float32, device="cpu") / c.head_dim))

    # --- parameters ---
    def init_identity(self, seed: int, slot_bias: float = UNTRAINED_SLOT_BIAS) -> None:
        """Deterministic untrained identity parameters: the read shut (slot values zero, the slot's bias at
        ``slot_bias``, by default the closed gate), the write random. Training starts the bias open (e.g. 0)."""
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for attn in self.attentions:
                if attn.stateful:
                    init_slot_map(attn.self_key, 0.02, generator)
                    init_slot_map(attn.self_value, 0.0, generator)
                    attn.slot_bias.fill_(slot_bias)
                if attn.gated:
                    attn.slot_gate.weight.zero_()  # every token reads as the bias says: the gate adds nothing yet
                for name in ("imprint_read_q", "imprint_read_v", "imprint_read_o") if attn.read_rank else ():
                    init_slot_map(getattr(attn, name), 0.0, generator)  # LoRA: down random, up zero
                if attn.imprint_gated:  # every token reads the imprint as the untrained model does
                    attn.imprint_gate.weight.zero_()
                    attn.imprint_gate.bias.zero_()
            bound = 1.0 / math.sqrt(self.self_update.proj.in_features)
            for p in self.self_update.parameters():
                p.copy_((torch.rand(p.shape, generator=generator) * 2 - 1) * bound)
            if self.pool is not None:
                self.pool.weight.zero_()  # scores start equal: mean pooling
                self.pool.bias.zero_()
            if self.self_update.parts:
                self.self_update.centre.zero_()
                self.self_update.spread.fill_(1.0)
            if self.self_update.gate is not None:
                self.self_update.gate.bias.zero_()  # the gate starts half open
            if self.imprint_kind is not None:  # untrained, every kind equally likely: nothing is labelled
                self.imprint_kind.weight.zero_()
                self.imprint_kind.bias.zero_()
            if self.imprint_ask is not None:
                _untrained_ask(self.imprint_ask)
            if self.memory is not None:  # the embeddings of random vocabulary tokens: inputs the backbone knows
                rows = torch.randint(0, self.config.vocab_size, (self.memory.shape[0],), generator=generator)
                self.memory.copy_(self.wte.weight[rows].float())

    @property
    def packable(self) -> bool:
        """Whether ``pack_weights`` can pack here: float32 weights on a CPU, with a build that has oneDNN."""
        weight = self.wte.weight
        return weight.device.type == "cpu" and weight.dtype == torch.float32 and packing_available()

    def pack_weights(self, dtype: torch.dtype = torch.float32) -> int:
        """Pack the backbone's matrices for oneDNN's CPU products (``Linear.pack``), at the cost of a second copy of
        them. float32: products of three rows or more (batched decoding, prefill) run faster. bfloat16: the
        projections' products, of any number of rows, read half the bytes and round as under bfloat16 autocast; the
        head stays float32 (packed in float32), so logits keep their precision. Returns the bytes the copies take.
        For inference: training keeps ``nn.Linear``'s products."""
        if dtype not in PACKED_DTYPES:
            raise ValueError(f"weights are packed in float32 or bfloat16; got {dtype}")
        if dtype == torch.bfloat16 and not bfloat16_packing_available():  # before any matrix is packed: nothing changes
            raise ValueError(f"{NO_BFLOAT16_PACKING}; pack them in float32")
        self.exact_rows = dtype == torch.bfloat16
        self.forget_prefix_reads()  # they were read with the products as they were
        if dtype == torch.float32:
            return sum(m.pack() for m in self.products())
        # the head in float32, but with its copy for one row too: a row's logits then come from the same kernel
        # whether it decodes alone or batched, as every bfloat16 product does
        return sum(m.pack(torch.float32, every_row=True) if m is self.lm_head else m.pack(dtype) for m in self.products())

    def unpack_weights(self) -> None:
        """Drop every packed copy ``pack_weights`` made."""
        self.exact_rows = False
        self.forget_prefix_reads()
        for m in self.products():
            m.unpack()

    def products(self) -> list[Linear | Stacked]:
        """The products inference runs: each ``Stacked`` product (the query, key and value maps; the MLP's gate and up
        maps) and every other ``Linear``; the stacked maps' own copies would never be read."""
        stacked = {id(part) for stack in self.stacks for part in stack.parts}
        return [*self.stacks, *(m for m in self.modules() if isinstance(m, Linear) and id(m) not in stacked)]

    def set_read_shift(self, shift: float) -> None:
        """The read's strength: every self slot's logit lowered by ``shift`` (its attention weight times about
        e^-shift; a negative shift strengthens it) in every conditioning made from now on, in place of the
        checkpoint's own (``config.read_shift``). Memory against language, measured in docs/model.md (the bundled
        adapter: 0 -> 94.8 % recall, 1.072x base perplexity; its own 0.5 -> 91.7 %, 1.003x). A fresh identity reads
        nothing at any shift."""
        if not math.isfinite(shift):
            raise ValueError(f"the read shift must be a finite number; got {shift}")
        self.read_shift = float(shift)

    def factor_slots(self, rank: int) -> None:
        """Replace every layer's slot maps by their best rank-``rank`` approximation, in place: the truncated SVD
        W ≈ U_r S_r V_rᵀ, stored as up = U_r S_r^½ and down = S_r^½ V_rᵀ (config.slot_rank becomes ``rank``). A
        smaller adapter at a cost measured in docs/model.md."""
        config = replace(self.config, slot_rank=rank)  # validates the rank
        with torch.no_grad():
            for attn in self.attentions:
                if not attn.stateful:
                    continue
                for name in ("self_key", "self_value"):
                    old = getattr(attn, name)
                    weight = old.weight if isinstance(old, nn.Linear) else old.up.weight @ old.down.weight
                    u, sv, vh = torch.linalg.svd(weight.float(), full_matrices=False)
                    root = sv[:rank].sqrt()
                    new = LowRank(weight.shape[1], weight.shape[0], rank).to(weight.device)
                    new.up.weight.copy_(u[:, :rank] * root)
                    new.down.weight.copy_(root[:, None] * vh[:rank])
                    setattr(attn, name, new)
        self.config = config

    def add_imprint(self, tokens: int, read_rank: int, *, kinds_layer: int | None = None, seed: int = 0) -> None:
        """Give this model an imprint of ``tokens`` entries, a fresh read adapter of rank ``read_rank`` (0: none) and,
        with ``kinds_layer``, a fresh kind tagger reading that layer, in place: a trained adapter without them
        becomes one that keeps the user's words (and, untrained, reads them with the base model's own attention)."""
        self.config = replace(self.config, imprint_tokens=tokens, imprint_read_rank=read_rank)  # validates them
        self.add_kind_tagger(kinds_layer)
        generator = torch.Generator().manual_seed(seed)
        C, d = self.config.n_embd, self.config.head_dim
        with torch.no_grad():
            for attn in self.attentions:
                if not attn.stateful:
                    continue
                attn.read_rank = read_rank
                shapes = {
                    "imprint_read_q": (C, attn.H * d),
                    "imprint_read_v": (C, attn.H_kv * d),
                    "imprint_read_o": (attn.H * d, C),
                }
                for name, (d_in, d_out) in shapes.items():
                    if read_rank:
                        setattr(attn, name, LowRank(d_in, d_out, read_rank).to(self.wte.weight.device))
                        init_slot_map(getattr(attn, name), 0.0, generator)  # LoRA: down random, up zero
                    elif hasattr(attn, name):
                        delattr(attn, name)

    def add_imprint_gate(self) -> None:
        """Give every stateful layer a fresh per-token read gate on the imprint (config.imprint_gate), in place; it
        starts at zero: the model reads exactly as before until it is trained."""
        if not self.config.imprint_tokens:
            raise ValueError("the model has no imprint: call add_imprint(tokens, read_rank) first")
        self.config = replace(self.config, imprint_gate=True)
        for attn in self.attentions:
            if attn.stateful:
                attn.imprint_gated = True
                attn.imprint_gate = nn.Linear(self.config.n_embd, attn.H + 1).to(self.wte.weight.device)
                with torch.no_grad():
                    attn.imprint_gate.weight.zero_()
                    attn.imprint_gate.bias.zero_()

    def add_kind_tagger(self, layer: int | None) -> None:
        """A fresh kind tagger reading ``layer``'s input (untrained: every kind equally likely, nothing labelled), or
        none; in place."""
        self.config = replace(self.config, imprint_kinds_layer=layer)  # validates it
        self.imprint_kind = None
        if layer is not None:
            self.imprint_kind = nn.Linear(self.config.n_embd, len(KINDS)).to(self.wte.weight.device)
            with torch.no_grad():
                self.imprint_kind.weight.zero_()
                self.imprint_kind.bias.zero_()

    def add_ask_head(self, bias: float) -> None:
        """A fresh head telling what kind of fact a message asks about (untrained: none, whatever the message), its
        entries' logits moved by ``bias`` (config.imprint_ask_bias; 0: no head); in place."""
        self.config = replace(self.config, imprint_ask_bias=bias)  # validates it
        self.imprint_ask = None
        if bias:
            self.imprint_ask = nn.Linear(self.config.n_embd, len(KINDS)).to(self.wte.weight.device)
            with torch.no_grad():
                _untrained_ask(self.imprint_ask)

    def identity_state_dict(self) -> dict[str, Tensor]:
        """The parameters SIA adds to the backbone (what a SIA checkpoint stores beside the name of its base)."""
        return {k: v for k, v in self.state_dict().items() if any(part in k for part in IDENTITY_PARAMETERS)}

    @classmethod
    def from_base(cls, config: LlamaConfig, tokenizer: Tokenizer, tensors: dict[str, Tensor], *, seed: int = 0) -> LlamaModel:
        """The backbone's weights (Hugging Face names) taken as they are, with no random initialisation first;
        fresh identity parameters (``init_identity(seed)``)."""
        with torch.device("meta"):  # shapes only: the backbone's storage is the loaded tensors themselves
            model = cls(config, tokenizer, init=False)
        model.load_base(tensors, assign=True)
        for module in model.modules():  # what the base does not provide: SIA's own parameters and the rotary table
            for name, param in list(module.named_parameters(recurse=False)):
                if param.is_meta:
                    setattr(module, name, nn.Parameter(torch.empty(param.shape, dtype=param.dtype)))
            for name, buffer in list(module.named_buffers(recurse=False)):
                if buffer.is_meta and name != "inv_freq":  # the self update's running statistics
                    setattr(module, name, torch.zeros(buffer.shape, dtype=buffer.dtype))  # init_identity fills it
        model.inv_freq = model._inv_freq()
        model.init_identity(seed)
        return model

    def load_base(self, tensors: dict[str, Tensor], *, assign: bool = False) -> None:
        """Load a backbone's weights given by their Hugging Face LLaMA names; every base parameter must be there.

        With ``assign`` the module keeps the given tensors as its parameters (no copy)."""
        own = self.state_dict()
        wanted = {name for name in own if not any(part in name for part in IDENTITY_PARAMETERS)}
        if self.config.tie_embeddings:
            wanted.discard("lm_head.weight")
        loaded: dict[str, Tensor] = {}
        for hf_key, tensor in tensors.items():
            name = hf_name(hf_key)
            if name is None or (name == "lm_head.weight" and self.config.tie_embeddings):
                continue  # rotary tables and a tied head's copy are not parameters here
            if name not in wanted:
                raise ValueError(f"the base checkpoint has an unexpected tensor {hf_key!r}")
            if tuple(tensor.shape) != tuple(own[name].shape):
                raise ValueError(f"{hf_key} has shape {tuple(tensor.shape)}; this config needs {tuple(own[name].shape)}")
            loaded[name] = tensor
        missing = sorted(wanted - set(loaded))
        if missing:
            raise ValueError(f"the base checkpoint lacks {len(missing)} tensors, e.g. {missing[:3]}")
        self.load_state_dict(loaded, strict=False, assign=assign)
        if self.config.tie_embeddings:
            self.lm_head.weight = self.wte.weight  # assignment replaced the shared parameter: tie again

    # --- per-turn conditioning ---
    def condition(
        self,
        trace: Tensor,
        self_state: Tensor,
        imprint: ImprintEntries | None = None,
        reads_from: Tensor | None = None,
        asked: Tensor | None = None,
    ) -> Conditioning:
        """trace (B, *config.trace_shape) as stored, self_state (B, d_s), the rows' imprints (none: empty) -> the turn's
        Conditioning. The imprint is read by the tokens from position ``reads_from`` (B,) on (default 0: all): in a
        turn, the persona's prompt does not read it, the user's message and the reply do; its u filled entries sit
        at the u positions just before ``reads_from``, in order, as if the user had just said them. ``asked`` (B,
        len(KINDS)): what kind of fact each row's message asks about (``asked_kinds``), which moves its entries'
        logits (``entry_bias``) and weighs the copy read (``copy_weight``); None: none asked."""
        c = self.config
        self._check_state_shapes(trace, self_state)
        if not self.stateful:
            return Conditioning(layers=[None] * c.n_layer, self_state=self_state)
        B = trace.shape[0]
        basis, spectrum = metric_factors(trace.detach(), c, c.metric_rank)  # (B, n_trace, trace heads, d, r), (..., r)
        r = spectrum.shape[-1]
        basis = basis.expand(B, basis.shape[1], c.n_kv_head, c.head_dim, r)  # a shared trace: every head
        spectrum = spectrum.expand(B, spectrum.shape[1], c.n_kv_head, r)
        slot_of = {layer: i for i, layer in enumerate(self.trace_layers)}
        dtype = self.wte.weight.dtype
        N = c.imprint_tokens
        if N and imprint is None:
            imprint = ImprintEntries.stack([None] * B, c.imprint_shape, dtype)
        if imprint is not None and (imprint.keys.shape[0] != B or imprint.keys.shape[1:] != c.imprint_shape):
            raise ValueError(
                f"imprint keys must be ({B}, {', '.join(map(str, c.imprint_shape))}); got {tuple(imprint.keys.shape)}"
            )
        rope, bias = None, None
        if imprint is not None and asked is not None:
            bias = self.entry_bias(imprint.kind.to(self_state.device), asked.to(self_state.device))
        if imprint is not None:
            reads_from = torch.zeros(B, dtype=torch.long) if reads_from is None else reads_from.long()
            reads_from = reads_from.to(self_state.device)
            used = imprint.filled.sum(-1).to(self_state.device)  # (B,)
            rope = self.rope((reads_from - used).view(B, 1) + torch.arange(N, device=self_state.device))  # (B, 1, N, d)
        layers = []
        copies = self.copy_weight(imprint, asked)
        if copies is not None:
            assert imprint is not None
            tokens, after = imprint.token.to(self_state.device), self.copy_after(imprint).to(self_state.device)
        for layer, attn in enumerate(self.attentions):
            m = None
            if layer in slot_of:  # contiguous once, not at every step
                m = basis[:, slot_of[layer]].contiguous(), spectrum[:, slot_of[layer]].contiguous()
            entries = None
            if imprint is not None:
                at = imprint.keys.device
                entries = (imprint.keys[:, layer].to(dtype), imprint.values[:, layer].to(dtype), imprint.filled.to(at))
            layers.append(
                attn.condition(
                    m,
                    self_state.to(dtype),
                    self.read_shift,
                    self.exact_rows,
                    imprint=entries,
                    rope=rope,
                    reads_from=reads_from,
                    imprint_shift=c.imprint_shift,
                    entry_bias=bias,
                )
            )
            if copies is not None and layer in (c.imprint_copy_layers or ()):
                copy = layers[-1]
                copy.copy_tokens, copy.copy_after, copy.copy_weight = tokens, after, copies
        return Conditioning(layers=layers, self_state=self_state, recalls=self.recalls(imprint, asked))

    @staticmethod
    def recalls(imprint: ImprintEntries | None, asked: Tensor | None) -> Tensor | None:
        """The rows (B,) bool, on the CPU, whose message more likely asks about the user's facts than about none
        (p(none) < 1/2, the gate of ``entry_bias`` and ``copy_weight``) and whose imprint holds an entry to answer
        from; None where nothing is asked."""
        if imprint is None or asked is None:
            return None
        return asks_a_fact(asked)[:, 0].cpu() & imprint.filled.cpu().any(-1)

    def copy_weight(self, imprint: ImprintEntries | None, asked: Tensor | None) -> Tensor | None:
        """Each entry's weight in the copy read (B, N): config.imprint_copy for an entry whose token is kept (0 for the
        others), times 1 - p(no fact asked) where ``asked`` is given, and 0 in a row whose message more likely asks for
        none (as ``entry_bias``: "What is the capital of France?" must not copy the user's city); None without the copy
        read or an imprint. Where every weight is 0 the forward skips the copy (the read is the attention's alone, at
        no cost, and a fresh identity stays the base model); the weights are kept all the same, so that the rows of
        turns conditioned apart stack into one batch."""
        lam = self.config.imprint_copy
        if not lam or imprint is None:
            return None
        weight = lam * (imprint.token >= 0).float()  # (B, N)
        if asked is not None:
            p_none = asked.float()[:, :1].to(weight.device)
            weight = torch.where(asks_a_fact(p_none), weight * (1.0 - p_none), torch.zeros_like(weight))
        return weight.to(self.wte.weight.device)

    def word_starts(self) -> Tensor:
        """(V,) bool: which tokens begin a word (a space or a mark first, or no bytes) rather than go on one (a letter
        or a digit first; a byte >= 0x80, a piece of a character beyond ASCII, reads as a letter's part: the second
        byte of "ź" goes on "Łód" as "d" does); made once."""
        if self._word_starts is None:
            starts = torch.ones(self.config.vocab_size, dtype=torch.bool)
            for i in range(self.tokenizer.vocab_size):
                head = self.tokenizer.token_bytes(i)
                starts[i] = not head or (head[0] < 0x80 and not chr(head[0]).isalnum())
            self._word_starts = starts
        return self._word_starts

    def copy_after(self, imprint: ImprintEntries) -> Tensor:
        """The token each entry must follow to be copied (B, N): the previous entry's token where the entry goes on a
        word within its span (``word_starts``: its token begins with a letter, a digit or a byte beyond ASCII: "enta"
        after " Mag"), -1 where it begins one (a space or a mark first, or its span's first token) and for empty
        entries."""
        token = imprint.token
        begins = self.word_starts().to(token.device)[token.clamp_min(0)]
        goes_on = F.pad(imprint.span[:, 1:] == imprint.span[:, :-1], (1, 0), value=False) & ~begins & (token >= 0)
        return torch.where(goes_on, F.pad(token[:, :-1], (1, 0), value=-1), -1)

    def entry_bias(self, kind: Tensor, asked: Tensor) -> Tensor | None:
        """Each entry's logit shift (B, N) for rows whose messages ask ``asked`` (B, len(KINDS)) (probabilities, KINDS[0]:
        none) of entries of stored ``kind`` (B, N): beta·(2·p(kind) - p(any kind)) with beta config.imprint_ask_bias,
        so +beta for the asked kind's entries, -beta for another kind's; 0 for an entry of unknown kind, and for every
        entry where the message more likely asks for none (p(none) >= 1/2: "What is the capital of France?" must not
        lean on the user's city). None without the ask head."""
        beta = self.config.imprint_ask_bias
        if not beta:
            return None
        if asked.dim() != 2 or asked.shape != (kind.shape[0], len(KINDS)):
            raise ValueError(f"asked must be ({kind.shape[0]}, {len(KINDS)}); got {tuple(asked.shape)}")
        p = asked.float()
        bias = beta * (2.0 * p.gather(1, kind.long()) - (1.0 - p[:, :1]))  # (B, N)
        return torch.where((kind > 0) & asks_a_fact(p), bias, torch.zeros_like(bias))

    @torch.no_grad()
    def asked_kinds(self, rows: Sequence[Sequence[int]]) -> Tensor:
        """What kind of fact each message asks about: (B, len(KINDS)) probabilities (KINDS[0]: none) from the ask head
        over the mean of the tagger's layer's input over the message's tokens ``rows`` (read alone, from position 0,
        by the base model). ValueError without the head."""
        if self.imprint_ask is None:
            raise ValueError("the model has no ask head: add_ask_head(bias) first")
        if self.exact_rows and len(rows) > 1:  # each row as it is alone, bit for bit (as a padded prefill is)
            return torch.cat([self.asked_kinds([r]) for r in rows])
        mean = self.message_means(rows)
        return torch.softmax(self.imprint_ask(mean.to(self.imprint_ask.weight.dtype)).float(), -1)

    @torch.no_grad()
    def message_means(self, rows: Sequence[Sequence[int]]) -> Tensor:
        """The mean of the kind tagger's layer's input over each message's tokens ``rows`` (B, C) float32, each read
        alone from position 0 by the base model: what the ask head reads."""
        layer = self.config.imprint_kinds_layer
        if layer is None:
            raise ValueError("the model has no kind tagger: its layer is what the ask head reads")
        if not rows or not all(len(r) for r in rows):
            raise ValueError("need at least one message of at least one token")
        L = max(len(r) for r in rows)
        idx = torch.zeros(len(rows), L, dtype=torch.long)
        weight = torch.zeros(len(rows), L, 1)
        for b, r in enumerate(rows):
            idx[b, : len(r)] = torch.tensor(list(r))
            weight[b, : len(r)] = 1.0 / len(r)
        device = self.wte.weight.device
        h = self.layer_inputs(idx.to(device), layer)  # (B, L, C); the padding after a row plays no part (causal)
        return (h * weight.to(device)).sum(1)

    def base_view(self) -> LlamaModel:
        """The same weights read as the base model, the identity switched off: a shallow copy (no tensor is copied,
        this model is untouched) whose config says ``attention="dot"``. For uncached forwards: a cache it made
        would still have the identity's kernel width."""
        twin = copy.copy(self)
        twin.config = replace(self.config, attention="dot")
        return twin

    @property
    def prefix_len(self) -> int:
        """Keys before the first token: the self slots (config.self_slots per key/value head) and the imprint's N
        entries, or none."""
        return self.config.self_slots + self.config.imprint_tokens if self.stateful else 0

    def new_cache(self, cond: Conditioning, max_tokens: int) -> KVCache:
        widths = [attn.w for attn in self.attentions]
        return KVCache(cond, max_tokens, n_head=self.config.n_kv_head, width=widths, dtype=self.wte.weight.dtype)

    # --- forward ---
    def rope(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        """cos and the signed sin (B, 1, L, d) for positions (B, L), what ``rotate`` takes: the rotate-half layout's
        angles [θ, θ], and the sin negated on the first half ([-sin θ, sin θ])."""
        freqs = positions.float().unsqueeze(-1) * self.inv_freq  # (B, L, d/2)
        angles = torch.cat([freqs, freqs], dim=-1).unsqueeze(1)  # (B, 1, L, d)
        dtype = self.wte.weight.dtype
        sin = angles.sin()
        sin[..., : freqs.shape[-1]] *= -1.0
        return angles.cos().to(dtype), sin.to(dtype)

    def forward(
        self,
        idx: Tensor,
        cond: Conditioning,
        *,
        cache: KVCache | None = None,
        positions: Tensor | None = None,
        attn_mask: Tensor | None = None,
        summary_mask: Tensor | None = None,
        memory: bool = False,
        logits_from: int = 0,
    ) -> ModelOutput:
        """idx (B, L) token ids -> logits (B, L, vocab) and the additive turn statistics of these tokens.

        positions (B, L) default to the next L positions after the cache; attn_mask is a boolean (B, 1, L, Lk) mask
        of visible keys including the self slot at key 0 (only needed for padded rows); summary_mask (B, L) picks
        the tokens that count towards the turn summary (default: all). With ``memory`` the K memory tokens follow
        idx (at the K positions after its last, seeing every key its last token sees) and ``memory`` of the output
        holds their final hidden states (B, K, C); attn_mask then covers the L + K queries and keys.
        Logits are computed for positions ``logits_from`` to L - 1 only (B, L - logits_from, vocab).
        """
        L = idx.shape[1]
        positions, weight = self._positions_and_weights(idx, cond, cache, positions, summary_mask)
        x = self.wte(idx)  # (B, L, C)
        K = 0
        if memory:
            if self.memory is None:
                raise ValueError("this model has no memory tokens (config.memory_tokens is 0)")
            K = self.memory.shape[0]
            B = idx.shape[0]
            x = torch.cat([x, self.memory.to(x.dtype).expand(B, K, -1)], dim=1)  # (B, L+K, C)
            after = positions[:, -1:] + torch.arange(1, K + 1, device=idx.device)  # (B, K)
            positions = torch.cat([positions, after], dim=1)
            weight = F.pad(weight, (0, 0, 0, K))  # memory tokens never count towards the summary
        rope = self.rope(positions)
        starts = None
        if self.exact_rows and attn_mask is not None:
            starts = row_starts(attn_mask, cache.prefix if cache is not None else 0)
        first = cond.layers[0]
        reads_from = first.reads_from if isinstance(first, InjectedLayer) else None
        unread = None if reads_from is None else positions < reads_from.view(-1, 1)  # (B, L + K)
        if unread is not None and not bool(unread.any()):  # decoding: every token reads (no column to close)
            unread = None
        layer_inputs = []
        copying = _copying(cond.layers)
        reads = None  # the copy read's heads' weights on the imprint's entries (B, h, L + K, N) per copy layer
        if copying is not None:
            assert self.config.imprint_copy_layers is not None
            reads = EntryReads({layer: self.config.copy_heads(layer) for layer in self.config.imprint_copy_layers})
        for i, (block, lc) in enumerate(zip(self.blocks, cond.layers, strict=True)):
            assert lc is None or isinstance(lc, InjectedLayer)
            copies = copying is not None and lc is not None and lc.copy_weight is not None
            mask = None if starts is not None else attn_mask
            x, h = block(x, lc, rope, cache, i, mask, starts, None, unread, reads if copies else None)
            if i in self.trace_layers:
                layer_inputs.append((h.float() * weight).sum(dim=1))  # (B, C)
        if cache is not None:
            cache.advance(L + K)
        x = self.norm_f(x)  # (B, L+K, C)
        hidden, pool_max, pool_norm = self._pool(x[:, :L].float(), weight[:, :L])
        stats = SummarySums(torch.stack(layer_inputs, dim=1), hidden, weight.sum(dim=(1, 2)), pool_max, pool_norm)
        logits = self.lm_head(x[:, logits_from:L])
        if copying is not None:
            plan = copying.copy_plan
            assert plan is not None and reads is not None
            pointer = torch.cat(reads.weights, 1).mean(1)
            pointer = pointer[:, logits_from:L]  # (B, L - logits_from, N): the mean over the copy's query heads
            previous = idx[:, logits_from:L].to(plan.after.device)
            unfinished = ~self.word_starts().to(logits.device)[likeliest(logits)]  # (B, L'): the model goes on a word
            logits = copied(logits, pointer, plan, previous, unfinished)
        return ModelOutput(logits=logits, stats=stats, memory=x[:, L:].float() if memory else None)

    @torch.no_grad()
    def read_words(self, idx: Tensor, *, logits: bool = False, shared: int = 0) -> WordsRead:
        """What the base model makes of the tokens idx (1, L) at positions 0..L-1, as an imprint keeps it: every
        layer's pre-rotation keys and values (n_layer, H_kv, L, d), float32; with ``logits`` its logits (L, V); with
        a kind tagger, each token's kind probabilities. The identity plays no part: an imprinted span is the user's
        words as the pretrained model reads them.

        ``shared``: the first ``shared`` tokens are a prefix many reads begin with (a persona's prompt). Their keys and
        values are read once and kept (the ``PREFIX_READS`` newest prefixes), and the pass reads only the tokens after
        them: the read then covers idx[shared:] (``WordsRead.start`` = shared), as a read of all of idx would, to
        within the rounding of products of another shape."""
        if idx.dim() != 2 or idx.shape[0] != 1:
            raise ValueError(f"read_words takes one row of tokens (1, L); got {tuple(idx.shape)}")
        if not 0 <= shared < idx.shape[1]:
            raise ValueError(f"shared must leave a token to read: 0 <= shared < {idx.shape[1]}; got {shared}")
        if not shared:
            return self.read_rows(idx, [idx.shape[1]], logits=logits)[0]
        cache = self._prefix_cache(idx[:, :shared], idx.shape[1] - shared)
        return self._read(idx[:, shared:], [idx.shape[1] - shared], logits, cache)[0]

    def _prefix_cache(self, prefix: Tensor, room: int) -> KVCache:
        """A cache holding the base model's read of ``prefix`` (1, P), with room for ``room`` more tokens."""
        key = (str(prefix.device), str(self.wte.weight.dtype), *prefix[0].tolist())  # a cast model reads it again
        with self._prefix_lock:
            held = self._prefix_reads.get(key)
            if held is not None:
                self._prefix_reads.move_to_end(key)
        if held is None:
            c = self.config
            blank = self.wte.weight.new_zeros(1, c.n_kv_head, 0, c.head_dim)
            cache = KVCache.continuing([blank] * c.n_layer, [blank] * c.n_layer, prefix.shape[1])
            self._read(prefix, [prefix.shape[1]], False, cache)
            held = ([k[:, :, : prefix.shape[1]] for k in cache.keys], [v[:, :, : prefix.shape[1]] for v in cache.values])
            with self._prefix_lock:
                self._prefix_reads[key] = held
                while len(self._prefix_reads) > PREFIX_READS:
                    self._prefix_reads.popitem(last=False)
        return KVCache.continuing(*held, room)

    def forget_prefix_reads(self) -> None:
        """Drop the kept reads of shared prefixes (``read_words``): the next read of each reads it again."""
        with self._prefix_lock:
            self._prefix_reads.clear()

    def read_rows(self, idx: Tensor, lengths: Sequence[int], *, logits: bool = False) -> list[WordsRead]:
        """``read_words`` of B rows in one pass: row b is idx[b, :lengths[b]] of the right-padded idx (B, L) (the
        padding after a row plays no part in it: attention is causal); each row's read is cut to its length."""
        if idx.dim() != 2 or len(lengths) != idx.shape[0] or not all(0 < n <= idx.shape[1] for n in lengths):
            raise ValueError(f"read_rows takes (B, L) tokens and B lengths in 1..L; got {tuple(idx.shape)}, {list(lengths)}")
        return self._read(idx, lengths, logits, None)

    def _read(self, idx: Tensor, lengths: Sequence[int], logits: bool, cache: KVCache | None) -> list[WordsRead]:
        """``read_rows``, after the tokens ``cache`` holds where one is given (their keys and values then join it)."""
        L, start = idx.shape[1], 0 if cache is None else cache.tokens
        if self.config.block_size < start + L:
            raise ValueError(f"{start + L} tokens exceed the context of {self.config.block_size}")
        x = self.wte(idx)  # (B, L, C)
        rope = self.rope(torch.arange(start, start + L, device=idx.device).view(1, L))
        capture: list[tuple[Tensor, Tensor]] = []
        kinds = None
        for i, block in enumerate(self.blocks):
            x, h = block(x, None, rope, cache, i, None, None, capture)
            if self.imprint_kind is not None and i == self.config.imprint_kinds_layer:
                kinds = torch.softmax(self.imprint_kind(h.float().to(self.imprint_kind.weight.dtype)).float(), -1)
        keys = torch.stack([k for k, _ in capture], 1).float()  # (B, n_layer, H_kv, L, d)
        values = torch.stack([v for _, v in capture], 1).float()
        out = self.lm_head(self.norm_f(x)) if logits else None  # (B, L, V)
        return [
            WordsRead(
                keys[b, :, :, :n],
                values[b, :, :, :n],
                None if out is None else out[b, :n],
                None if kinds is None else kinds[b, :n],
                start,
            )
            for b, n in enumerate(lengths)
        ]

    def layer_input(self, idx: Tensor, layer: int) -> Tensor:
        """The normalised input (L, C) of ``layer``'s attention for the tokens idx (1, L), base model: what the kind
        tagger reads (for training it)."""
        return self.layer_inputs(idx, layer)[0]

    def layer_inputs(self, idx: Tensor, layer: int) -> Tensor:
        """``layer_input`` of B rows (B, L) at once: (B, L, C) float32 (causal: a row's padding after it plays no part)."""
        x = self.wte(idx)
        rope = self.rope(torch.arange(idx.shape[1], device=idx.device).view(1, -1))
        h = x
        for block in self.blocks[: layer + 1]:
            x, h = block(x, None, rope, None, 0, None)
        out: Tensor = h.float()
        return out

    # --- what a turn leaves behind ---
    def summarize(self, stats: SummarySums) -> TurnSummary:
        """Per row and trace layer: the unit mean pre-rotation key of each key/value head and the unit mean query of
        the query heads it serves (one pair per layer when the trace is shared), and the pooled hidden state z.

        The projections are linear, so mean(q) = W_q mean(h): no per-token queries need to be kept.
        """
        if not self.stateful:
            raise ValueError(f"the {self.config.attention!r} attention variant keeps no identity state to summarise for")
        if bool((stats.count <= 0).any()):
            raise ValueError("a turn summary needs at least one counted token per row")
        c = self.config
        mean_in = stats.layer_inputs / stats.count.view(-1, 1, 1)  # (B, n_trace, C)
        dtype = self.wte.weight.dtype
        queries, keys = [], []
        for i, layer in enumerate(self.trace_layers):
            attn = self.attentions[layer]
            q = attn.q_proj(mean_in[:, i].to(dtype)).float().view(-1, c.n_kv_head, c.n_head // c.n_kv_head, c.head_dim)
            k = attn.k_proj(mean_in[:, i].to(dtype)).float().view(-1, c.n_kv_head, c.head_dim)  # (B, H_kv, d)
            q = q.mean(2)  # (B, H_kv, d) the queries each key/value head serves
            if not c.trace_per_head:
                q, k = q.mean(1, keepdim=True), k.mean(1, keepdim=True)  # (B, 1, d)
            queries.append(q)
            keys.append(k)
        z = stats.hidden / stats.pool_norm.view(-1, 1)  # (B, C) pooled hidden state
        return TurnSummary(
            queries=F.normalize(torch.stack(queries, dim=1), dim=-1),  # (B, n_trace, trace heads, d)
            keys=F.normalize(torch.stack(keys, dim=1), dim=-1),
            hidden=z,
        )


_HF_NAMES = [
    (re.compile(r"model\.embed_tokens\.weight"), "wte.weight"),
    (re.compile(r"model\.norm\.weight"), "norm_f.weight"),
    (re.compile(r"lm_head\.weight"), "lm_head.weight"),
    (re.compile(r"model\.layers\.(\d+)\.input_layernorm\.weight"), r"blocks.\1.attn_norm.weight"),
    (re.compile(r"model\.layers\.(\d+)\.post_attention_layernorm\.weight"), r"blocks.\1.mlp_norm.weight"),
    (re.compile(r"model\.layers\.(\d+)\.self_attn\.([qkvo])_proj\.weight"), r"blocks.\1.attn.\2_proj.weight"),
    (re.compile(r"model\.layers\.(\d+)\.mlp\.(gate|up|down)_proj\.weight"), r"blocks.\1.mlp.\2_proj.weight"),
]


def hf_name(hf_key: str) -> str | None:
    """This module's parameter name for a Hugging Face LLaMA tensor name; None for tensors that are not weights."""
    if hf_key.endswith("rotary_emb.inv_freq"):
        return None
    for pattern, name in _HF_NAMES:
        if pattern.fullmatch(hf_key):
            return pattern.sub(name, hf_key)
    raise ValueError(f"{hf_key!r} is not a LLaMA tensor name this loader knows")
