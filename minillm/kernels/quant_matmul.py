"""Matmul with weight-only-quantized weights, in Triton: y = x @ dequant(W).T (+ bias), for the int8
and int4 layouts of `minillm.quant` (references: `minillm.quant.matmul_reference`).

Why dequantize inside the loop: at decode a linear layer does two flops per weight per row and reads
every weight once per step, so its time is the time it takes to read the weights. The reference
(dequantize the whole weight, then F.linear) reads the stored bytes, writes a full-precision copy
and reads that back: more traffic than an unquantized layer. Here each program loads tiles of the
stored bytes and unpacks and scales them in registers, just before they are multiplied, so a weight
costs what it is stored in: 1 byte (int8) or half a byte (int4) instead of 2 for fp16, plus the
scales and zero points. The bytes read per weight drop 2x / 4x, and with them the decode time, as
long as unpacking keeps up with the memory: a level becomes a number by one bitwise operation, and
the scale and zero point are applied once per group's sum rather than to every weight
(`quant_tiles.py`), the arithmetic fp16 only where that is exact.

Two paths, picked by the number of rows M (`pick_path`):
- gemv, for decode (M <= GEMV_MAX_ROWS): every weight byte read once for all the rows
  (`quant_gemv.py`);
- gemm, for prefill: the classic tiling over rows and output channels with tl.dot. It is
  compute-bound: the weight tiles are re-read once per block of rows, mostly from L2.
Tile shapes come from the GPU a launch is for (`targets.py`), so that each fits its shared memory.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from minillm.kernels import dot_precision
from minillm.kernels.quant_gemv import GEMV_MAX_ROWS, gemv
from minillm.kernels.quant_tiles import dot_level_offset, dot_tile, store_rows
from minillm.kernels.targets import GPUSpec, first_fitting, launch_target, shared_bytes_estimate

PATHS = ("auto", "gemv", "gemm")
INPUT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


@triton.jit
def _gemm_kernel(x_ptr, w_ptr, scales_ptr, zeros_ptr, bias_ptr, out_ptr, M, N, K,
                 stride_xm, stride_wn, stride_sn, stride_om,
                 INT4: tl.constexpr, GROUP_SIZE: tl.constexpr, HAS_BIAS: tl.constexpr, OFFSET: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PRECISION: tl.constexpr):
    # Row blocks vary fastest (program_id 0): the programs running at the same time share the same
    # few blocks of weights, which are then read from memory about once and from L2 after that.
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_m = offs_m < M
    mask_n = offs_n < N
    x_rows = x_ptr + offs_m.to(tl.int64)[:, None] * stride_xm
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_rows + offs_k[None, :], mask=mask_m[:, None] & (offs_k < K)[None, :], other=0.0)
        acc = dot_tile(acc, x, w_ptr, scales_ptr, zeros_ptr, offs_n, mask_n, k0, K, stride_wn, stride_sn,
                       BLOCK_K, GROUP_SIZE, INT4, OFFSET, PRECISION)
    store_rows(acc, scales_ptr, bias_ptr, out_ptr, offs_m, offs_n, mask_m, mask_n, stride_om, INT4, HAS_BIAS)


def gemm_tiles(target: GPUSpec | None, int4: bool, group_size: int, element_size: int) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_K, num_stages) of the gemm path on `target` (None: the interpreter),
    a tile lying in one int4 group. Tiles of 64 x 128 outputs keep the tensor cores busy on every
    GPU here but a T4 (below); the loads of x's tiles run ahead of the arithmetic by up to 3 tiles,
    each in shared memory, as many as fit beside the weight tile in a block's shared memory."""
    block_m, block_n = 64, 128
    block_k = min(64, group_size) if int4 else 64
    if target is None:
        return block_m, block_n, block_k, 1  # the interpreter does not pipeline
    if target.capability < 80:
        # On a T4 the compiler fits 64 x 128 x 64 tiles in 64 registers a thread and spills 4.2-4.5
        # KB (ptxas's report, `kernels/aot.py`); 64 x 64 x 32 tiles spill nothing.
        block_n, block_k = 64, 32
    stages = first_fitting(target, [3, 2, 1],
                           lambda s: shared_bytes_estimate(target, s * block_m + block_n, block_k, element_size))
    return block_m, block_n, block_k, stages


def pick_path(rows: int) -> str:
    """The path `path="auto"` takes for a batch of `rows` rows."""
    return "gemv" if rows <= GEMV_MAX_ROWS else "gemm"


def _check_common(x: torch.Tensor, weight: torch.Tensor, in_features: int, scales: torch.Tensor,
                  bias: torch.Tensor | None, path: str, split_k: int | None) -> None:
    if x.dtype not in INPUT_DTYPES:
        raise TypeError(f"x must be one of {INPUT_DTYPES}, got {x.dtype}")
    if x.dim() == 0 or x.shape[-1] != in_features:
        raise ValueError(f"x must end in the weight's {in_features} input features, got shape {tuple(x.shape)}")
    if scales.dtype != x.dtype:
        raise TypeError(f"scales must be in x's dtype {x.dtype} (the model dtype), got {scales.dtype}")
    out_features = weight.shape[0]
    if bias is not None and (bias.shape != (out_features,) or bias.dtype != x.dtype or bias.stride(0) != 1):
        raise ValueError(f"bias must be a contiguous [{out_features}] in {x.dtype}, got {tuple(bias.shape)} in "
                         f"{bias.dtype} with stride {bias.stride()}")
    tensors = [x, weight, scales] + ([] if bias is None else [bias])
    if len({t.device for t in tensors}) > 1:
        raise ValueError(f"all inputs must be on one device, got {[str(t.device) for t in tensors]}")
    if path not in PATHS:
        raise ValueError(f"path must be one of {PATHS}, got {path!r}")
    if split_k is not None and split_k < 1:
        raise ValueError(f"split_k must be at least 1, got {split_k}")


def int8_matmul(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None = None,
                *, path: str = "auto", split_k: int | None = None) -> torch.Tensor:
    """x [..., in] @ (qweight * scales[:, None]).T + bias -> [..., out] in x's dtype.

    qweight: int8 [out, in], contiguous; scales: [out] in x's dtype. path: "gemv" or "gemm" forces a
    path ("auto": `pick_path`); split_k forces the gemv path's number of input slices."""
    if qweight.dtype != torch.int8 or qweight.dim() != 2 or not qweight.is_contiguous():
        raise ValueError(f"qweight must be a contiguous int8 [out, in] tensor, got {qweight.dtype} "
                         f"{tuple(qweight.shape)}{'' if qweight.is_contiguous() else ' (not contiguous)'}")
    out_features, in_features = qweight.shape
    _check_common(x, qweight, in_features, scales, bias, path, split_k)
    if scales.shape != (out_features,) or not scales.is_contiguous():
        raise ValueError(f"int8 scales must be one per output row, [{out_features}] contiguous, "
                         f"got {tuple(scales.shape)}")
    return _quant_matmul(x, qweight, scales, None, bias, in_features, 0, path, split_k)


def int4_matmul(x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, group_size: int,
                bias: torch.Tensor | None = None, *, path: str = "auto", split_k: int | None = None) -> torch.Tensor:
    """x [..., in] @ dequantize_int4(packed, scales, zeros, group_size).T + bias -> [..., out] in x's dtype.

    packed: uint8 [out, in // 2], contiguous, input 2j in the low nibble of byte j and 2j + 1 in the
    high one; scales, zeros: [out, in // group_size] in x's dtype, the zero points integers from 0 to
    15 (as every format the engine loads stores them: one row of 16-bit inputs folds each into a
    constant of the inputs' precision, `quant_half2.py`); group_size: a power of two >= 32
    (a weight tile lies in one group; tl.dot needs 16 inputs, but 16-input tiles of nibbles
    gave wrong sums on an H100 (the GPU check of 2026-11-27), where 32 and more were exact). path,
    split_k: as int8_matmul."""
    if packed.dtype != torch.uint8 or packed.dim() != 2 or not packed.is_contiguous():
        raise ValueError(f"packed must be a contiguous uint8 [out, in // 2] tensor (two int4 per byte), got "
                         f"{packed.dtype} {tuple(packed.shape)}{'' if packed.is_contiguous() else ' (not contiguous)'}")
    out_features, in_features = packed.shape[0], 2 * packed.shape[1]
    _check_common(x, packed, in_features, scales, bias, path, split_k)
    if group_size < 32 or group_size & (group_size - 1):
        raise ValueError(f"group_size must be a power of two of at least 32, got {group_size}")
    if in_features % group_size:
        raise ValueError(f"in_features {in_features} is not a multiple of group_size {group_size}")
    groups = (out_features, in_features // group_size)
    for name, t in (("scales", scales), ("zeros", zeros)):
        if t.shape != groups or t.dtype != x.dtype or not t.is_contiguous() or t.device != x.device:
            raise ValueError(f"int4 {name} must be [out, in // group_size] = {list(groups)}, contiguous, in "
                             f"{x.dtype} on {x.device}; got {tuple(t.shape)} in {t.dtype} on {t.device}")
    return _quant_matmul(x, packed, scales, zeros, bias, in_features, group_size, path, split_k)


def _quant_matmul(x: torch.Tensor, weight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor | None,
                  bias: torch.Tensor | None, in_features: int, group_size: int, path: str,
                  split_k: int | None) -> torch.Tensor:
    lead = x.shape[:-1]
    x = x.reshape(-1, in_features)
    if x.stride(1) != 1:
        x = x.contiguous()
    rows, out_features = x.shape[0], weight.shape[0]
    out = torch.empty((rows, out_features), dtype=x.dtype, device=x.device)
    if rows == 0:
        return out.view(*lead, out_features)
    int4 = zeros is not None
    # Unused pointers (zeros for int8, a missing bias) are never read: any tensor will do.
    zeros_arg = zeros if int4 else scales
    bias_arg = bias if bias is not None else scales
    stride_sn = scales.stride(0) if int4 else 0
    precision = dot_precision(x.dtype)
    if path == "auto":
        path = pick_path(rows)

    if path == "gemm":
        block_m, block_n, block_k, stages = gemm_tiles(launch_target(x.device), int4, group_size, x.element_size())
        grid = (triton.cdiv(rows, block_m), triton.cdiv(out_features, block_n))
        _gemm_kernel[grid](
            x, weight, scales, zeros_arg, bias_arg, out, rows, out_features, in_features,
            x.stride(0), weight.stride(0), stride_sn, out.stride(0),
            INT4=int4, GROUP_SIZE=group_size, HAS_BIAS=bias is not None, OFFSET=dot_level_offset(int4, x.dtype),
            BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, PRECISION=precision, num_warps=8, num_stages=stages)
        return out.view(*lead, out_features)

    gemv(x, weight, scales, zeros_arg, bias, bias_arg, out, int4, group_size, stride_sn, precision, split_k)
    return out.view(*lead, out_features)
