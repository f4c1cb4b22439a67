"""The model: its configuration, Trace Tensor Attention, the native transformer, the byte tokenizer, decoding."""
