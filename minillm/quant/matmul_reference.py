"""The quantized matmuls in plain PyTorch: dequantize the whole weight, then F.linear. The ground
truth of the Triton kernels in `minillm.kernels.quant_matmul` (same arguments) and the `torch`
kernel of QuantLinear. Exact, but it writes and reads back a full-precision copy of the weight on
every call, which is what the kernels avoid."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from minillm.quant.int4 import dequantize_int4
from minillm.quant.int8 import dequantize_int8


def int8_matmul_ref(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
                    bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., in] @ (qweight * scales[:, None]).T + bias; qweight int8 [out, in], scales [out]."""
    return F.linear(x, dequantize_int8(qweight, scales), bias)


def int4_matmul_ref(x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor,
                    group_size: int, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., in] @ dequantize_int4(...).T + bias; packed uint8 [out, in // 2], scales and zeros
    [out, in // group_size]."""
    return F.linear(x, dequantize_int4(packed, scales, zeros, group_size), bias)
