"""Plain-PyTorch references for the decoder layer's elementwise ops: RMSNorm (alone, and after the
residual add), rotary embedding and SiLU-and-mul. Each is what a layer runs with the "torch" kernels,
and the ground truth of a Triton kernel with the same signature. The cast order follows
transformers' Llama, so that bf16 outputs match it bit for bit.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def rms_norm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x [..., dim] scaled to unit root-mean-square, then by weight [dim]."""
    # The mean of squares is taken in float32 even for half-precision models: summing thousands of
    # squares in fp16 loses the small ones. The cast back happens before the weight multiply.
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


def fused_add_rms_norm_ref(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                           eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(x + residual), x + residual): a sublayer's output joins the residual stream, and the
    next sublayer gets it normalised. The sum is rounded to the model's dtype before the norm, as
    transformers' `hidden_states = residual + hidden_states` rounds it."""
    total = x + residual
    return rms_norm_ref(total, weight, eps), total


def rotary_embedding_ref(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                         cos_sin_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """q [tokens, heads, head_dim] and k [tokens, kv_heads, head_dim] rotated by their positions'
    angles. cos_sin_cache [max_positions, head_dim]: row p holds cos then sin of p times each of the
    head_dim / 2 frequencies. Channel i pairs with channel i + head_dim / 2."""
    cos, sin = cos_sin_cache[positions].chunk(2, dim=-1)
    cos, sin = torch.cat((cos, cos), dim=-1), torch.cat((sin, sin), dim=-1)
    return _rotate(q, cos, sin), _rotate(k, cos, sin)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]


def silu_and_mul_ref(x: torch.Tensor) -> torch.Tensor:
    """x [tokens, 2 * d], gate then up (the merged projection's output) -> silu(gate) * up [tokens, d]."""
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up
