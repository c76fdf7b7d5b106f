"""RMSNorm: scale each vector to unit root-mean-square, then by a learned per-channel weight."""

from __future__ import annotations

import torch
from torch import nn

from minillm.kernels.ops import KernelOps
from minillm.layers.custom_op import CustomOp


class RMSNorm(CustomOp):
    def __init__(self, dim: int, eps: float, ops: KernelOps | None = None) -> None:
        super().__init__(ops)
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ops.rms_norm(x, self.weight, self.eps)
