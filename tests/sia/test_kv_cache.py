from __future__ import annotations

import torch

from sia.model.conditioning import Conditioning
from sia.model.kv_cache import KVCache


def test_narrower_keys_and_values_fill_a_layers_first_columns_and_the_rest_stay_zero() -> None:
    """A decoding step hands the cache its keys and values at their own widths (the rotated key, the metric's columns
    in a trace layer; the value) and the cache writes them into its zero columns' first ones: the prefix it returns is
    what padding them first gave, also where a reply taken back is written over at the same width."""
    g = torch.Generator().manual_seed(0)
    cache = KVCache(Conditioning(layers=[None, None], self_state=torch.zeros(2, 1)), 4, n_head=3, width=[8, 6])
    k, v = torch.randn(2, 3, 2, 5, generator=g), torch.randn(2, 3, 2, 4, generator=g)
    keys, values = cache.extend(0, k, v)
    assert keys.shape == values.shape == (2, 3, 2, 8)
    assert torch.equal(keys, torch.nn.functional.pad(k, (0, 3))) and torch.equal(values, torch.nn.functional.pad(v, (0, 4)))
    cache.advance(2)
    cache.length -= 1  # the newest column forgotten (a reply taken back, alone), then written again
    k2, v2 = torch.randn(2, 3, 1, 5, generator=g), torch.randn(2, 3, 1, 4, generator=g)
    keys, values = cache.extend(0, k2, v2)
    assert torch.equal(keys, torch.nn.functional.pad(torch.cat([k[:, :, :1], k2], 2), (0, 3)))
    assert torch.equal(values, torch.nn.functional.pad(torch.cat([v[:, :, :1], v2], 2), (0, 4)))
    full = torch.randn(2, 3, 1, 6, generator=g)  # a layer's full width is written as it is
    keys, values = cache.extend(1, full, full)
    assert torch.equal(keys[:, :, 1:], full) and torch.equal(values[:, :, 1:], full)
