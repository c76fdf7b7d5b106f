"""The two steps every quantized matmul kernel here repeats, as Triton device functions: load a tile
of stored weights as floats, and store finished rows (the int8 row scale and the bias applied)."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def load_weight_tile(w_ptr, scales_ptr, zeros_ptr, offs_n, mask_n, k0, K, stride_wn, stride_sn,
                 BLOCK_K: tl.constexpr, GROUP_SIZE: tl.constexpr, INT4: tl.constexpr):
    """Weights of output channels offs_n, inputs k0 .. k0 + BLOCK_K, as a [BLOCK_N, BLOCK_K] fp32
    tile. int8: the raw levels, whose row scale is applied to the finished sum instead (one multiply
    per output, not per weight). int4: dequantized; the tile lies in one group (BLOCK_K divides
    GROUP_SIZE), so a row's scale and zero point are one load per tile."""
    rows = offs_n.to(tl.int64)[:, None] * stride_wn
    if INT4:
        # Byte j holds input 2j (low nibble) and 2j + 1 (high nibble). Interleaving the two nibble
        # tiles restores input order, so x stays one contiguous load and each tile one tl.dot; the
        # alternative, splitting x into even and odd columns for two dots, would turn x's loads into
        # stride-2 gathers. tl.join places its new axis within a thread, so no data crosses threads.
        packed = tl.load(w_ptr + rows + k0 // 2 + tl.arange(0, BLOCK_K // 2)[None, :], mask=mask_n[:, None], other=0)
        q = tl.interleave(packed & 0xF, packed >> 4).to(tl.float32)
        group = k0 // GROUP_SIZE
        scale = tl.load(scales_ptr + offs_n * stride_sn + group, mask=mask_n, other=0.0).to(tl.float32)
        zero = tl.load(zeros_ptr + offs_n * stride_sn + group, mask=mask_n, other=0.0).to(tl.float32)
        w = (q - zero[:, None]) * scale[:, None]
    else:
        offs_k = k0 + tl.arange(0, BLOCK_K)
        w = tl.load(w_ptr + rows + offs_k[None, :], mask=mask_n[:, None] & (offs_k < K)[None, :],
                    other=0).to(tl.float32)
    return w


@triton.jit
def store_rows(acc, scales_ptr, bias_ptr, out_ptr, offs_m, offs_n, mask_m, mask_n, stride_om,
                INT4: tl.constexpr, HAS_BIAS: tl.constexpr):
    if not INT4:  # int8: the row's scale was left out of the sum (see _weight_tile)
        acc = acc * tl.load(scales_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)[None, :]
    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)[None, :]
    tl.store(out_ptr + offs_m.to(tl.int64)[:, None] * stride_om + offs_n[None, :],
             acc.to(out_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])
