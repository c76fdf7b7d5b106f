"""SiLU-and-mul in one pass (reference: `layer_reference.silu_and_mul_ref`): silu(gate) * up from the
merged gate/up projection's output, read once, written once. The reference is three kernels
(slicing is free; silu, multiply) and writes silu(gate) to memory in between. The product is rounded
as the reference rounds it: silu in fp32, rounded to the model's dtype, then the multiply."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _silu_and_mul_kernel(x_ptr, out_ptr, stride_x, d, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < d
    gate = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0)
    up = tl.load(x_ptr + row * stride_x + d + offs, mask=mask, other=0.0)
    g = gate.to(tl.float32)
    silu = (g / (1.0 + tl.exp(-g))).to(gate.dtype)
    tl.store(out_ptr + row * d + offs, (silu.to(tl.float32) * up.to(tl.float32)).to(gate.dtype), mask=mask)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """x [tokens, 2 * d], gate then up -> silu(gate) * up [tokens, d]."""
    assert x.stride(-1) == 1, "each row's gate and up must be contiguous"
    tokens, d = x.shape[0], x.shape[1] // 2
    out = torch.empty(tokens, d, dtype=x.dtype, device=x.device)
    block = min(triton.next_power_of_2(d), 1024)
    _silu_and_mul_kernel[(tokens, triton.cdiv(d, block))](x, out, x.stride(0), d, BLOCK=block, num_warps=4)
    return out
