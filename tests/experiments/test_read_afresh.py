"""experiments.read_afresh: the bundled checkpoint's read parts taken away, so that a read trains from the start."""

from __future__ import annotations

from dataclasses import replace

import torch
from transformers import LlamaConfig as HFLlamaConfig
from transformers import LlamaForCausalLM

from experiments.read_afresh import REPLY_SETTINGS, strip
from sia.backbones.llama import LlamaModel
from sia.model.config import LlamaConfig
from sia.model.tokenizer import ByteTokenizer
from tests.sia.conftest import hf_tiny


def test_strip_takes_the_gate_tagger_ask_head_and_their_settings_and_a_fresh_read_follows() -> None:
    torch.manual_seed(0)
    hf_config = hf_tiny(num_hidden_layers=2)
    hf = LlamaForCausalLM(HFLlamaConfig(**hf_config)).eval()
    model = LlamaModel(LlamaConfig.from_hf(hf_config, d_self=8, trace_layers=[0]), ByteTokenizer()).eval()
    model.load_base(hf.state_dict())
    model.add_imprint(24, 4, kinds_layer=1)
    model.add_imprint_gate()
    model.add_ask_head(2.0)
    model.config = replace(model.config, imprint_untold=["colour"], imprint_echo=["job"])
    kept = {k: v.clone() for k, v in model.identity_state_dict().items() if "imprint" not in k}
    strip(model)
    assert model.imprint_kind is None and model.imprint_ask is None
    assert not model.config.imprint_gate and not model.config.imprint_ask_bias and model.config.imprint_kinds_layer is None
    assert all(getattr(model.config, k) is None for k in REPLY_SETTINGS)
    state = model.identity_state_dict()
    assert not any("imprint_gate" in k or "imprint_kind" in k or "imprint_ask" in k for k in state)
    assert all(torch.equal(state[k], v) for k, v in kept.items())  # the slots and everything else as they were
    model.add_imprint(24, 4)  # what a read trained from the start begins with: refused before the strip
    assert model.config.imprint_read_rank == 4
