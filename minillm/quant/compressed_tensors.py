"""INT4 checkpoints in the `compressed-tensors` "pack-quantized" format (what vLLM's llm-compressor
writes for W4A16), read into minillm's INT4 layout (int4.py).

That format stores each quantized linear layer as:
- `weight_packed`, int32 [out, in // 8]: eight 4-bit values per word, input 8k + i in bits 4i..4i+3,
  each value stored as q + 8 for a signed level q in [-8, 7];
- `weight_scale` [out, in // group_size], in the model's dtype;
- `weight_shape`, int64 [2]: the unpacked [out, in].
Symmetric schemes store no zero point: w = q * scale. minillm's INT4 reads w = (u - zero) * scale
with u in [0, 15], so the stored value q + 8 is u unchanged and every zero point is 8: the same
weights, bit for bit, repacked two per byte.

Only that variant maps onto minillm's layout; every other one (asymmetric zero points, 8 or 3 bits,
per-channel scales, GPTQ's group act-order with its `g_idx`, activation quantization, other formats)
is refused by name rather than misread.
"""

from __future__ import annotations

import torch

from minillm.quant import INT4_GROUP_SIZES
from minillm.quant.int4 import pack_int4

QUANT_METHOD = "compressed-tensors"
PACKED_FORMAT = "pack-quantized"
ZERO_POINT = 8  # the offset pack-quantized adds to each signed 4-bit level
# activation orders that only change how a tool chose the levels, not how they are stored
_LAYOUT_PRESERVING_ACTORDER = (None, False, "weight", "static")
_FLOAT_SCALE_DTYPES = (None, "torch.float16", "torch.bfloat16", "torch.float32")


def read_compressed_tensors_config(qc: dict, source: str) -> int:
    """The group size of a compressed-tensors `quantization_config` that minillm can load as int4;
    a ValueError naming the field otherwise."""

    def refuse(field: str, value, wanted: str) -> ValueError:
        return ValueError(f"unsupported compressed-tensors checkpoint in {source}: quantization_config {field}="
                          f"{value!r}; minillm loads only the {PACKED_FORMAT!r} format with symmetric int4 "
                          f"weights in groups of {', '.join(map(str, INT4_GROUP_SIZES))} ({wanted})")

    if qc.get("format") != PACKED_FORMAT:
        raise refuse("format", qc.get("format"), f"format={PACKED_FORMAT!r}")
    if qc.get("quantization_status", "compressed") != "compressed":
        raise refuse("quantization_status", qc["quantization_status"], "quantization_status='compressed'")
    for field in ("kv_cache_scheme", "sparsity_config", "transform_config"):
        if qc.get(field):
            raise refuse(field, qc[field], f"no {field}")
    ignored = [name for name in qc.get("ignore") or [] if not name.endswith("lm_head")]
    if ignored:  # every decoder projection is quantized, or none is
        raise refuse("ignore", ignored, "only the output head left unquantized")
    groups = qc.get("config_groups") or {}
    if len(groups) != 1:
        raise refuse("config_groups", sorted(groups), "one group for every linear layer")
    (name, group), = groups.items()
    prefix = f"config_groups.{name}"
    if group.get("format", PACKED_FORMAT) != PACKED_FORMAT:
        raise refuse(f"{prefix}.format", group["format"], f"format={PACKED_FORMAT!r}")
    if group.get("targets") != ["Linear"]:
        raise refuse(f"{prefix}.targets", group.get("targets"), "targets=['Linear']")
    for field in ("input_activations", "output_activations"):
        if group.get(field):
            raise refuse(f"{prefix}.{field}", group[field], "weight-only")
    weights = group.get("weights") or {}
    expected = {"type": "int", "num_bits": 4, "symmetric": True, "strategy": "group", "dynamic": False}
    for field, value in expected.items():
        if weights.get(field, value) != value:
            raise refuse(f"{prefix}.weights.{field}", weights[field], f"{field}={value!r}")
    checks = (("group_size", INT4_GROUP_SIZES, "a group size minillm's kernels take"),
              ("actorder", _LAYOUT_PRESERVING_ACTORDER, "no group act-order, whose g_idx reorders the groups"),
              ("scale_dtype", _FLOAT_SCALE_DTYPES, "scales in a float dtype"))
    for field, accepted, wanted in checks:
        if weights.get(field) not in accepted:
            raise refuse(f"{prefix}.weights.{field}", weights.get(field), wanted)
    return weights["group_size"]


def unpack_int32_to_int4(packed: torch.Tensor) -> torch.Tensor:
    """weight_packed int32 [out, in // 8] -> minillm's packed uint8 [out, in // 2] (the same levels)."""
    if packed.dtype != torch.int32 or packed.dim() != 2:
        raise ValueError(f"must be a 2-D int32 tensor of packed 4-bit values, got {packed.dtype} "
                         f"{tuple(packed.shape)}")
    # Shifts, not a byte view of the words, so that the result does not depend on the machine's byte order.
    levels = torch.stack([(packed >> (4 * i)) & 0xF for i in range(8)], dim=-1).flatten(1)
    return pack_int4(levels)
