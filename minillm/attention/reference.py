"""Attention for one sequence, in plain PyTorch: the reference every backend and kernel is checked
against."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_start: int,
           scale: float | None = None) -> torch.Tensor:
    """Causal attention of n queries at positions q_start .. q_start+n-1 over keys 0 .. L-1.

    q: [n, heads, head_dim]; k, v: [L, kv_heads, head_dim] -> [n, heads, head_dim].
    With grouped-query attention several query heads share one KV head. Rather than copying K and
    V once per query head, the queries of a group are stacked into one longer batch of rows, so
    each KV head is read once: [n, kv_heads, group, d] -> [kv_heads, group * n, d].
    scale defaults to 1/sqrt(head_dim).
    """
    n, num_heads, head_dim = q.shape
    length, num_kv_heads, _ = k.shape
    group = num_heads // num_kv_heads
    qg = q.view(n, num_kv_heads, group, head_dim).permute(1, 2, 0, 3).reshape(num_kv_heads, group * n, head_dim)
    mask = None
    if n > 1 or q_start + n != length:
        q_pos = q_start + torch.arange(n, device=q.device)
        mask = (torch.arange(length, device=q.device)[None, :] <= q_pos[:, None]).repeat(group, 1)
    out = F.scaled_dot_product_attention(qg, k.transpose(0, 1), v.transpose(0, 1), attn_mask=mask, scale=scale)
    return out.view(num_kv_heads, group, n, head_dim).permute(2, 0, 1, 3).reshape(n, num_heads, head_dim)


def append_and_attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                      v_cache: torch.Tensor, start: int) -> torch.Tensor:
    """Write this step's k, v at positions start.. of one sequence's cache, then attend over
    everything cached so far. k_cache, v_cache: [capacity, kv_heads, head_dim]."""
    end = start + k.shape[0]
    k_cache[start:end] = k
    v_cache[start:end] = v
    return attend(q, k_cache[:end], v_cache[:end], q_start=start)
