"""The SIA transformer: decoder-only, pre-norm, Trace Tensor Attention and a self slot in every layer.

Notation: B batch, L tokens in this call, C residual width, H heads, d = config.qk_dim query/key width,
w = config.head_dim = d + 1 the kernel width (value width), d_s self-state width, n_layer layers.

Per turn the identity fixes, for every row and layer, the metric M (from the stored trace, see
sia.identity.state.stabilised_metric) and the self state s. ``SIAModel.condition`` turns them into:
  - folded query weights: q~ = [S q, 1] = x (S W_q)^T + [S b_q, 1], one matmul at width w (S = 2M);
  - the self slot: an extra key/value pair k_s = W_ks s, v_s = W_vs s at cache position 0 that every query
    can attend to. Its key is scored through the same metric, so s changes attention (docs/attention.md).
Keys are cached already augmented, k~ = [k, -k^T M k], so decoding costs one dot product per key.
Positions are learned absolute embeddings added to the residual stream; docs/attention.md explains why.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from sia.identity.state import IdentityState, SelfUpdate, TurnSummary, stabilised_metric
from sia.model.attention import attend, key_bias
from sia.model.config import AnyConfig, ModelConfig
from sia.model.tokenizer import ByteTokenizer, Tokenizer

__all__ = ["Conditioning", "IdentityModel", "KVCache", "ModelOutput", "SIAModel", "TurnStats"]


class SlotLayer(Protocol):
    """A layer's conditioning as the cache sees it: the self slot's augmented key and value."""

    slot_key: Tensor  # (B, heads, 1, w)
    slot_value: Tensor  # (B, heads, 1, w)


@dataclass
class LayerConditioning:
    q_weight: Tensor  # (B, H*w, C) folded query projection, bias row included
    q_bias: Tensor  # (B, 1, H*w)
    metric: Tensor  # (B, H, d, d) M
    slot_key: Tensor  # (B, H, 1, w) augmented self-slot key
    slot_value: Tensor  # (B, H, 1, w)


@dataclass
class Conditioning:
    """Everything one turn fixes for each batch row. Built by SIAModel.condition; never mutated."""

    layers: Sequence[SlotLayer | None]  # per layer; None for a variant without state (plain attention)
    self_state: Tensor  # (B, d_s)

    @property
    def batch_size(self) -> int:
        return self.self_state.shape[0]


class KVCache:
    """Keys and values per layer, preallocated; with a stateful variant position 0 holds the self slot.

    ``widths`` gives each layer's kernel width (one int: the same for all); ``dtype`` defaults to the self state's.
    """

    def __init__(
        self, cond: Conditioning, max_tokens: int, *, n_head: int, width: int | Sequence[int], dtype: torch.dtype | None = None
    ) -> None:
        s = cond.self_state
        B = s.shape[0]
        widths = [width] * len(cond.layers) if isinstance(width, int) else list(width)
        first = cond.layers[0]
        self.prefix = 0 if first is None else first.slot_key.shape[2]  # the self slots
        self.capacity = max_tokens + self.prefix
        self.length = self.prefix
        dtype = dtype or s.dtype
        self.keys = [s.new_zeros((B, n_head, self.capacity, w), dtype=dtype) for w in widths]
        self.values = [s.new_zeros((B, n_head, self.capacity, w), dtype=dtype) for w in widths]
        for layer, lc in enumerate(cond.layers):
            if lc is not None:
                self.keys[layer][:, :, : self.prefix] = lc.slot_key
                self.values[layer][:, :, : self.prefix] = lc.slot_value

    @property
    def tokens(self) -> int:
        """Tokens cached so far (the self slot not counted)."""
        return self.length - self.prefix

    def extend(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Write (B, H, L, w) keys/values after the current length; return the filled prefix."""
        start, end = self.length, self.length + k.shape[2]
        if end > self.capacity:
            raise ValueError(f"KV cache holds {self.capacity - self.prefix} tokens; this step needs {end - self.prefix}")
        self.keys[layer][:, :, start:end] = k
        self.values[layer][:, :, start:end] = v
        return self.keys[layer][:, :, :end], self.values[layer][:, :, :end]

    def advance(self, n: int) -> None:
        self.length += n

    def select(self, rows: Tensor) -> KVCache:
        """A new cache holding a copy of the given rows (B',) of this one, a row may repeat (e.g. one prompt read
        once, then continued several ways)."""
        new = object.__new__(KVCache)
        new.prefix, new.capacity, new.length = self.prefix, self.capacity, self.length
        new.keys = [k[rows] for k in self.keys]
        new.values = [v[rows] for v in self.values]
        return new


@dataclass
class TurnStats:
    """Mergeable sums from which the turn summary is read, so it needs no second pass.

    The pooled hidden state z is a softmax-weighted mean over counted tokens, z = sum_i e^{a_i} x_i / sum_i e^{a_i},
    kept in online-softmax form (running max, normaliser, weighted sum) so chunks merge exactly. With mean
    pooling every score a_i is 0 and z is the plain mean.
    """

    layer_inputs: Tensor  # (B, n_layer, C) sum of each attention's normalised input over counted tokens
    hidden: Tensor  # (B, C) sum of e^{a_i - pool_max} x_i over counted tokens (x: final normalised hidden state)
    count: Tensor  # (B,) tokens counted
    pool_max: Tensor  # (B,) running maximum of the pooling scores a_i
    pool_norm: Tensor  # (B,) sum of e^{a_i - pool_max}

    def __add__(self, other: TurnStats) -> TurnStats:
        top = torch.maximum(self.pool_max, other.pool_max)
        mine, theirs = torch.exp(self.pool_max - top), torch.exp(other.pool_max - top)  # (B,)
        return TurnStats(
            self.layer_inputs + other.layer_inputs,
            self.hidden * mine.unsqueeze(-1) + other.hidden * theirs.unsqueeze(-1),
            self.count + other.count,
            top,
            self.pool_norm * mine + other.pool_norm * theirs,
        )

    def row(self, b: int) -> TurnStats:
        return TurnStats(*(getattr(self, f.name)[b : b + 1] for f in fields(self)))

    def written_by(self, memory: Tensor) -> TurnStats:
        """These sums with z = [the memory tokens' final hidden states (B, K, C); the pooled hidden state], flat."""
        B = memory.shape[0]
        z = torch.cat([memory.reshape(B, -1), self.hidden / self.pool_norm.unsqueeze(-1)], dim=-1)  # (B, (K+1)·C)
        ones = z.new_ones(B)
        return TurnStats(self.layer_inputs, z, self.count, torch.zeros_like(ones), ones)

    @staticmethod
    def cat(parts: list[TurnStats]) -> TurnStats:
        """Stack per-row stats back into one batch."""
        return TurnStats(*(torch.cat([getattr(p, f.name) for p in parts]) for f in fields(TurnStats)))


@dataclass
class ModelOutput:
    logits: Tensor  # (B, L, vocab)
    stats: TurnStats
    memory: Tensor | None = None  # (B, K, C) final hidden states of the memory tokens, when they were read


class TraceAttention(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.n_head, self.d, self.w = config.n_head, config.qk_dim, config.head_dim
        self.q_proj = nn.Linear(config.n_embd, config.n_head * config.qk_dim)
        self.k_proj = nn.Linear(config.n_embd, config.n_head * config.qk_dim)
        self.v_proj = nn.Linear(config.n_embd, config.n_embd)
        self.o_proj = nn.Linear(config.n_embd, config.n_embd)
        self.self_key = nn.Linear(config.d_self, config.n_head * config.qk_dim)
        self.self_value = nn.Linear(config.d_self, config.n_embd)
        self.dropout = nn.Dropout(config.dropout)

    def condition(self, metric: Tensor, s: Tensor) -> LayerConditioning:
        """Fold the metric into the query projection and build the self slot. metric (B, H, d, d), s (B, d_s)."""
        B, H, d, w = s.shape[0], self.n_head, self.d, self.w
        sym = 2.0 * metric  # (B, H, d, d) S = M + M^T
        wq = self.q_proj.weight.view(H, d, -1)  # (H, d, C)
        folded = sym @ wq  # (B, H, d, C)
        q_weight = F.pad(folded, (0, 0, 0, 1)).reshape(B, H * w, -1)  # (B, H*w, C), zero row per head
        q_bias = (sym @ self.q_proj.bias.view(H, d, 1)).squeeze(-1)  # (B, H, d)
        q_bias = F.pad(q_bias, (0, 1), value=1.0).reshape(B, 1, H * w)  # the constant 1 column of q~
        k_s = self.self_key(s).view(B, H, 1, d)  # (B, H, 1, d)
        slot_key = torch.cat([k_s, key_bias(k_s, metric)], dim=-1)  # (B, H, 1, w)
        slot_value = self.self_value(s).view(B, H, 1, w)
        return LayerConditioning(q_weight, q_bias, metric, slot_key, slot_value)

    def forward(
        self, x: Tensor, lc: LayerConditioning | None, cache: KVCache | None, layer: int, attn_mask: Tensor | None
    ) -> Tensor:
        assert isinstance(lc, LayerConditioning), "TraceAttention needs the turn's conditioning"
        B, L, C = x.shape
        H, d, w = self.n_head, self.d, self.w
        q = torch.baddbmm(lc.q_bias, x, lc.q_weight.transpose(1, 2))  # (B, L, H*w) = [S q, 1] per head
        q = q.view(B, L, H, w).transpose(1, 2)  # (B, H, L, w)
        k = self.k_proj(x).view(B, L, H, d).transpose(1, 2)  # (B, H, L, d)
        k = torch.cat([k, key_bias(k, lc.metric)], dim=-1)  # (B, H, L, w) = [k, -k^T M k]
        v = self.v_proj(x).view(B, L, H, w).transpose(1, 2)  # (B, H, L, w)
        if cache is None:
            k = torch.cat([lc.slot_key, k], dim=2)  # (B, H, 1+L, w)
            v = torch.cat([lc.slot_value, v], dim=2)
        else:
            k, v = cache.extend(layer, k, v)  # (B, H, slot+cached+L, w)
        y = attend(q, k, v, causal=True, attn_mask=attn_mask)  # (B, H, L, w)
        y = y.transpose(1, 2).reshape(B, L, C)  # (B, L, C)
        out: Tensor = self.dropout(self.o_proj(y))
        return out


class DotAttention(nn.Module):
    """Plain causal dot-product attention at the full head width, with no state: the twin SIA is compared with."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.n_head, self.w = config.n_head, config.head_dim
        self.q_proj = nn.Linear(config.n_embd, config.n_embd)
        self.k_proj = nn.Linear(config.n_embd, config.n_embd)
        self.v_proj = nn.Linear(config.n_embd, config.n_embd)
        self.o_proj = nn.Linear(config.n_embd, config.n_embd)
        self.dropout = nn.Dropout(config.dropout)

    def condition(self, metric: Tensor, s: Tensor) -> None:
        return None

    def forward(
        self, x: Tensor, lc: LayerConditioning | None, cache: KVCache | None, layer: int, attn_mask: Tensor | None
    ) -> Tensor:
        B, L, C = x.shape
        H, w = self.n_head, self.w
        q = (self.q_proj(x) / math.sqrt(w)).view(B, L, H, w).transpose(1, 2)  # (B, H, L, w), scale folded in
        k = self.k_proj(x).view(B, L, H, w).transpose(1, 2)  # (B, H, L, w)
        v = self.v_proj(x).view(B, L, H, w).transpose(1, 2)
        if cache is not None:
            k, v = cache.extend(layer, k, v)
        y = attend(q, k, v, causal=True, attn_mask=attn_mask)  # (B, H, L, w)
        out: Tensor = self.dropout(self.o_proj(y.transpose(1, 2).reshape(B, L, C)))
        return out


ATTENTION: dict[str, type[TraceAttention] | type[DotAttention]] = {"trace": TraceAttention, "dot": DotAttention}


class MLP(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.fc = nn.Linear(config.n_embd, config.mlp_ratio * config.n_embd)
        self.proj = nn.Linear(config.mlp_ratio * config.n_embd, config.n_embd)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = self.dropout(self.proj(F.gelu(self.fc(x))))
        return out


class Block(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd)
        self.attn = ATTENTION[config.attention](config)
        self.ln_2 = nn.LayerNorm(config.n_embd)
        self.mlp = MLP(config)

    def forward(
        self, x: Tensor, lc: LayerConditioning, cache: KVCache | None, layer: int, attn_mask: Tensor | None
    ) -> tuple[Tensor, Tensor]:
        h = self.ln_1(x)  # (B, L, C), also the input the turn summary reads
        x = x + self.attn(h, lc, cache, layer, attn_mask)
        x = x + self.mlp(self.ln_2(x))
        return x, h


class IdentityModel(nn.Module):
    """What generation, turns and the runtime rely on: a causal LM conditioned on one identity state per row.

    Subclasses (the native SIAModel, sia.backbones.llama.LlamaModel) build ``condition``, ``forward``, ``summarize`` and
    ``new_cache``; the stacking of states, pooling and the variant checks are shared here.
    """

    config: AnyConfig
    tokenizer: Tokenizer
    wte: nn.Embedding
    self_update: SelfUpdate
    pool: nn.Linear | None
    # whether a batched row computes bit for bit what it computes alone (LlamaModel with bfloat16 packed weights):
    # then a padded group is prefilled row by row (sia.model.batching)
    exact_rows: bool = False

    def condition(self, trace: Tensor, self_state: Tensor) -> Conditioning:
        raise NotImplementedError

    def decode_in(self, dtype: torch.dtype) -> IdentityModel:
        """Cast the weights to ``dtype`` to decode in it (bfloat16 halves them and, on GPUs and on CPUs with bfloat16
        instructions, decodes faster), keeping the self update, which writes the identity state, in float32; the
        turn statistics are pooled in float32 either way. Returns the model."""
        if not dtype.is_floating_point:
            raise ValueError(f"a model decodes in a floating-point dtype; got {dtype}")
        self.to(dtype)
        self.self_update.float()
        return self

    def new_cache(self, cond: Conditioning, max_tokens: int) -> KVCache:
        raise NotImplementedError

    def summarize(self, stats: TurnStats) -> TurnSummary:
        raise NotImplementedError

    def forward(
        self,
        idx: Tensor,
        cond: Conditioning,
        *,
        cache: KVCache | None = None,
        positions: Tensor | None = None,
        attn_mask: Tensor | None = None,
        summary_mask: Tensor | None = None,
        logits_from: int = 0,
    ) -> ModelOutput:
        raise NotImplementedError

    @property
    def stateful(self) -> bool:
        """False for the plain-attention variant, which ignores identity state."""
        return self.config.attention != "dot"

    @property
    def memory_after_reply(self) -> int:
        """Memory tokens a generation reads after the reply, in its own cache: the write's (none when the model ignores
        the state)."""
        return self.config.memory_tokens if self.stateful else 0

    @property
    def prefix_len(self) -> int:
        """Keys before the first token: the self slot, or none."""
        return 1 if self.stateful else 0

    @property
    def device(self) -> torch.device:
        return self.wte.weight.device

    def _check_state_shapes(self, trace: Tensor, self_state: Tensor) -> None:
        c = self.config
        if trace.dim() != 5 or trace.shape[1:] != c.trace_shape:
            raise ValueError(f"trace must be (B, {', '.join(map(str, c.trace_shape))}); got {tuple(trace.shape)}")
        if self_state.shape != (trace.shape[0], c.d_self):
            raise ValueError(f"self_state must be ({trace.shape[0]}, {c.d_self}); got {tuple(self_state.shape)}")

    def _positions_and_weights(
        self, idx: Tensor, cond: Conditioning, cache: KVCache | None, positions: Tensor | None, summary_mask: Tensor | None
    ) -> tuple[Tensor, Tensor]:
        """forward's checks and defaults: positions (B, L), next after the cache unless given, and the summary
        weight (B, L, 1) of each token (1 unless summary_mask says otherwise)."""
        B, L = idx.shape
        if cond.batch_size != B:
            raise ValueError(f"idx has {B} rows but the conditioning has {cond.batch_size}")
        start = 0 if cache is None else cache.tokens
        if positions is None:
            positions = torch.arange(start, start + L, device=idx.device).expand(B, L)
        if int(positions.max()) >= self.config.block_size:
            raise ValueError(f"position {int(positions.max())} exceeds the context of {self.config.block_size} tokens")
        weight = (torch.ones(B, L, device=idx.device) if summary_mask is None else summary_mask.float()).unsqueeze(-1)
        return positions, weight

    def condition_states(self, states: Sequence[IdentityState]) -> Conditioning:
        """Stack one IdentityState per row into a Conditioning."""
        if not states:
            raise ValueError("need at least one identity state")
        for state in states:
            state.validate(self.config)
        trace = torch.stack([s.trace for s in states]).to(self.device)
        selves = torch.stack([s.self_state for s in states]).to(self.device)
        return self.condition(trace, selves)

    def _pool(self, x: Tensor, weight: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Online-softmax pooling sums of x (B, L, C) over tokens with weight (B, L, 1) > 0."""
        B, L, _ = x.shape
        # (B, L); the scores in the pool's own dtype (a bfloat16 model), the sums in x's (float32)
        scores = x.new_zeros(B, L) if self.pool is None else self.pool(x.to(self.pool.weight.dtype)).squeeze(-1).to(x.dtype)
        counted = weight.squeeze(-1) > 0
        scores = scores.masked_fill(~counted, float("-inf"))
        top = scores.max(dim=1).values  # (B,)
        top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))  # a row with nothing counted
        e = torch.exp(scores - top.unsqueeze(-1)) * weight.squeeze(-1)  # (B, L)
        return (e.unsqueeze(-1) * x).sum(dim=1), top, e.sum(dim=1)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())


class SIAModel(IdentityModel):
    """A decoder-only transformer whose attention is conditioned on one identity state per batch row."""

    tokenizer: Tokenizer = ByteTokenizer()

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config: ModelConfig = config
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.wpe = nn.Embedding(config.block_size, config.n_embd)
        self.drop = nn.Dropout(config.dropout)
        blocks = [Block(config) for _ in range(config.n_layer)]
        self.blocks = nn.ModuleList(blocks)
        self.attentions = [block.attn for block in blocks]  # typed views of the registered modules
        self.ln_f = nn.LayerNorm(config.n_embd)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # tied
        self.self_update = SelfUpdate(config)
        # attention pooling of the turn's hidden states: a learned score per token (None: plain mean)
        self.pool = nn.Linear(config.n_embd, 1) if config.pooling == "attention" else None
        self.apply(self._init_weights)
        for name, p in self.named_parameters():
            if name.endswith(("o_proj.weight", "mlp.proj.weight")):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    # --- per-turn conditioning ---
    def condition(self, trace: Tensor, self_state: Tensor) -> Conditioning:
        """trace (B, n_layer, H, d, d) as stored, self_state (B, d_s) -> the turn's Conditioning."""
        c = self.config
        self._check_state_shapes(trace, self_state)
        if not self.stateful:
            return Conditioning(layers=[None] * c.n_layer, self_state=self_state)
        metric = stabilised_metric(trace.detach(), c)  # (B, n_layer, H, d, d)
        layers = [attn.condition(metric[:, i], self_state) for i, attn in enumerate(self.attentions)]
        return Conditioning(layers=layers, self_state=self_state)

    def new_cache(self, cond: Conditioning, max_tokens: int) -> KVCache:
        return KVCache(cond, max_tokens, n_head=self.config.n_head, width=self.config.head_dim)

    # --- forward ---
    def forward(
        self,
        idx: Tensor,
        cond: Conditioning,
        *,
        cache: KVCache | None = None,
        positions: Tensor | None = None,
        attn_mask: Tensor | None = None,
        summary_mask: Tensor | None = None,
        logits_from: int = 0,
    ) -> ModelOutput:
        """idx (B, L) token ids -> logits (B, L - logits_from, vocab) of positions ``logits_from`` on and the additive
        turn statistics of these tokens.

        positions (B, L) default to the next L positions after the cache; attn_mask is a boolean
        (B, 1, L, Lk) mask of visible keys including the self slot at key 0 (only needed for padded rows);
        summary_mask (B, L) picks the tokens that count towards the turn summary (default: all).
        """
        positions, weight = self._positions_and_weights(idx, cond, cache, positions, summary_mask)
        x = self.drop(self.wte(idx) + self.wpe(positions))  # (B, L, C)
        layer_inputs = []
        for i, (block, lc) in enumerate(zip(self.blocks, cond.layers, strict=True)):
            x, h = block(x, lc, cache, i, attn_mask)
            layer_inputs.append((h * weight).sum(dim=1))  # (B, C)
        if cache is not None:
            cache.advance(idx.shape[1])
        x = self.ln_f(x)  # (B, L, C)
        hidden, pool_max, pool_norm = self._pool(x, weight)
        stats = TurnStats(torch.stack(layer_inputs, dim=1), hidden, weight.sum(dim=(1, 2)), pool_max, pool_norm)
        return ModelOutput(logits=self.lm_head(x[:, logits_from:]), stats=stats)

    # --- what a turn leaves behind ---
    def summarize(self, stats: TurnStats) -> TurnSummary:
        """Turn sums into per-row summaries: unit-norm mean queries/keys (raw, pre-metric) and mean hidden z.

        Projections are affine, so mean(q) = W_q mean(h) + b_q: no per-token queries need to be kept.
        """
        if not self.stateful:
            raise ValueError(f"the {self.config.attention!r} attention variant keeps no identity state to summarise for")
        if bool((stats.count <= 0).any()):
            raise ValueError("a turn summary needs at least one counted token per row")
        c = self.config
        mean_in = stats.layer_inputs / stats.count.view(-1, 1, 1)  # (B, n_layer, C)
        queries, keys = [], []
        for i, attn in enumerate(self.attentions):
            queries.append(attn.q_proj(mean_in[:, i]).view(-1, c.n_head, c.qk_dim))  # (B, H, d)
            keys.append(attn.k_proj(mean_in[:, i]).view(-1, c.n_head, c.qk_dim))
        q = F.normalize(torch.stack(queries, dim=1), dim=-1)  # (B, n_layer, H, d)
        k = F.normalize(torch.stack(keys, dim=1), dim=-1)
        z = stats.hidden / stats.pool_norm.view(-1, 1)  # (B, C) pooled hidden state
        return TurnSummary(queries=q, keys=k, hidden=z)  # batched: (B, ...)
