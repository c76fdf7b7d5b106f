"""Rotary position embeddings (RoPE), with the `linear` and Llama 3 frequency scalings.

Each pair of channels (i, i + d/2) of a query or key is rotated by the angle
position * inv_freq[i]. The dot product of a rotated query and key then depends only on the
distance between their positions, which is how attention learns relative order.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from minillm.kernels.ops import KernelOps
from minillm.layers.custom_op import CustomOp
from minillm.layers.norm import RMSNorm


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


@dataclass(frozen=True)
class QKRotation:
    """One layer's rotation of one step's queries and keys, handed to the attention backend with q and
    k still unrotated: a backend that stores K/V in a paged pool rotates them as it stores them, in
    one launch (`KernelOps.fused_rotary_store_kvcache`); any other backend calls it first. Qwen3's
    per-head q and k norm, which comes before the rotation, comes with it."""

    ops: KernelOps
    positions: torch.Tensor  # [tokens]
    cos_sin_cache: torch.Tensor  # [max_positions, head_dim]: the model's table
    q_norm_weight: torch.Tensor | None = None  # [head_dim] each, or None: no q/k norm
    k_norm_weight: torch.Tensor | None = None
    eps: float = 0.0

    def __call__(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """q [tokens, heads, head_dim], k [tokens, kv_heads, head_dim] -> both rotated (normalised first
        where the model has q/k norm): the op that rotates, apart from any store."""
        if self.q_norm_weight is not None:
            q = self.ops.rms_norm(q, self.q_norm_weight, self.eps)
            k = self.ops.rms_norm(k, self.k_norm_weight, self.eps)
        return self.ops.rotary_embedding(self.positions, q, k, self.cos_sin_cache)


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

    def rotation(self, positions: torch.Tensor, like: torch.Tensor, q_norm: RMSNorm | None = None,
                 k_norm: RMSNorm | None = None) -> QKRotation:
        """The rotation of tokens at positions [tokens], in like's dtype and device, after q_norm and
        k_norm (Qwen3's per-head norms; both or neither)."""
        if (q_norm is None) != (k_norm is None):
            raise ValueError("q_norm and k_norm come together (Qwen3 normalises both)")
        norms = {} if q_norm is None else dict(q_norm_weight=q_norm.weight, k_norm_weight=k_norm.weight,
                                                eps=q_norm.eps)
        return QKRotation(self.ops, positions, self.cos_sin_cache(like), **norms)

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """q [tokens, heads, head_dim], k [tokens, kv_heads, head_dim] at positions [tokens]."""
        return self.rotation(positions, q)(q, k)
