"""Plain-PyTorch references for the decoder layer's elementwise ops: RMSNorm (alone, and after the
residual add), rotary embedding (alone, and with Qwen3's q/k norm and the KV store) and
SiLU-and-mul. Each is what a layer runs with the "torch" kernels, and the ground truth of a Triton
kernel with the same signature. The cast order follows transformers' Llama, so that bf16 outputs
match it bit for bit.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from minillm.kernels.attention_reference import store_kvcache_ref


def rms_norm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x [..., dim] scaled to unit root-mean-square, then by weight [dim]."""
    # The mean of squares is taken in float32 even for half-precision models: summing thousands of
    # squares in fp16 loses the small ones. The cast back happens before the weight multiply.
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


def fused_add_rms_norm_ref(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                           eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """In place, as vLLM's fused_add_rms_norm: residual <- x + residual (a sublayer's output joins the
    residual stream), x <- rms_norm(x + residual) (the next sublayer's input). Returns (x, residual).
    The sum is rounded to the model's dtype before the norm, as transformers'
    `hidden_states = residual + hidden_states` rounds it. A caller uses what is returned: another
    implementation may write new tensors instead."""
    residual.add_(x)
    x.copy_(rms_norm_ref(residual, weight, eps))
    return x, residual


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


def fused_rotary_store_kvcache_ref(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                                   cos_sin_cache: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                                   slot_mapping: torch.Tensor, *, q_norm_weight: torch.Tensor | None = None,
                                   k_norm_weight: torch.Tensor | None = None, eps: float = 0.0,
                                   k_scales: torch.Tensor | None = None,
                                   v_scales: torch.Tensor | None = None) -> torch.Tensor:
    """What a paged layer does between its qkv projection and attention: each head of q and k
    RMS-normalised if norm weights are given (Qwen3), q and k rotated, the rotated k and v stored in
    their slots (store_kvcache_ref: slot -1 skipped, an int8 pool quantized). Returns q rotated."""
    if q_norm_weight is not None:
        q, k = rms_norm_ref(q, q_norm_weight, eps), rms_norm_ref(k, k_norm_weight, eps)
    q, k = rotary_embedding_ref(positions, q, k, cos_sin_cache)
    store_kvcache_ref(k, v, k_cache, v_cache, slot_mapping, k_scales=k_scales, v_scales=v_scales)
    return q


def silu_and_mul_ref(x: torch.Tensor) -> torch.Tensor:
    """x [tokens, 2 * d], gate then up (the merged projection's output) -> silu(gate) * up [tokens, d]."""
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up
