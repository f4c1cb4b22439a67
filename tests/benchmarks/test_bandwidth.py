"""The bandwidth benchmark counts the bytes of every matrix one decoding step multiplies, and measures a copy."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import torch

from benchmarks.bandwidth import copy_bandwidth, step_weight_bytes
from sia.backbones.llama import LlamaModel
from sia.checkpoint import load_model
from sia.identity.state import IdentityState
from tests.sia.conftest import build_tiny_vocab, write_tiny_gguf


def test_a_step_reads_every_projection_and_the_head_once(tmp_path: Path) -> None:
    tiny = write_tiny_gguf(tmp_path / "tiny.gguf", build_tiny_vocab())
    model = load_model(tiny.path, cache_dir=tmp_path / "models")
    assert isinstance(model, LlamaModel)
    c = model.config
    base = LlamaModel(replace(c, attention="dot"), model.tokenizer)  # the stateless model (its weights' values aside)
    per_layer = (
        2 * c.n_embd * c.n_head * c.head_dim + 2 * c.n_embd * c.n_kv_head * c.head_dim + 3 * c.n_embd * c.intermediate_size
    )
    expected = 4 * (c.n_layer * per_layer + c.vocab_size * c.n_embd)  # float32: the layers' seven maps and the head
    fresh = IdentityState.fresh(c)
    with torch.no_grad():
        counted = step_weight_bytes(base, [1, 2, 3], fresh)
        stateful = step_weight_bytes(model, [1, 2, 3], fresh)
    # the query, key and value maps multiplied as one product, the gate and up maps as another: four a layer
    assert counted == {"weight_bytes": expected, "linear_maps": 4 * c.n_layer + 1}
    # the stateful model multiplies one more map a layer, its queries' tail (the bias and gate columns, as inference
    # computes them outside any module), and nothing is counted twice
    tails = sum(4 * a.H * a.tail * c.n_embd for a in model.attentions)
    assert stateful == {"weight_bytes": expected + tails, "linear_maps": counted["linear_maps"] + c.n_layer}


def test_the_copy_moves_the_bytes_it_says() -> None:
    copy = copy_bandwidth(8, 2)
    assert copy["bytes"] == 8 * 2**20
    assert copy["copy_gb_per_s"] == 2 * copy["read_gb_per_s"] > 0
    assert abs(copy["copy_gb_per_s"] - 2 * copy["bytes"] / copy["seconds"] / 1e9) < 1e-9
