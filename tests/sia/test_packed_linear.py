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


def _parts(seed: int) -> list[torch.nn.Module]:
    from sia.backbones.packed_linear import Linear

    g = torch.Generator().manual_seed(seed)
    parts = [Linear(24, n, bias=False) for n in (16, 8, 8)]
    with torch.no_grad():
        for p in parts:
            p.weight.copy_(torch.randn(p.weight.shape, generator=g))
    return parts


def test_a_stack_multiplies_once_what_its_parts_multiply_and_keeps_no_second_copy() -> None:
    """``Stacked``: one product whose columns are the parts' products side by side (to rounding); the parts' weights
    become views of its matrix (the same parameters, no second copy), so an in-place change of a part, as an
    optimiser's step makes, is the stack's too."""
    from sia.backbones.packed_linear import Stacked

    parts = _parts(0)
    params = [p.weight for p in parts]
    expected_weights = [w.detach().clone() for w in params]
    x = torch.randn(3, 5, 24, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = torch.cat([p(x) for p in parts], dim=-1)
    stack = Stacked(parts)
    assert stack.sizes == [16, 8, 8]
    with torch.inference_mode():
        got = stack(x)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    assert got.shape == (3, 5, 32)
    matrix = stack.linear().weight
    assert [p.weight for p in parts] == params  # the same parameter objects (an optimiser holding them still works)
    for p, w, at in zip(parts, expected_weights, (0, 16, 24), strict=True):
        assert torch.equal(p.weight, w) and p.weight.untyped_storage().data_ptr() == matrix.untyped_storage().data_ptr()
        assert p.weight.data_ptr() == matrix.data_ptr() + at * 24 * 4
    # training after inference: the parts' products with gradients, an optimiser's step seen by the stack
    optimiser = torch.optim.SGD(params, lr=0.5)
    loss = sum(p(x).square().mean() for p in parts)
    assert isinstance(loss, torch.Tensor)
    loss.backward()
    assert all(w.grad is not None and w.grad.abs().sum() > 0 for w in params)
    optimiser.step()
    assert stack.linear().weight is matrix  # not rebuilt: the step changed its memory in place
    with torch.no_grad():
        torch.testing.assert_close(stack(x), torch.cat([p(x) for p in parts], dim=-1), atol=1e-5, rtol=1e-5)
        assert not torch.allclose(stack(x), expected, atol=1e-3)


def test_a_stack_is_built_again_when_its_parts_are_converted_or_replaced_and_packs_again() -> None:
    """After ``Module.to`` (new memory for each part) or a weight assigned anew the stack is built again from the
    parts as they are, and packed again as it was; a part with a bias or another input width is refused."""
    from sia.backbones.packed_linear import Linear, Stacked, packing_available

    parts = _parts(2)
    holder = torch.nn.ModuleList(parts)
    stack = Stacked(parts)
    x = torch.randn(4, 24, generator=torch.Generator().manual_seed(3))
    first = stack.linear()
    holder.to(torch.float64)
    with torch.no_grad():
        got = stack(x.double())
        torch.testing.assert_close(got, torch.cat([p(x.double()) for p in parts], dim=-1))
    assert stack.linear() is not first and stack.linear().weight.dtype == torch.float64
    holder.to(torch.float32)
    with torch.no_grad():
        parts[1].weight = torch.nn.Parameter(torch.zeros(8, 24))
        assert torch.equal(stack(x)[:, 16:24], torch.zeros(4, 8))
        assert parts[1].weight.data_ptr() == stack.linear().weight.data_ptr() + 16 * 24 * 4
    if packing_available():
        assert stack.pack() == 32 * 24 * 4 and stack.linear().packed is not None
        holder.to(torch.float64)
        holder.to(torch.float32)  # new memory: built again, and packed again
        assert stack.linear().packed is not None and stack.packing == (torch.float32, False)
        stack.unpack()
        assert stack.linear().packed is None and stack.packing is None
    with pytest.raises(ValueError, match="bias-free"):
        Stacked([Linear(24, 8, bias=True)])
    with pytest.raises(ValueError, match="one input width"):
        Stacked([Linear(24, 8, bias=False), Linear(16, 8, bias=False)])
