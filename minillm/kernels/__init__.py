"""Triton kernels, each with a plain-PyTorch reference of the same signature in `reference.py`.

The kernel modules import triton, so they are imported only when the Triton backend is chosen. On a
CPU, set TRITON_INTERPRET=1 before the first import and the same kernels run in Triton's numpy
interpreter: slow, but exact enough to test against the references. `ops.py` picks one of the two
("torch" or "triton") and hands out its functions, for attention and the quantized matmuls alike.
"""

import os

import torch

# A multiply followed by an add compiles to one fused instruction only while Triton's fp fusion is
# on: its default through Triton 3.9, off from 3.10 unless this variable asks for it. The kernels'
# loops are written and counted (`sass.py`) with it on; without it the int4 one-row loop issues 11.2
# instructions a byte on sm_90 instead of 9.0. A value the user set is kept.
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")


def dot_precision(dtype: torch.dtype) -> str:
    """tl.dot's input_precision: fp32 inputs would otherwise be rounded to tf32 (a 10-bit mantissa)
    on the GPU's tensor cores, far off the fp32 reference."""
    return "ieee" if dtype == torch.float32 else "tf32"


def check_kv_layout(k_cache: torch.Tensor, v_cache: torch.Tensor, k_scales: torch.Tensor | None,
                    v_scales: torch.Tensor | None) -> None:
    """What the kernels assume of the pool: contiguous caches; for an int8 cache, both scale tensors,
    contiguous, fp32, shaped as the cache without head_dim (so a row's scale is at its offset / head_dim)."""
    assert k_cache.is_contiguous() and v_cache.is_contiguous()
    if k_scales is None and v_scales is None:
        return
    for cache, scales in ((k_cache, k_scales), (v_cache, v_scales)):
        assert cache.dtype == torch.int8 and scales is not None and scales.dtype == torch.float32
        assert scales.is_contiguous() and scales.shape == cache.shape[:-1]
