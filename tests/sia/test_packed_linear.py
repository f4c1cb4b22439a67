"""The CPU's products (sia.backbones.packed_linear): the small-product form and the packed float32 and bfloat16
copies compute what ``nn.Linear`` computes, and a row never depends on the rows multiplied beside it."""

from __future__ import annotations

import pytest
import torch


@pytest.mark.parametrize("transposed", [True, False])
@pytest.mark.parametrize("rows", [1, 3, 40])
def test_the_small_product_form_computes_what_nn_linear_computes(
    rows: int, transposed: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``Linear``: few rows in float32 inference on a CPU run as (W xᵀ)ᵀ or as x Wᵀ, whichever the CPU runs faster
    (one row doubled); in either form the result is nn.Linear's to rounding, in shape and values, and with gradients
    on it is nn.Linear exactly."""
    from sia.backbones import packed_linear
    from sia.backbones.packed_linear import Linear

    assert isinstance(packed_linear.few_rows_transposed(), bool)  # timed once, on this CPU
    monkeypatch.setattr(packed_linear, "few_rows_transposed", lambda: transposed)

    g = torch.Generator().manual_seed(rows)
    layer = Linear(24, 40, bias=False)
    plain = torch.nn.Linear(24, 40, bias=False)
    with torch.no_grad():
        layer.weight.copy_(torch.randn(40, 24, generator=g))
        plain.weight.copy_(layer.weight)
    x = torch.randn(2, rows, 24, generator=g)[:1]  # (1, rows, 24)
    with torch.inference_mode():
        got = layer(x)
        torch.testing.assert_close(got, plain(x), atol=1e-5, rtol=1e-5)
        assert got.shape == (1, rows, 40) and got.is_contiguous()
    y = layer(x.requires_grad_())
    assert torch.equal(y, plain(x)) and y.requires_grad


def test_packed_weights_compute_what_nn_linear_computes_and_a_row_does_not_depend_on_its_mates() -> None:
    """``Linear.pack``: from PACKED_MIN_ROWS rows on, float32 inference on a CPU multiplies with oneDNN's packed
    copy: nn.Linear's result to rounding, every row bit for bit the same whichever rows come with it; one and two
    rows keep the small-product form; gradients, and a weight changed in place, never read a stale copy."""
    from sia.backbones.packed_linear import PACKED_MIN_ROWS, Linear, packing_available

    if not packing_available():
        pytest.skip("this torch build has no oneDNN to pack weights with")
    g = torch.Generator().manual_seed(0)
    layer = Linear(48, 80, bias=False)
    plain = torch.nn.Linear(48, 80, bias=False)
    with torch.no_grad():
        layer.weight.copy_(torch.randn(80, 48, generator=g))
        plain.weight.copy_(layer.weight)
    assert layer.pack() == 80 * 48 * 4 and layer.packed is not None
    x = torch.randn(40, 48, generator=g)
    with torch.inference_mode():
        whole = layer(x)
        torch.testing.assert_close(whole, plain(x), atol=1e-5, rtol=1e-5)
        for rows in (PACKED_MIN_ROWS, 8, 17):
            assert torch.equal(layer(x[:rows]), whole[:rows]), rows  # the same bits in any company
        torch.testing.assert_close(layer(x[:1]), plain(x[:1]), atol=1e-5, rtol=1e-5)
        assert layer(x.view(4, 10, 48)).shape == (4, 10, 80)
    y = layer(x.requires_grad_())
    assert torch.equal(y, plain(x)) and y.requires_grad
    with torch.no_grad():
        layer.weight.mul_(2.0)  # an in-place change retires the packed copy
        torch.testing.assert_close(layer(x[:8]), 2 * plain(x[:8]), atol=1e-5, rtol=1e-5)
    layer.unpack()
    assert layer.packed is None
    with pytest.raises(ValueError, match="float32"):
        Linear(4, 4, bias=False).to(torch.bfloat16).pack()


def test_bfloat16_packed_weights_round_as_autocast_and_a_row_never_depends_on_its_mates() -> None:
    """``Linear.pack(torch.bfloat16)``: every product (one row too) multiplies the bfloat16 copy, x rounded to
    bfloat16 and the result returned in float32: nn.Linear's result to bfloat16's rounding, and each row bit for bit
    the same alone or with up to 32 rows (one row is doubled: oneDNN's one-row kernel sums in another order). On CPUs
    with AMX, oneDNN multiplies more than 32 rows with another kernel that sums in another order (measured: 33 rows
    and more differ by ~5e-7); a batch (SIA_MAX_BATCH, default 16) stays under that."""
    from sia.backbones.packed_linear import NO_BFLOAT16_PACKING, Linear, bfloat16_packing_available, packing_available

    if not packing_available():
        pytest.skip("this torch build has no oneDNN to pack weights with")
    g = torch.Generator().manual_seed(0)
    layer = Linear(576, 192, bias=False)
    with torch.no_grad():
        layer.weight.copy_(torch.randn(192, 576, generator=g) * 0.05)
    if not bfloat16_packing_available():  # an AVX2-only CPU: refused with the reason, nothing packed
        with pytest.raises(ValueError, match="cannot pack bfloat16"):
            layer.pack(torch.bfloat16)
        assert layer.packed is None
        pytest.skip(f"{NO_BFLOAT16_PACKING}: its refusal checked")
    assert layer.pack(torch.bfloat16) == 192 * 576 * 2 and layer.packed_dtype == torch.bfloat16
    x = torch.randn(32, 576, generator=g)
    want = torch.nn.functional.linear(x, layer.weight)
    with torch.inference_mode():
        whole = layer(x)
        assert whole.dtype == torch.float32
        torch.testing.assert_close(whole, want, atol=0.05, rtol=0.02)  # bfloat16 keeps 8 bits of each factor
        assert not torch.equal(whole, want)  # and it is really the bfloat16 product
        for rows in (1, 2, 3, 8, 17):
            assert torch.equal(layer(x[:rows]), whole[:rows]), rows
        assert torch.equal(layer(x[5:6]), whole[5:6])
    with pytest.raises(ValueError, match="float32 or bfloat16"):
        layer.pack(torch.float16)


@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("rows", [1, 3, 40])
def test_a_bias_is_added_on_every_path_as_nn_linear_adds_it(rows: int, packed: bool) -> None:
    """The small-product and packed paths multiply only; a layer with a bias still returns nn.Linear's result (a head
    biased against a token must never pick it)."""
    from sia.backbones.packed_linear import Linear, packing_available

    if packed and not packing_available():
        pytest.skip("this torch build cannot pack weights (no oneDNN)")
    g = torch.Generator().manual_seed(rows)
    layer = Linear(24, 40, bias=True)
    plain = torch.nn.Linear(24, 40, bias=True)
    with torch.no_grad():
        layer.weight.copy_(torch.randn(40, 24, generator=g))
        layer.bias.copy_(torch.randn(40, generator=g))
        layer.bias[7] = -1e4
        plain.load_state_dict(layer.state_dict())
    if packed:
        layer.pack()
    x = torch.randn(rows, 24, generator=g)
    with torch.inference_mode():
        got = layer(x)
        torch.testing.assert_close(got, plain(x), atol=1e-4, rtol=1e-5)
        assert int(got.argmin(-1).unique().item()) == 7
