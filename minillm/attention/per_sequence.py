"""Attention over one sequence, in plain PyTorch: what the contiguous and no-cache backends run, and
what the course's exercises are checked against. `attend` itself lives with the kernels' references
(minillm.kernels.attention_reference, a lower layer) and is re-exported here."""

from __future__ import annotations

import torch

from minillm.kernels.attention_reference import attend

__all__ = ["append_and_attend", "attend"]


def append_and_attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                      v_cache: torch.Tensor, start: int) -> torch.Tensor:
    """Write this step's k, v at positions start.. of one sequence's cache, then attend over
    everything cached so far. k_cache, v_cache: [capacity, kv_heads, head_dim]."""
    end = start + k.shape[0]
    k_cache[start:end] = k
    v_cache[start:end] = v
    return attend(q, k_cache[:end], v_cache[:end], q_start=start)
