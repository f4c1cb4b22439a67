"""The native SIA model: byte-level, decoder-only, pre-norm, Trace Tensor Attention and a self slot in every layer.

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
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from sia.identity.imprint import ImprintEntries
from sia.identity.state import SelfUpdate, TurnSummary, stabilised_metric
from sia.model.attention import attend, key_bias
from sia.model.conditioning import Conditioning
from sia.model.config import ModelConfig
from sia.model.identity_model import IdentityModel, ModelOutput
from sia.model.kv_cache import KVCache
from sia.model.summary_sums import SummarySums
from sia.model.tokenizer import ByteTokenizer, Tokenizer

__all__ = ["ATTENTION", "DotAttention", "LayerConditioning", "SIAModel", "TraceAttention"]


@dataclass
class LayerConditioning:
    q_weight: Tensor  # (B, H*w, C) folded query projection, bias row included
    q_bias: Tensor  # (B, 1, H*w)
    metric: Tensor  # (B, H, d, d) M
    slot_key: Tensor  # (B, H, 1, w) augmented self-slot key
    slot_value: Tensor  # (B, H, 1, w)


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
    def condition(
        self,
        trace: Tensor,
        self_state: Tensor,
        imprint: ImprintEntries | None = None,
        reads_from: Tensor | None = None,
        asked: Tensor | None = None,
    ) -> Conditioning:
        """trace (B, n_layer, H, d, d) as stored, self_state (B, d_s) -> the turn's Conditioning (no imprint: the native
        model keeps none)."""
        if imprint is not None or asked is not None:
            raise ValueError("the native model keeps no imprint")
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
        stats = SummarySums(torch.stack(layer_inputs, dim=1), hidden, weight.sum(dim=(1, 2)), pool_max, pool_norm)
        return ModelOutput(logits=self.lm_head(x[:, logits_from:]), stats=stats)

    # --- what a turn leaves behind ---
    def summarize(self, stats: SummarySums) -> TurnSummary:
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
