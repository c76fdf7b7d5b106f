"""INT4 checkpoints in AutoAWQ's "GEMM" layout (`quant_method: awq`, `version: gemm`: most of the
AWQ models on the Hugging Face Hub), read into minillm's INT4 layout (int4.py).

AWQ chooses the levels (it scales the salient input channels up before rounding, and folds the
inverse into the layer before), but stores them as plain asymmetric round-to-nearest groups, the
same numbers minillm's INT4 reads, w = (q - zero) * scale with q and zero in [0, 15]. Only the
packing differs. Each quantized linear layer is stored transposed, inputs first:
- `qweight`, int32 [in, out // 8]: eight 4-bit levels of one input per word, for 8 consecutive
  outputs in the order 0, 2, 4, 6, 1, 3, 5, 7 (bits 4i..4i+3 hold output AWQ_ORDER[i]; the order
  suits the unpacking of AWQ's CUDA kernel);
- `qzeros`, int32 [in // group_size, out // 8], packed the same way;
- `scales` [in // group_size, out], fp16.

So reading one is a transpose and a repacking: the same weights, bit for bit. The other AWQ layouts
(GEMV, its "fast" variant, Marlin, ExLlama) and variants minillm's kernels do not take (other bit
widths, no zero point, group sizes other than 32, 64 and 128, layers left unquantized) are refused
by naming the field.
"""

from __future__ import annotations

import torch

from minillm.quant import INT4_GROUP_SIZES
from minillm.quant.int4 import pack_int4

QUANT_METHOD = "awq"
# AutoAWQ's "gemv", "gemv_fast" and "marlin" versions are layouts of their own on disk; transformers'
# "exllama" repacks a GEMM checkpoint's weights as the model loads, so one saved after that holds the
# repacked layout. All are refused.
GEMM_VERSION = "gemm"
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # the output each nibble of a packed word holds, low bits first


def read_awq_config(qc: dict, source: str) -> int:
    """The group size of an AWQ `quantization_config` that minillm can load as int4; a ValueError
    naming the field otherwise. Keys that only tune AutoAWQ's own kernels at run time (do_fuse,
    fuse_max_seq_len, backend) change nothing stored and are ignored."""
    # transformers' AwqConfig writes `bits`, AutoAWQ's quantize() takes `w_bit`: either name.
    unconverted = [name for name in qc.get("modules_to_not_convert") or [] if not name.endswith("lm_head")]
    checks = (("version", str(qc.get("version", GEMM_VERSION)).lower(), (GEMM_VERSION,), "version='gemm'"),
              ("bits", qc.get("bits", qc.get("w_bit")), (4,), "bits=4"),
              ("zero_point", qc.get("zero_point", True), (True,), "zero_point=true"),
              ("group_size", qc.get("group_size", qc.get("q_group_size")), INT4_GROUP_SIZES,
               f"group_size in {INT4_GROUP_SIZES}"),
              ("modules_to_not_convert", unconverted or None, (None,), "only the output head left unquantized"))
    for field, value, accepted, wanted in checks:
        if value not in accepted:
            raise ValueError(f"unsupported AWQ checkpoint in {source}: quantization_config {field}={value!r}; "
                             f"minillm loads AWQ's GEMM layout of 4-bit weights with zero points in groups of "
                             f"{', '.join(map(str, INT4_GROUP_SIZES))} ({wanted})")
    return qc.get("group_size", qc.get("q_group_size"))


def unpack_awq(packed: torch.Tensor) -> torch.Tensor:
    """int32 [rows, out // 8] packed in AWQ's order -> int32 [rows, out], each level in its output's column."""
    if packed.dtype != torch.int32 or packed.dim() != 2:
        raise ValueError(f"must be a 2-D int32 tensor of packed 4-bit values, got {packed.dtype} "
                         f"{tuple(packed.shape)}")
    # Shifts, not a byte view of the words, so that the result does not depend on the machine's byte order.
    nibbles = torch.stack([(packed >> (4 * i)) & 0xF for i in range(8)], dim=-1)
    levels = torch.empty_like(nibbles)
    levels[..., list(AWQ_ORDER)] = nibbles  # nibble i belongs to output AWQ_ORDER[i]
    return levels.flatten(1)


def awq_to_int4(qweight: torch.Tensor) -> torch.Tensor:
    """AWQ's qweight int32 [in, out // 8] -> minillm's packed uint8 [out, in // 2] (the same levels)."""
    return pack_int4(unpack_awq(qweight).T)


def awq_zeros(qzeros: torch.Tensor) -> torch.Tensor:
    """AWQ's qzeros int32 [in // group_size, out // 8] -> the zero points [out, in // group_size]."""
    return unpack_awq(qzeros).T
