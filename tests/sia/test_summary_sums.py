"""The turn's mergeable sums (sia.model.summary_sums): merged in any grouping they give the same summary, and a row to
which a merge adds no token keeps its sums bit for bit."""

from __future__ import annotations

import torch

from sia.model.summary_sums import SummarySums


def sums(g: torch.Generator, B: int, counted: list[int]) -> SummarySums:
    """Sums of B rows over ``counted`` tokens each (0: a row that read nothing counted, as ``_pool`` leaves it)."""
    count = torch.tensor(counted, dtype=torch.float32)
    pool_max = torch.where(count > 0, torch.randn(B, generator=g) - 3.0, torch.zeros(B))  # below 0: a merge rescales
    return SummarySums(
        layer_inputs=torch.randn(B, 2, 4, generator=g) * (count > 0).view(B, 1, 1),
        hidden=torch.randn(B, 4, generator=g) * (count > 0).view(B, 1),
        count=count,
        pool_max=pool_max,
        pool_norm=torch.rand(B, generator=g) * (count > 0) + (count > 0).float(),
    )


def test_a_row_to_which_a_merge_adds_nothing_keeps_its_sums_bit_for_bit() -> None:
    g = torch.Generator().manual_seed(0)
    before = sums(g, 3, [4, 2, 5])
    step = sums(g, 3, [1, 0, 1])  # row 1 has stopped: the step counts none of its tokens
    merged = before + step
    for name in ("layer_inputs", "hidden", "count", "pool_max", "pool_norm"):
        assert torch.equal(getattr(merged, name)[1], getattr(before, name)[1]), name
    # the other rows merge as the online softmax does: their pooled mean is that of all their tokens
    for b in (0, 2):
        top = torch.maximum(before.pool_max[b], step.pool_max[b])
        want = before.hidden[b] * torch.exp(before.pool_max[b] - top) + step.hidden[b] * torch.exp(step.pool_max[b] - top)
        torch.testing.assert_close(merged.hidden[b], want)
        assert float(merged.count[b]) == float(before.count[b] + step.count[b])
    # unchanged where every row adds something
    full = sums(g, 3, [1, 1, 1])
    plain = before + full
    assert bool((plain.count == before.count + 1).all())
