"""``Linear``: the backbone's matrix products, with faster paths for float32 inference on a CPU: a few rows as W·xᵀ,
and products with a copy of the weight packed in oneDNN's blocked layout (float32 or bfloat16); with the checks of
what this torch build and this CPU can pack (docs/performance.md). ``Stacked``: several such products of one input as
one.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Sequence

import torch
from torch import Tensor, nn

__all__ = [
    "NO_BFLOAT16_PACKING",
    "PACKED_DTYPES",
    "PACKED_MIN_ROWS",
    "SMALL_PRODUCT_ROWS",
    "Linear",
    "Stacked",
    "bfloat16_packing_available",
    "bfloat16_products_fast",
    "cast",
    "few_rows_transposed",
    "packing_available",
]


SMALL_PRODUCT_ROWS = 32  # up to this many rows (decoding: one per batch row), a float32 CPU product runs as W·xᵀ
PACKED_MIN_ROWS = 3  # from this many rows on, a float32 CPU product uses the packed copy of its weight, if it has one
PACKED_DTYPES = (torch.float32, torch.bfloat16)  # what a packed copy may hold


def packing_available() -> bool:
    """Whether this torch build can pack weights for oneDNN's matrix products (x86 CPU builds can)."""
    ops = torch.ops.mkldnn
    built = bool(torch._C._has_mkldnn)  # what torch.backends.mkldnn.is_available() reads
    return built and hasattr(ops, "_reorder_linear_weight") and hasattr(ops, "_linear_pointwise")


NO_BFLOAT16_PACKING = (
    "this CPU cannot pack bfloat16 weights (oneDNN's bfloat16 products need AVX-512 BW, VL and DQ, or AVX-NE-CONVERT)"
)


@functools.cache
def bfloat16_packing_available() -> bool:
    """Whether oneDNN can pack bfloat16 weights on this CPU (tried once on a small matrix): its bfloat16 path needs
    AVX-512 BW, VL and DQ or AVX-NE-CONVERT, which AVX2-only CPUs lack."""
    if not packing_available():
        return False
    try:
        torch.ops.mkldnn._reorder_linear_weight(torch.zeros(16, 16, dtype=torch.bfloat16), None)
    except RuntimeError:
        return False
    return True


@functools.cache
def bfloat16_products_fast() -> bool:
    """Whether this CPU multiplies bfloat16 matrices no slower than float32 ones (timed once): it does with native
    bfloat16 instructions (AVX-512 BF16, AMX); without them bfloat16 is emulated, measured 86x slower."""
    times = {}
    for dtype in (torch.float32, torch.bfloat16):
        a, b = torch.randn(128, 576, dtype=dtype), torch.randn(576, 576, dtype=dtype)
        a @ b
        start = time.perf_counter()
        for _ in range(5):
            a @ b
        times[dtype] = time.perf_counter() - start
    return times[torch.bfloat16] <= 1.2 * times[torch.float32]


@functools.cache
def few_rows_transposed() -> bool:
    """Whether this CPU multiplies a few float32 rows by a weight faster as (W xᵀ)ᵀ than as x Wᵀ (timed once, two rows
    by a 75 MB matrix, so the weight streams from memory as a decoding step's do). CPUs differ by a factor of two to
    four either way: on a 2-core AMD EPYC every matrix of a SmolLM2 step took 22 ms as (W xᵀ)ᵀ against 52 ms; on a
    2-core Xeon with AMX the head's product took 7.8 ms that way against 2.6 ms (experiments/LOG.md, 2026-12-04 (k))."""
    w, pair = torch.randn(32768, 576), torch.randn(2, 576)
    best = {True: float("inf"), False: float("inf")}
    for _ in range(3):
        for transposed in (True, False):
            start = time.perf_counter()
            torch.mm(w, pair.t()) if transposed else torch.mm(pair, w.t())
            best[transposed] = min(best[transposed], time.perf_counter() - start)
    return best[True] < best[False]


def cast(t: Tensor, dtype: torch.dtype) -> Tensor:
    """``t`` in ``dtype``; ``t`` itself, with no operator called, where it is in it already (``t.to`` its own dtype
    returns ``t`` too, but as an operator of 1-3 µs, and a decoding step would call some 300 of them)."""
    return t if t.dtype == dtype else t.to(dtype)


class Linear(nn.Linear):
    """``nn.Linear`` (no bias) with faster paths for float32 inference on a CPU (no gradients):

    * at most SMALL_PRODUCT_ROWS rows, one row doubled to two (both kernels multiply a single row in another, slower
      or differently rounded way), computed as (W xᵀ)ᵀ or as x Wᵀ, whichever this CPU runs faster
      (``few_rows_transposed``, timed once: the BLAS kernels for a few rows are two to four times slower in one
      orientation, and which one depends on the CPU; docs/performance.md);
    * after ``pack()``, from PACKED_MIN_ROWS rows on (batched decoding, prefill), oneDNN's product with a copy of W
      in its own blocked layout: eight rows 1.6x and sixteen 1.8x faster again, and a row's result does not depend
      on how many rows are multiplied with it. The copy costs W's size in memory, so packing is asked for, not
      automatic; it is used only while W is the tensor it was made from (an in-place change of W retires it);
    * after ``pack(torch.bfloat16)``, every product (any number of rows) with a bfloat16 copy of W in that layout,
      x rounded to bfloat16 on the way in and the result returned in float32, as under bfloat16 autocast: half the
      bytes to read, so decoding, which is bound by reading the weights, runs faster on CPUs with bfloat16
      instructions, and a row's result still does not depend on its mates (the same kernel for one row or many).

    Anything else (a GPU, bfloat16, gradients) is ``nn.Linear`` as it is."""

    packed: Tensor | None = None
    packed_dtype: torch.dtype = torch.float32  # the copy's: float32, or bfloat16 (every product then uses it)
    min_rows = PACKED_MIN_ROWS  # products of this many rows or more use the copy
    _packed_from: tuple[int, int] = (0, -1)  # W's storage and version when packed

    def pack(self, dtype: torch.dtype = torch.float32, *, every_row: bool = False) -> int:
        """Keep a packed copy of the weight in ``dtype``: float32 (for products of PACKED_MIN_ROWS rows or more, or
        of any number with ``every_row``) or bfloat16 (for every product, rounded as under bfloat16 autocast);
        returns the copy's bytes."""
        w = self.weight
        if w.device.type != "cpu" or w.dtype != torch.float32:
            raise ValueError(f"only float32 weights on a CPU are packed; this one is {w.dtype} on {w.device}")
        if dtype not in PACKED_DTYPES:
            raise ValueError(f"weights are packed in float32 or bfloat16; got {dtype}")
        if not packing_available():
            raise ValueError("this torch build cannot pack weights (oneDNN is not available)")
        if dtype == torch.bfloat16 and not bfloat16_packing_available():
            raise ValueError(f"{NO_BFLOAT16_PACKING}; pack them in float32")
        with torch.no_grad():
            self.packed = torch.ops.mkldnn._reorder_linear_weight(w.detach().to(dtype), None)
        self.packed_dtype = dtype
        self.min_rows = 1 if every_row or dtype == torch.bfloat16 else PACKED_MIN_ROWS
        self._packed_from = (w.data_ptr(), w._version)
        return w.numel() * dtype.itemsize

    def unpack(self) -> None:
        """Drop the packed copy (its memory is freed): back to the unpacked paths."""
        self.packed = None

    def forward(self, x: Tensor) -> Tensor:
        w = self.weight
        rows = x.numel() // x.shape[-1]
        cpu_float32 = w.device.type == "cpu" and w.dtype == torch.float32 and x.dtype == torch.float32
        if not cpu_float32 or torch.is_grad_enabled():
            return super().forward(x)
        flat = x.reshape(rows, x.shape[-1])
        # one row doubled to two: both kernels multiply a single row in another, slower or differently rounded way
        pair = torch.cat([flat, flat]) if rows == 1 else flat
        packed = self.packed is not None and self._packed_from == (w.data_ptr(), w._version)
        if packed and rows >= self.min_rows:
            product = torch.ops.mkldnn._linear_pointwise(
                cast(pair, self.packed_dtype).contiguous(), self.packed, None, "none", [], ""
            )
            out: Tensor = cast(product[:rows], x.dtype)
        elif rows <= SMALL_PRODUCT_ROWS:
            # (rows, out) either way
            out = torch.mm(w, pair.t()).t()[:rows].contiguous() if few_rows_transposed() else torch.mm(pair, w.t())[:rows]
        else:
            return super().forward(x)
        if self.bias is not None:  # the products above multiply only; a bias is added as nn.Linear adds it
            out = out + self.bias
        return out.view(*x.shape[:-1], w.shape[0])


_STACKING = threading.Lock()  # a stack is (re)built by one thread at a time (a prefill and the decoding steps may race)


class Stacked:
    """The products of several ``Linear`` maps of one input (a layer's query, key and value maps; the MLP's gate and up
    maps) as one: their weights stacked as the rows of one matrix, which the parts' weights then are views of (no second
    copy), so that an inference step multiplies once instead of once per part (each product costs a decoding step
    5-8 operators besides its arithmetic). The parts stay the modules that training, loading and the state dict see;
    their products are this one's output split by rows.

    Rebuilt when a part's weight is no longer its view (after ``Module.to``, or a weight assigned anew), and packed again
    as ``pack`` last asked. In-place changes of a part (an optimiser's step, ``load_state_dict``) are changes of the
    stack: they share its memory (and its version counter, which retires a packed copy made before them)."""

    def __init__(self, parts: Sequence[Linear]) -> None:
        if not parts or any(p.bias is not None for p in parts) or len({p.in_features for p in parts}) != 1:
            raise ValueError("a stack needs one or more bias-free Linear maps of one input width")
        self.parts = list(parts)
        self.product: Linear | None = None
        self.packing: tuple[torch.dtype, bool] | None = None  # what ``pack`` asked for: dtype, every_row

    @property
    def sizes(self) -> list[int]:
        """Each part's share of the product's columns, in order."""
        return [p.out_features for p in self.parts]

    def __call__(self, x: Tensor) -> Tensor:
        """x (..., C) -> the parts' products side by side (..., sum of their out_features)."""
        out: Tensor = self.linear()(x)
        return out

    def linear(self) -> Linear:
        """The stacked product, (re)built if a part's weight is no longer its view."""
        product = self.product
        if product is None or not self._shared(product.weight):
            with _STACKING:
                product = self.product
                if product is None or not self._shared(product.weight):
                    product = self.product = self._build()
        return product

    def _shared(self, stack: Tensor) -> bool:
        """Whether every part's weight is its rows of ``stack``."""
        at = stack.data_ptr()
        for p in self.parts:
            w = p.weight
            if w.dtype != stack.dtype or w.device != stack.device or w.data_ptr() != at:
                return False
            at += w.numel() * w.element_size()
        return True

    def _build(self) -> Linear:
        with torch.inference_mode(False), torch.no_grad():  # the parts' new memory must serve training too
            stack = torch.cat([p.weight.detach() for p in self.parts])  # (sum of out_features, C)
            at = 0
            for p in self.parts:
                n = p.out_features
                p.weight.data = stack[at : at + n]  # the same parameter, its memory now the stack's
                at += n
            product = Linear(stack.shape[1], stack.shape[0], bias=False, device="meta")
            product.weight = nn.Parameter(stack, requires_grad=False)
        if self.packing is not None and stack.device.type == "cpu" and stack.dtype == torch.float32:
            dtype, every_row = self.packing
            product.pack(dtype, every_row=every_row)
        return product

    def pack(self, dtype: torch.dtype = torch.float32, *, every_row: bool = False) -> int:
        """``Linear.pack`` of the stacked product, kept across rebuilds; returns the copy's bytes."""
        self.packing = None
        bytes_ = self.linear().pack(dtype, every_row=every_row)
        self.packing = (dtype, every_row)
        return bytes_

    def unpack(self) -> None:
        """Drop the packed copy, now and after rebuilds."""
        self.packing = None
        if self.product is not None:
            self.product.unpack()
