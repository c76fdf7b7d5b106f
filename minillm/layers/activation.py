"""SwiGLU's activation: silu(gate) * up, on the merged gate/up projection's output."""

from __future__ import annotations

import torch

from minillm.layers.custom_op import CustomOp


class SiluAndMul(CustomOp):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [tokens, 2 * d], gate then up -> [tokens, d]."""
        return self.ops.silu_and_mul(x)
