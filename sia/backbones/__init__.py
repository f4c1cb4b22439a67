"""Pretrained backbones with TTA and the self slot injected: LLaMA-family weights, their chat tokenizer."""
