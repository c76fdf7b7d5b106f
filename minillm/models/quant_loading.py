"""What a quantized layer (layers/quant_linear.py) reads from each kind of checkpoint, and how each
tensor lands in its packed weights, scales and zero points:

- an unquantized checkpoint, loaded with quantization="int8" or "int4": `weight`, quantized the
  moment it arrives, one checkpoint matrix at a time. No layer ever holds its weights in the model's
  dtype, so peak memory while loading is the quantized model plus one matrix and its quantization's
  temporaries, not the unquantized model: an 8B model in bf16 (16 GB) loads into INT4 on a 16 GB GPU;
- minillm's own (models/quant_checkpoint.py): `qweight`, `scales`, `zeros`, copied;
- compressed-tensors' pack-quantized int4 (quant/compressed_tensors.py): `weight_packed` repacked,
  `weight_scale` with zero points of 8, `weight_shape` checked;
- AutoAWQ's GEMM layout (quant/awq.py): `qweight` and `qzeros` unpacked from AWQ's order and
  transposed, `scales` transposed.

Quantization works row by row and every quantized tensor has the output channels first, so each of
a merged layer's checkpoint matrices (q, k, v) is quantized on its own and goes into its own rows:
the same result as quantizing the merged weight.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from minillm.layers.linear import shard_range
from minillm.layers.quant_linear import QuantLinear
from minillm.quant.awq import QUANT_METHOD as AWQ
from minillm.quant.awq import awq_to_int4, awq_zeros
from minillm.quant.compressed_tensors import QUANT_METHOD as COMPRESSED_TENSORS
from minillm.quant.compressed_tensors import ZERO_POINT, unpack_int32_to_int4
from minillm.quant.int4 import quantize_int4
from minillm.quant.int8 import quantize_int8

Reader = Callable[[QuantLinear, torch.Tensor, int | None], None]
# Read when present, but not required: the shapes config.json already gives.
OPTIONAL_TENSORS = ("weight_shape",)


def quant_readers(layer: QuantLinear, quant_method: str | None) -> dict[str, Reader]:
    """The layer's tensors in a checkpoint written by quant_method (None: not quantized), each with its
    reader, called as reader(layer, tensor, shard_id)."""
    readers: dict[str, Reader]
    if quant_method is None:
        readers = {"weight": _quantize}
    elif quant_method == COMPRESSED_TENSORS:
        readers = {"weight_packed": _read_packed, "weight_scale": _read_scales, "weight_shape": _check_shape}
    elif quant_method == AWQ:
        readers = {"qweight": _read_awq_qweight, "qzeros": _read_awq_zeros, "scales": _read_awq_scales}
    else:
        names = ("qweight", "scales") + (("zeros",) if layer.zeros is not None else ())
        readers = {name: _copy_into(name) for name in names}
    if layer.bias is not None:
        readers["bias"] = _copy_into("bias")
    return readers


def _copy_into(buffer: str) -> Reader:
    return lambda layer, loaded, shard: layer.weight_loader(getattr(layer, buffer), loaded, shard)


def _shape(layer: QuantLinear, shard: int | None, columns: int) -> tuple[int, int]:
    """The shape of the checkpoint matrix `shard` of the layer, with `columns` columns."""
    if shard is None:
        return layer.out_features, columns
    start, end = shard_range(layer.output_sizes, shard)
    return end - start, columns


def _check(loaded: torch.Tensor, expected: tuple[int, int]) -> None:
    if tuple(loaded.shape) != expected:
        raise ValueError(f"has shape {tuple(loaded.shape)}, but config.json implies {expected}")


def _quantize(layer: QuantLinear, loaded: torch.Tensor, shard: int | None) -> None:
    _check(loaded, _shape(layer, shard, layer.in_features))
    # In the model's dtype and on its device first: the same numbers as quantizing the loaded model.
    weight = loaded.to(device=layer.qweight.device, dtype=layer.scales.dtype)
    if layer.method == "int8":
        quantized = dict(zip(("qweight", "scales"), quantize_int8(weight)))
    else:
        quantized = dict(zip(("qweight", "scales", "zeros"), quantize_int4(weight, layer.group_size)))
    for name, tensor in quantized.items():
        layer.weight_loader(getattr(layer, name), tensor, shard)


def _read_packed(layer: QuantLinear, loaded: torch.Tensor, shard: int | None) -> None:
    _check(loaded, _shape(layer, shard, layer.in_features // 8))
    layer.weight_loader(layer.qweight, unpack_int32_to_int4(loaded), shard)


def _read_scales(layer: QuantLinear, loaded: torch.Tensor, shard: int | None) -> None:
    layer.weight_loader(layer.scales, loaded, shard)
    layer.weight_loader(layer.zeros, torch.full(loaded.shape, ZERO_POINT, dtype=layer.zeros.dtype), shard)


def _check_shape(layer: QuantLinear, loaded: torch.Tensor, shard: int | None) -> None:
    expected = _shape(layer, shard, layer.in_features)
    if loaded.tolist() != list(expected):
        raise ValueError(f"says the weight is {loaded.tolist()}, but config.json implies {list(expected)}")


def _read_awq_qweight(layer: QuantLinear, loaded: torch.Tensor, shard: int | None) -> None:
    rows, columns = _shape(layer, shard, layer.in_features)
    _check(loaded, (columns, rows // 8))  # transposed: inputs first
    layer.weight_loader(layer.qweight, awq_to_int4(loaded), shard)


def _read_awq_zeros(layer: QuantLinear, loaded: torch.Tensor, shard: int | None) -> None:
    rows, groups = _shape(layer, shard, layer.in_features // layer.group_size)
    _check(loaded, (groups, rows // 8))
    layer.weight_loader(layer.zeros, awq_zeros(loaded), shard)


def _read_awq_scales(layer: QuantLinear, loaded: torch.Tensor, shard: int | None) -> None:
    rows, groups = _shape(layer, shard, layer.in_features // layer.group_size)
    _check(loaded, (groups, rows))
    layer.weight_loader(layer.scales, loaded.T, shard)
