"""The quantized matmul kernels on any layer shape the engine can meet: hypothesis draws the input
and output widths (off every tile size), the int4 group size, the row count (one row, the tensor
cores' 2 to 16, the gemm's more), the path (chosen, or either one forced at any row count) and its
input slices, a bias, rows that start anywhere in a wider buffer, the dtype and the GPU whose tiles
the launcher picks. On inputs whose sums are exact (`exactly_summed`, `grid_inputs`) every kernel
must give the reference bit for bit, rounded once to the dtype. test_quant_kernels.py takes five
shapes by hand; this looks for the shape they miss."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("triton")

from test_kernel_properties import GPUS, launched_on  # noqa: E402
from test_quant_kernels import (  # noqa: E402
    DEVICE,
    DTYPES,
    KERNELS,
    as_fp64,
    exactly_summed,
    grid_inputs,
    to_device,
)

from minillm.kernels.quant_matmul import GEMV_MAX_ROWS  # noqa: E402


@st.composite
def layers(draw) -> dict:
    method = draw(st.sampled_from(["int8", "int4"]))
    group_size = draw(st.sampled_from([32, 64, 128, 256])) if method == "int4" else 0
    return dict(method=method, group_size=group_size,
                k=draw(st.integers(1, 768 // max(group_size, 32))) * max(group_size, 32),
                n=draw(st.integers(1, 300)))


# A GPU compiles each new shape: fewer examples there, in the GPU check's time.
@settings(max_examples=40 if DEVICE == "cpu" else 15, deadline=None, derandomize=True)
@given(layer=layers(), rows=st.sampled_from([1, 2, 3, GEMV_MAX_ROWS, GEMV_MAX_ROWS + 1, 70]),
       path=st.sampled_from(["auto", "gemv", "gemm"]), split_k=st.sampled_from([None, 1, 2, 5]),
       bias=st.booleans(), row_start=st.integers(0, 3), dtype=st.sampled_from(DTYPES),
       gpu=st.sampled_from(GPUS), seed=st.integers(0, 2 ** 16))
def test_any_layer_is_exact_on_every_path(layer, rows, path, split_k, bias, row_start, dtype, gpu, seed):
    method, k, n, group_size = layer["method"], layer["k"], layer["n"], layer["group_size"]
    kernel, reference = KERNELS[method]
    weight_args = to_device(exactly_summed(method, k, n, dtype, group_size, seed=seed))
    # Rows of a wider buffer, starting row_start elements in (the packed one-row step reads its inputs
    # in pairs, and must not where a row starts at an odd element).
    x = grid_inputs(rows, k + 3, dtype=dtype, seed=seed + 1).to(DEVICE)[:, row_start:row_start + k]
    b = grid_inputs(n, dtype=dtype, seed=seed + 2).to(DEVICE) if bias else None
    with launched_on(gpu):
        out = kernel(x, *weight_args, b, path=path, split_k=split_k)
    ref = reference(x.double(), *as_fp64(weight_args), None if b is None else b.double())
    assert out.dtype == dtype and out.shape == (rows, n)
    assert torch.equal(out, ref.to(dtype)), (out.double() - ref).abs().max().item()
