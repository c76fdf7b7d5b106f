"""RMSNorm: scale each vector to unit root-mean-square, then by a learned per-channel weight."""

from __future__ import annotations

import torch
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # The mean of squares is taken in float32 even for half-precision models: summing
        # thousands of squares in fp16 loses the small ones. The cast back happens before the
        # weight multiply, in the same order as the reference implementation, so bf16 matches it.
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)
