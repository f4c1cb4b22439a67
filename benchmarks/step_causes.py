"""Where a decoding step goes (section 7 of ``benchmarks.backbone``): the SDPA kernel alone at every width the models
use, called with ``enable_gqa`` and with query heads folded (SIA's float32 and bfloat16 forms on a CPU), and a profile
of the ATen ops of one step with and without the state."""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.profiler import ProfilerActivity, profile

from sia.backbones.llama import LlamaModel
from sia.identity.state import IdentityState

MATMUL_OPS = ("aten::mm", "aten::addmm", "aten::bmm")


# --- 7. where a decoding step goes (the cause of a missed target) ---------------------------------------------------


def sdpa_gqa(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """How sia.model.attention.attend calls the kernel at a float32 decoding step: q (B, H, 1, w), k and v (B, H_kv, Lk,
    w)."""
    return F.scaled_dot_product_attention(q, k, v, scale=1.0, enable_gqa=True)


def sdpa_folded(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """The same result with the G query heads of each key/value head folded into the query length (exact for one new
    query, which sees every key): q (B, H_kv, G, w), as sia.model.attention.attend calls it at a bfloat16 step on a CPU
    and transformers for a padded batch."""
    B, H, _, w = q.shape
    H_kv = k.shape[1]
    return F.scaled_dot_product_attention(q.view(B, H_kv, H // H_kv, w), k, v, scale=1.0)


def kernel_times(model: LlamaModel, dtype: torch.dtype, rows: int, keys: int, calls: int = 100) -> dict[str, Any]:
    """Median us per SDPA call at a decoding step's shapes (k, v views of a longer cache), for every kernel width the
    models use, called both ways."""
    c = model.config
    out: dict[str, Any] = {}
    for w in sorted({attn.w for attn in model.attentions} | {c.head_dim}):
        q = torch.randn(rows, c.n_head, 1, w, dtype=dtype)
        k = torch.randn(rows, c.n_kv_head, keys + 64, w, dtype=dtype)[:, :, :keys]
        v = torch.randn(rows, c.n_kv_head, keys + 64, w, dtype=dtype)[:, :, :keys]
        times: dict[str, float] = {}
        for name, form in (("gqa_us", sdpa_gqa), ("folded_us", sdpa_folded)):
            for _ in range(10):
                form(q, k, v)
            runs = []
            for _ in range(5):
                t0 = time.perf_counter()
                for _ in range(calls):
                    form(q, k, v)
                runs.append((time.perf_counter() - t0) / calls)
            times[name] = 1e6 * statistics.median(runs)
        out[str(w)] = times
    return out


def step_profile(model: LlamaModel, prompt: list[int], states: list[IdentityState], steps: int = 8) -> dict[str, Any]:
    """ATen ops per decoding step and their self CPU time by kind, under torch.profiler (which inflates the times)."""
    rows = len(states)
    with torch.inference_mode():
        cond = model.condition_states(states)
        cache = model.new_cache(cond, len(prompt) + steps)
        model(torch.tensor([prompt] * rows), cond, cache=cache)
        token = torch.full((rows, 1), prompt[-1])
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(steps):
                model(token, cond, cache=cache)
    kinds = {"matmul": 0.0, "attention kernel": 0.0, "other": 0.0}
    ops = 0
    for event in prof.key_averages():
        ops += event.count
        kind = "matmul" if event.key in MATMUL_OPS else "attention kernel" if "scaled_dot_product" in event.key else "other"
        kinds[kind] += event.self_cpu_time_total / 1000 / steps
    return {"ops_per_step": ops / steps, "self_ms_per_step": kinds}


def run_causes(model: LlamaModel, twin: LlamaModel, prompt: list[int], state: IdentityState, tokens: int) -> dict[str, Any]:
    keys = len(prompt) + tokens // 2 + 1  # a mid-reply step: prompt, half the reply, the self slot
    out: dict[str, Any] = {"keys": keys, "kernel": {}, "profile": {}}
    widths = {"sia": [attn.w for attn in model.attentions], "dot": [attn.w for attn in twin.attentions]}
    for rows in (1, 8):
        times = kernel_times(model, model.wte.weight.dtype, rows, keys)
        per_step = {  # the kernel's time in one decoding step: one call per layer at that layer's width
            f"{name}_{form}_ms": sum(times[str(w)][f"{form}_us"] for w in ws) / 1000
            for name, ws in widths.items()
            for form in ("gqa", "folded")
        }
        out["kernel"][str(rows)] = {"us_per_call": times, "per_step": per_step}
        out["profile"][str(rows)] = {name: step_profile(m, prompt, [state] * rows) for name, m in (("sia", model), ("dot", twin))}
    return out
