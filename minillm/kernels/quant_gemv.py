"""The decode path of the quantized matmuls (`quant_matmul.py`): a few rows of x against the
whole weight, each weight byte read once for all the rows.

One program per block of output channels and per slice of the inputs (split-K), holding every row.
2 to 16 rows take one tl.dot per tile. A single row has its own kernel (`_gemv_row_kernel`):
products are summed elementwise in a tile-shaped accumulator and reduced across threads once, at
the end, and levels become floats by bit tricks rather than int-to-float conversions, which run at
a quarter of the rate of other arithmetic and would otherwise bound the kernel. The slices' partial
sums are added by a second small kernel, in a fixed order, so results do not vary from run to run.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from minillm.kernels.quant_tiles import load_weight_tile, store_rows
from minillm.kernels.targets import launch_target

# tl.dot's smallest row tile on the GPU is 16, so up to 16 rows cost one pass over the weights, the
# same as one row. And at 16 rows a weight still does little arithmetic per byte read (2 * 16 flops
# per int8 byte, 64 per int4 byte) against the 200-300 flops per byte at which an H100/H200's tensor
# cores, not its memory, become the limit: reading the weights once is still all that matters. Past
# that, more rows are better spread over more programs, which is what the gemm grid does.
GEMV_MAX_ROWS = 16


@triton.jit
def _gemv_kernel(x_ptr, w_ptr, scales_ptr, zeros_ptr, bias_ptr, out_ptr, M, N, K, tiles_per_split,
                 stride_xm, stride_wn, stride_sn, stride_om, stride_out_split,
                 INT4: tl.constexpr, GROUP_SIZE: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PRECISION: tl.constexpr):
    """Program (n, s, m): output channels of block n, input slice s, rows of block m (a single
    block up to GEMV_MAX_ROWS rows). With several slices, out_ptr is an fp32 buffer of partial sums,
    one [M, N] plane per slice, and bias comes with the reduction."""
    pid_n = tl.program_id(0)
    split = tl.program_id(1)
    offs_m = tl.program_id(2) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_m = offs_m < M
    mask_n = offs_n < N
    x_rows = x_ptr + offs_m.to(tl.int64)[:, None] * stride_xm
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    start = split * tiles_per_split * BLOCK_K
    for k0 in range(start, tl.minimum(K, start + tiles_per_split * BLOCK_K), BLOCK_K):
        w = load_weight_tile(w_ptr, scales_ptr, zeros_ptr, offs_n, mask_n, k0, K, stride_wn, stride_sn,
                         BLOCK_K, GROUP_SIZE, INT4)
        offs_k = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_rows + offs_k[None, :], mask=mask_m[:, None] & (offs_k < K)[None, :], other=0.0)
        acc = tl.dot(x, tl.trans(w.to(x.dtype)), acc, input_precision=PRECISION)
    store_rows(acc, scales_ptr, bias_ptr, out_ptr + split.to(tl.int64) * stride_out_split, offs_m, offs_n, mask_m,
                mask_n, stride_om, INT4, HAS_BIAS)


# 2**23 as a float's bit pattern: OR-ing an integer n < 2**23 into its mantissa gives the float
# 2**23 + n exactly, so subtracting 2**23 recovers n without an int-to-float conversion.
_MAGIC_BITS = tl.constexpr(0x4B000000)
_MAGIC = tl.constexpr(8388608.0)


@triton.jit
def _gemv_row_kernel(x_ptr, w_ptr, scales_ptr, zeros_ptr, bias_ptr, out_ptr, N, K, tiles_per_split, stride_wn,
                     stride_sn, stride_out_split, INT4: tl.constexpr, GROUP_SIZE: tl.constexpr,
                     HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """One row of x: program (n, s) sums output channels of block n over input slice s."""
    pid_n = tl.program_id(0)
    split = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < N
    rows = offs_n.to(tl.int64)[:, None] * stride_wn
    start = split * tiles_per_split * BLOCK_K
    # int4: a byte holds inputs 2j and 2j + 1, so a tile of BLOCK_K inputs is BLOCK_K // 2 bytes,
    # each multiplied by an even and an odd input.
    acc = tl.zeros([BLOCK_N, BLOCK_K // 2 if INT4 else BLOCK_K], tl.float32)
    for k0 in range(start, tl.minimum(K, start + tiles_per_split * BLOCK_K), BLOCK_K):
        if INT4:  # the tile lies in one group (BLOCK_K divides GROUP_SIZE), and K is a multiple of it
            packed = tl.load(w_ptr + rows + k0 // 2 + tl.arange(0, BLOCK_K // 2)[None, :], mask=mask_n[:, None],
                             other=0).to(tl.int32)
            group = k0 // GROUP_SIZE
            scale = tl.load(scales_ptr + offs_n * stride_sn + group, mask=mask_n, other=0.0).to(tl.float32)
            zero = tl.load(zeros_ptr + offs_n * stride_sn + group, mask=mask_n, other=0.0).to(tl.float32)
            low = ((packed & 0xF) | _MAGIC_BITS).to(tl.float32, bitcast=True) - (zero + _MAGIC)[:, None]
            high = ((packed >> 4) | _MAGIC_BITS).to(tl.float32, bitcast=True) - (zero + _MAGIC)[:, None]
            x_even = tl.load(x_ptr + k0 + 2 * tl.arange(0, BLOCK_K // 2)).to(tl.float32)
            x_odd = tl.load(x_ptr + k0 + 1 + 2 * tl.arange(0, BLOCK_K // 2)).to(tl.float32)
            acc += (low * x_even[None, :] + high * x_odd[None, :]) * scale[:, None]
        else:  # int8 levels are shifted by 128 to be non-negative for the trick; the row scale comes last
            offs_k = k0 + tl.arange(0, BLOCK_K)
            mask_k = offs_k < K
            q = tl.load(w_ptr + rows + offs_k[None, :], mask=mask_n[:, None] & mask_k[None, :], other=0).to(tl.int32)
            w = ((q + 128) | _MAGIC_BITS).to(tl.float32, bitcast=True) - (_MAGIC + 128)
            acc += w * tl.load(x_ptr + offs_k, mask=mask_k, other=0.0).to(tl.float32)[None, :]
    store_rows(tl.sum(acc, 1)[None, :], scales_ptr, bias_ptr, out_ptr + split.to(tl.int64) * stride_out_split,
                tl.zeros([1], tl.int32), offs_n, tl.full([1], 1, tl.int1), mask_n, 0, INT4, HAS_BIAS)


@triton.jit
def _split_k_reduce_kernel(partial_ptr, bias_ptr, out_ptr, N, num_splits, stride_split, stride_pm, stride_om,
                           HAS_BIAS: tl.constexpr, SPLITS_PAD: tl.constexpr, BLOCK_N: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs_s = tl.arange(0, SPLITS_PAD).to(tl.int64)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < N
    parts = tl.load(partial_ptr + offs_s[:, None] * stride_split + row * stride_pm + offs_n[None, :],
                    mask=(offs_s < num_splits)[:, None] & mask_n[None, :], other=0.0)
    acc = tl.sum(parts, 0)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_om + offs_n, acc.to(out_ptr.dtype.element_ty), mask=mask_n)


def _gemv_splits(n_blocks: int, k_tiles: int, rows: int, n: int, weight_bytes: int, device: torch.device,
                 programs_per_sm: int) -> int:
    """Slices of K for the gemv path: enough programs to keep every SM's loads in flight (a
    4096-wide layer in blocks of 64 channels is only 64 programs), but no slice shorter than 2
    tiles, and a buffer of fp32 partial sums no larger than a quarter of the weight bytes (it is
    written, then read back by the reduction, mostly from L2)."""
    target = launch_target(device)
    if target is None:
        return 1  # the interpreter runs programs one after another: slicing only adds work
    want = triton.cdiv(programs_per_sm * target.num_sms, n_blocks)
    return max(1, min(want, k_tiles // 2, weight_bytes // (16 * rows * n)))


def gemv(x: torch.Tensor, weight: torch.Tensor, scales: torch.Tensor, zeros_arg: torch.Tensor,
         bias: torch.Tensor | None, bias_arg: torch.Tensor, out: torch.Tensor, int4: bool, group_size: int,
         stride_sn: int, precision: str, split_k: int | None) -> None:
    """out [rows, out] = x [rows, in] @ dequant(weight).T (+ bias), for up to a few rows (more, when
    forced, take several blocks of GEMV_MAX_ROWS); arguments as `quant_matmul._quant_matmul` makes them."""
    rows, out_features = out.shape
    in_features = x.shape[1]
    # Tile shapes as measured fastest on an H100 (BENCHMARKS.md).
    block_n = 64 if int4 or rows > 1 else 16
    block_k = min(128, group_size) if int4 else (128 if rows > 1 else 256)
    n_blocks, k_tiles = triton.cdiv(out_features, block_n), triton.cdiv(in_features, block_k)
    if split_k is None:
        split_k = _gemv_splits(n_blocks, k_tiles, rows, out_features, weight.numel() * weight.element_size(),
                               x.device, programs_per_sm=8 if int4 and rows == 1 else 4)
    tiles_per_split = triton.cdiv(k_tiles, min(split_k, k_tiles))
    splits = triton.cdiv(k_tiles, tiles_per_split)  # no slice left empty
    target = out if splits == 1 else torch.empty((splits, rows, out_features), dtype=torch.float32,
                                                 device=x.device)
    has_bias = bias is not None and splits == 1
    split_stride = target.stride(0) if splits > 1 else 0
    if rows == 1:
        _gemv_row_kernel[(n_blocks, splits)](
            x, weight, scales, zeros_arg, bias_arg, target, out_features, in_features, tiles_per_split,
            weight.stride(0), stride_sn, split_stride, INT4=int4, GROUP_SIZE=group_size, HAS_BIAS=has_bias,
            BLOCK_N=block_n, BLOCK_K=block_k, num_warps=4)
    else:
        _gemv_kernel[(n_blocks, splits, triton.cdiv(rows, GEMV_MAX_ROWS))](
            x, weight, scales, zeros_arg, bias_arg, target, rows, out_features, in_features, tiles_per_split,
            x.stride(0), weight.stride(0), stride_sn, target.stride(-2), split_stride,
            INT4=int4, GROUP_SIZE=group_size, HAS_BIAS=has_bias, BLOCK_M=GEMV_MAX_ROWS,
            BLOCK_N=block_n, BLOCK_K=block_k, PRECISION=precision, num_warps=4)
    if splits > 1:
        reduce_n = 128
        _split_k_reduce_kernel[(rows, triton.cdiv(out_features, reduce_n))](
            target, bias_arg, out, out_features, splits, target.stride(0), target.stride(1), out.stride(0),
            HAS_BIAS=bias is not None, SPLITS_PAD=triton.next_power_of_2(splits), BLOCK_N=reduce_n)
