"""RMSNorm in one pass, and the residual add fused into it (references: `layer_reference.rms_norm_ref`
and `fused_add_rms_norm_ref`).

One program per row: the row is loaded once, its mean square taken in fp32, and the result written
once. The PyTorch reference is some eight kernels (cast, square, mean, add eps, rsqrt, multiply,
cast back, weight); with the residual add before it, nine reads and writes of the row become two
reads and two writes, in place (vLLM's fused_add_rms_norm): the residual stream's buffer takes the
sum and the sublayer's output buffer its normalised copy, so a step allocates nothing. The casts
happen where transformers' Llama makes them (the sum rounded to the model's dtype before it is
normalised, the weight applied after the cast back), so bf16 results equal the reference's bit
for bit.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def scale_rows(x, inv_rms, w):
    """weight * (x * inv_rms) in x's dtype, cast where the reference casts: normalised in fp32, rounded
    to the model's dtype, then weighted."""
    normed = (x.to(tl.float32) * inv_rms).to(x.dtype)
    return (w.to(tl.float32) * normed.to(tl.float32)).to(x.dtype)


@triton.jit
def _normalise(x, w_ptr, offs, mask, eps, dim):
    """x: one row in the model's dtype; returns weight * (x / rms(x)) in that dtype."""
    x32 = x.to(tl.float32)
    variance = tl.sum(x32 * x32, axis=0) / dim
    return scale_rows(x, tl.rsqrt(variance + eps), tl.load(w_ptr + offs, mask=mask, other=0.0))


@triton.jit
def _rms_norm_kernel(x_ptr, w_ptr, out_ptr, stride_x, dim, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < dim
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0)
    tl.store(out_ptr + row * dim + offs, _normalise(x, w_ptr, offs, mask, eps, dim), mask=mask)


@triton.jit
def _fused_add_rms_norm_kernel(x_ptr, residual_ptr, w_ptr, dim, eps, BLOCK: tl.constexpr):
    """In place: residual's row <- x + residual, x's row <- its normalised value. The whole row is
    loaded before either store, and no other program touches it."""
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < dim
    x = tl.load(x_ptr + row * dim + offs, mask=mask, other=0.0)
    r = tl.load(residual_ptr + row * dim + offs, mask=mask, other=0.0)
    total = (x.to(tl.float32) + r.to(tl.float32)).to(x.dtype)  # rounded as the reference's x + residual
    tl.store(residual_ptr + row * dim + offs, total, mask=mask)
    tl.store(x_ptr + row * dim + offs, _normalise(total, w_ptr, offs, mask, eps, dim), mask=mask)


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


def _rows_in_place(x: torch.Tensor, name: str) -> torch.Tensor:
    """x as a [rows, dim] view of its own memory: what an in-place kernel writes."""
    if not x.is_contiguous():
        raise ValueError(f"fused_add_rms_norm updates {name} in place: it must be contiguous, got strides "
                         f"{tuple(x.stride())} for shape {tuple(x.shape)}")
    return x.view(-1, x.shape[-1])


def fused_add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                       eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """In place, from one read of each input: residual <- x + residual (the residual stream's new
    value), x <- rms_norm(x + residual) (for the next sublayer). Returns (x, residual)."""
    if x.shape != residual.shape:
        raise ValueError(f"residual must have x's shape {tuple(x.shape)}, got {tuple(residual.shape)}")
    x2, r2 = _rows_in_place(x, "x"), _rows_in_place(residual, "residual")
    dim = x2.shape[1]
    block = triton.next_power_of_2(dim)
    _fused_add_rms_norm_kernel[(x2.shape[0],)](x2, r2, weight, dim, eps, BLOCK=block, num_warps=_warps(block))
    return x, residual
