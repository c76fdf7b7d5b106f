"""INT8 weights: symmetric, one scale per output channel (row).

Row i is stored as round(w / s_i), clamped to [-127, 127], with s_i = max|w_i| / 127, so that the
largest weight of each row lands exactly on a level and zero stays exactly zero. -128 is left
unused, to keep the range symmetric.
"""

from __future__ import annotations

import torch


def quantize_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """weight [out, in] -> (qweight int8 [out, in], scales [out], in weight's dtype)."""
    w = weight.float()
    scales = w.abs().amax(dim=1).clamp(min=1e-8) / 127
    qweight = torch.round_(w / scales[:, None]).clamp_(-127, 127).to(torch.int8)  # one float temporary besides w
    return qweight, scales.to(weight.dtype)


def dequantize_int8(qweight: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    return qweight.to(scales.dtype) * scales[:, None]
