"""RMSNorm: scale each vector to unit root-mean-square, then by a learned per-channel weight.

Given the residual stream too, it first adds the sublayer's output to it and returns both the
normalised sum and the sum (vLLM's fused_add_rms_norm): one kernel where there were two, and the
decoder layers pass the residual along instead of adding it themselves."""

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

    def forward(self, x: torch.Tensor,
                residual: torch.Tensor | None = None) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """x [..., dim] -> normalised x; with residual: (normalised x + residual, x + residual)."""
        if residual is None:
            return self.ops.rms_norm(x, self.weight, self.eps)
        return self.ops.fused_add_rms_norm(x, residual, self.weight, self.eps)
