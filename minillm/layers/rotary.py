"""Rotary position embeddings (RoPE), with the `linear` and Llama 3 frequency scalings.

Each pair of channels (i, i + d/2) of a query or key is rotated by the angle
position * inv_freq[i]. The dot product of a rotated query and key then depends only on the
distance between their positions, which is how attention learns relative order.
"""

from __future__ import annotations

import math

import torch

from minillm.kernels.ops import KernelOps
from minillm.layers.custom_op import CustomOp


def rope_inv_freq(head_dim: int, theta: float, scaling: dict) -> torch.Tensor:
    # Built on the CPU explicitly: models are constructed under torch.device("meta").
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64, device="cpu").float() / head_dim
    inv_freq = 1.0 / (theta ** exponents)
    kind = scaling.get("rope_type", "default")
    if kind == "linear":
        return inv_freq / scaling["factor"]
    if kind == "llama3":
        return _llama3_scaling(inv_freq, scaling)
    return inv_freq


def _llama3_scaling(inv_freq: torch.Tensor, s: dict) -> torch.Tensor:
    """Llama 3.1: slow (long-wavelength) frequencies are divided by `factor`, fast ones are kept,
    and the band between is interpolated smoothly, so the model reaches longer contexts without
    disturbing what it learned about nearby tokens."""
    factor, low, high = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
    old_len = s["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    in_band = (wavelen >= old_len / high) & (wavelen <= old_len / low)
    return torch.where(in_band, blended, scaled)


def cos_sin_cache(inv_freq: torch.Tensor, max_positions: int, dtype: torch.dtype,
                  device: torch.device) -> torch.Tensor:
    """[max_positions, head_dim]: row p is cos(p * inv_freq) then sin(p * inv_freq), computed in fp32
    (as transformers computes them) and stored in the model's dtype."""
    positions = torch.arange(max_positions, dtype=torch.float32, device=device)
    freqs = positions[:, None] * inv_freq.to(device)[None, :]
    return torch.cat((freqs.cos(), freqs.sin()), dim=-1).to(dtype)


class RotaryEmbedding(CustomOp):
    """Rotates a layer's queries and keys by their positions. The cos/sin table covers every position
    the model can see and is built once, at the first forward pass (not once per step; never inside a
    captured CUDA graph, whose capture is preceded by a warm-up pass); every layer shares it."""

    def __init__(self, head_dim: int, theta: float, scaling: dict, max_positions: int,
                 ops: KernelOps | None = None) -> None:
        super().__init__(ops)
        self.inv_freq = rope_inv_freq(head_dim, theta, scaling)
        self.max_positions = max_positions
        self.cache: torch.Tensor | None = None

    def cos_sin_cache(self, like: torch.Tensor) -> torch.Tensor:
        if self.cache is None or self.cache.device != like.device or self.cache.dtype != like.dtype:
            self.cache = cos_sin_cache(self.inv_freq, self.max_positions, like.dtype, like.device)
        return self.cache

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """q [tokens, heads, head_dim], k [tokens, kv_heads, head_dim] at positions [tokens]."""
        return self.ops.rotary_embedding(positions, q, k, self.cos_sin_cache(q))
