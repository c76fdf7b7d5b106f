"""RMSNorm in one pass, and the residual add fused into it (references: `layer_reference.rms_norm_ref`
and `fused_add_rms_norm_ref`).

One program per row: the row is loaded once, its mean square taken in fp32, and the result written
once. The PyTorch reference is some eight kernels (cast, square, mean, add eps, rsqrt, multiply,
cast back, weight); with the residual add before it, nine reads and writes of the row become two
reads and two writes. The casts happen where transformers' Llama makes them (the sum rounded to the
model's dtype before it is normalised, the weight applied after the cast back), so bf16 results
equal the reference's bit for bit.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _normalise(x, w_ptr, offs, mask, eps, dim):
    """x: one row in the model's dtype; returns weight * (x / rms(x)) in that dtype."""
    x32 = x.to(tl.float32)
    variance = tl.sum(x32 * x32, axis=0) / dim
    normed = (x32 * tl.rsqrt(variance + eps)).to(x.dtype)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0)
    return (w.to(tl.float32) * normed.to(tl.float32)).to(x.dtype)


@triton.jit
def _rms_norm_kernel(x_ptr, w_ptr, out_ptr, stride_x, dim, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < dim
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0)
    tl.store(out_ptr + row * dim + offs, _normalise(x, w_ptr, offs, mask, eps, dim), mask=mask)


@triton.jit
def _fused_add_rms_norm_kernel(x_ptr, residual_ptr, w_ptr, out_ptr, residual_out_ptr, stride_x, stride_r, dim,
                               eps, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < dim
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0)
    r = tl.load(residual_ptr + row * stride_r + offs, mask=mask, other=0.0)
    total = (x.to(tl.float32) + r.to(tl.float32)).to(x.dtype)  # rounded as the reference's x + residual
    tl.store(residual_out_ptr + row * dim + offs, total, mask=mask)
    tl.store(out_ptr + row * dim + offs, _normalise(total, w_ptr, offs, mask, eps, dim), mask=mask)


def _rows(x: torch.Tensor) -> torch.Tensor:
    """x as [rows, dim] whose rows are each contiguous (a view when it can be)."""
    x2 = x.reshape(-1, x.shape[-1])
    return x2 if x2.stride(-1) == 1 else x2.contiguous()


def _warps(block: int) -> int:
    return min(max(block // 256, 1), 16)  # about 8 values per thread whatever the width


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x [..., dim] scaled to unit root-mean-square, then by weight [dim]."""
    x2 = _rows(x)
    out = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
    dim = x2.shape[1]
    block = triton.next_power_of_2(dim)
    _rms_norm_kernel[(x2.shape[0],)](x2, weight, out, x2.stride(0), dim, eps, BLOCK=block, num_warps=_warps(block))
    return out.view(x.shape)


def fused_add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                       eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(x + residual), x + residual): the residual stream's new value and its normalised
    copy, for the next sublayer, from one read of each input."""
    x2, r2 = _rows(x), _rows(residual)
    out = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
    residual_out = torch.empty_like(out)
    dim = x2.shape[1]
    block = triton.next_power_of_2(dim)
    _fused_add_rms_norm_kernel[(x2.shape[0],)](x2, r2, weight, out, residual_out, x2.stride(0), r2.stride(0), dim,
                                               eps, BLOCK=block, num_warps=_warps(block))
    return out.view(x.shape), residual_out.view(x.shape)
