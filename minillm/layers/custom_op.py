"""The seam between a layer and its kernel: vLLM's CustomOp idea, in one small class.

A layer with a kernel of its own (RMSNorm, rotary embedding, SiLU-and-mul, the quantized linears)
computes through `self.ops`, the engine's `KernelOps`: the PyTorch references or Triton's kernels,
chosen once per engine and shared by every layer of its model and by its attention backend. The
layer never asks which it has; swapping the kernels, or one op of one engine in an exercise, never
touches the model's code.
"""

from __future__ import annotations

from torch import nn

from minillm.kernels.ops import KernelOps, load_ops


class CustomOp(nn.Module):
    def __init__(self, ops: KernelOps | None = None) -> None:
        """ops: the engine's; without one (a layer built on its own), the PyTorch references."""
        super().__init__()
        self.ops = ops if ops is not None else load_ops("torch")

    @property
    def kernel(self) -> str:
        """"torch" or "triton": which kernels this layer runs."""
        return self.ops.kernel
