"""A linear layer whose weight is stored quantized, and the swap that quantizes a model's decoder.

The layer's matmul is its ops' (`kernel` says which): "torch", the reference
(`minillm.quant.matmul_reference`: dequantize the whole weight, then matmul; exact, but it reads and writes
a full-precision copy of the weight every call), or "triton" (`minillm.kernels.quant_matmul`), which
dequantizes tiles in registers inside the matmul instead.
"""

from __future__ import annotations

import torch
from torch import nn

from minillm.kernels.ops import KernelOps
from minillm.layers.custom_op import CustomOp
from minillm.layers.linear import default_weight_loader, load_output_shard
from minillm.quant import INT4_GROUP_SIZES, QUANTIZATION_METHODS
from minillm.quant.int4 import quantize_int4
from minillm.quant.int8 import quantize_int8


class QuantLinear(CustomOp):
    def __init__(self, linear: nn.Linear, method: str, group_size: int, ops: KernelOps | None = None) -> None:
        super().__init__(ops)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.method, self.group_size = method, group_size
        if hasattr(linear, "output_sizes"):
            self.output_sizes = linear.output_sizes  # the attention and MLP split the output by it
        weight = linear.weight.detach()
        if method == "int8":
            qweight, scales = quantize_int8(weight)
            self.register_buffer("zeros", None)
        else:
            qweight, scales, zeros = quantize_int4(weight, group_size)
            self.register_buffer("zeros", zeros)
        self.register_buffer("qweight", qweight)
        self.register_buffer("scales", scales)
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach().clone())

    def weight_loader(self, param: torch.Tensor, loaded: torch.Tensor, shard_id: int | None) -> None:
        """A quantized checkpoint's packed weights, scales and zero points, into their rows."""
        if hasattr(self, "output_sizes"):
            load_output_shard(self.output_sizes, param, loaded, shard_id)
        else:
            default_weight_loader(param, loaded)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.method == "int8":
            return self.ops.int8_matmul(x, self.qweight, self.scales, self.bias)
        return self.ops.int4_matmul(x, self.qweight, self.scales, self.zeros, self.group_size, self.bias)

    def extra_repr(self) -> str:
        group = f", group_size={self.group_size}" if self.method == "int4" else ""
        return f"in_features={self.in_features}, out_features={self.out_features}, {self.method}{group}"


def decoder_linears(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The attention and MLP projections of the decoder layers, quantized or not (not embeddings
    and the output head)."""
    return [(name, module) for name, module in model.named_modules()
            if isinstance(module, (nn.Linear, QuantLinear)) and ".layers." in f".{name}"]


def quantize_model(model: nn.Module, method: str, group_size: int = 128, ops: KernelOps | None = None) -> nn.Module:
    """Replace every linear layer of the decoder layers by a QuantLinear whose matmul is ops' (the
    model's own where it has them, else the references); embeddings and the output head keep the
    model dtype."""
    if method not in QUANTIZATION_METHODS:
        raise ValueError(f"quantization must be one of {QUANTIZATION_METHODS} or None, got {method!r}")
    if method == "int4" and group_size not in INT4_GROUP_SIZES:
        raise ValueError(f"quant_group_size must be one of {INT4_GROUP_SIZES} for int4, got {group_size!r}")
    ops = ops or getattr(model, "ops", None)
    targets = [(name, module) for name, module in decoder_linears(model) if isinstance(module, nn.Linear)]
    if method == "int4":
        for name, module in targets:
            if module.in_features % group_size:
                raise ValueError(f"int4 with group_size={group_size} cannot quantize {name}: its input "
                                 f"dimension {module.in_features} is not a multiple of {group_size}")
    for name, module in targets:
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name), child, QuantLinear(module, method, group_size, ops))
    return model


def linear_weight_bytes(model: nn.Module) -> tuple[int, int]:
    """Bytes held by the decoder's linear layers (weights, plus scales and zero points if quantized),
    and what the same weights take in fp16."""
    held = fp16 = 0
    for _, module in decoder_linears(model):
        fp16 += 2 * module.in_features * module.out_features
        tensors = (module.qweight, module.scales, module.zeros) if isinstance(module, QuantLinear) else (
            module.weight,)
        held += sum(t.numel() * t.element_size() for t in tensors if t is not None)
    return held, fp16
