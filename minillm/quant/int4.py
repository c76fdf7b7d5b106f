"""INT4 weights: asymmetric round-to-nearest, one scale and zero point per group of `group_size`
consecutive inputs of a row, two 4-bit values per byte.

A group's weights span [lo, hi]; 16 levels cover it: scale = (hi - lo) / 15, zero = round(-lo /
scale), q = clamp(round(w / scale) + zero, 0, 15), and w is read back as (q - zero) * scale.
Asymmetric, because a group's weights are rarely centred on zero; group-wise, because one outlier
then only coarsens its own group's levels, not its whole row's.

Packing: byte j of a row holds input 2j in its low nibble and input 2j + 1 in its high nibble.
"""

from __future__ import annotations

import torch


def pack_int4(q: torch.Tensor) -> torch.Tensor:
    """[out, in] values in [0, 15] (in even) -> uint8 [out, in // 2]."""
    q = q.to(torch.uint8)
    return q[:, 0::2] | (q[:, 1::2] << 4)


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """uint8 [out, in // 2] -> uint8 [out, in], the inverse of pack_int4."""
    return torch.stack((packed & 0xF, packed >> 4), dim=-1).flatten(1)


def quantize_int4(weight: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """weight [out, in] (in divisible by group_size) -> (packed uint8 [out, in // 2],
    scales [out, in // group_size], zeros [out, in // group_size]; both in weight's dtype)."""
    out_features, in_features = weight.shape
    w = weight.float().view(out_features, in_features // group_size, group_size)
    lo = w.amin(dim=2).clamp(max=0)  # the range always includes 0, so that 0 is exactly a level
    hi = w.amax(dim=2).clamp(min=0)
    scales = ((hi - lo) / 15).clamp(min=1e-8)
    zeros = torch.round(-lo / scales).clamp(0, 15)
    # In place after the division: one full-size float temporary besides w (loading quantizes one
    # matrix at a time, and these temporaries are its peak memory above the quantized model).
    q = torch.round_(w / scales[..., None]).add_(zeros[..., None]).clamp_(0, 15)
    return pack_int4(q.view(out_features, in_features)), scales.to(weight.dtype), zeros.to(weight.dtype)


def dequantize_int4(packed: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, group_size: int) -> torch.Tensor:
    q = unpack_int4(packed).to(scales.dtype).view(packed.shape[0], -1, group_size)
    return ((q - zeros[..., None]) * scales[..., None]).flatten(1)
