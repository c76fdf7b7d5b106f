"""The decode path of the quantized matmuls (`quant_matmul.py`): a few rows of x against the
whole weight, each weight byte read once for all the rows.

One program per block of output channels and per slice of the inputs (split-K), holding every row.
2 to 16 rows take the tensor cores: int4 read as int32 words of 8 levels, one tl.dot per nibble
position (`quant_tiles.word_dot_level`), int8 one per tile; the levels carry an offset that, with
the zero point and the scale, is applied once per tile (`quant_tiles.py`). A single row has its own
kernel on the plain ALUs (`quant_gemv_row.py`).

At batch 1 such a kernel can be bound by the instructions it issues: an H100 issues about 33 T
lane-instructions a second, so reading 2.4 TB/s leaves at most about 14 instructions a byte.
`python -m minillm.kernels.sass` counts the loops' from their machine code: 6.0 for int4's one
row with fp16 inputs (packed, under triton 3.9; 9.0 in fp32) and 8.7 for its 2 to 16, against
13.8 and 14.7 before they read words. That count is a ceiling:
these kernels have read at about half of an H100's bandwidth, so how their bytes are read matters
too (how many are in flight, in runs of what length).

Split-K is one launch: the last slice of each output block to finish adds the slices' partial sums
in a fixed order, so results do not vary from run to run (greedy decoding stays reproducible) and a
decode step has no extra reduction launch per matmul.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from minillm.kernels.quant_gemv_row import _gemv_row_kernel
from minillm.kernels.quant_half2 import packs, runs_ptx
from minillm.kernels.quant_tiles import (
    dot_level_offset,
    dot_tile,
    finish_rows,
    nibble_inputs,
    word_dot_level,
    word_level_offset,
)
from minillm.kernels.targets import GPUSpec, first_fitting, launch_target, shared_bytes_estimate

# tl.dot's smallest row tile on the GPU is 16, so up to 16 rows cost one pass over the weights, the
# same as one row. And at 16 rows a weight still does little arithmetic per byte read (2 * 16 flops
# per int8 byte, 64 per int4 byte) against the 200-300 flops per byte at which an H100/H200's tensor
# cores, not its memory, become the limit: reading the weights once is still all that matters. Past
# that, more rows are better spread over more programs, which is what the gemm grid does.
GEMV_MAX_ROWS = 16
# Sub-tiles of one group's inputs in a tile of the one-row int4 kernel (`quant_gemv_row.py`), where
# the inputs divide: a tile reads each of its rows in one run of this many times 64 bytes (groups of
# 128 and more; 16 or 32 for smaller ones). The int4 kernel measured so far read runs of 64 bytes and
# reached 0.36-0.59 of an H100's read bandwidth, where int8's, reading 256, reached 0.77: 2 makes the
# runs whole 128-byte lines with the same work a thread (16 words, 4 rows), as many programs, and
# nearly the same instructions and registers (`kernels.sass`). On an H200 (2026-11-28,
# `scripts/quant_gemv_sweep.py`) 2 groups were 6-10% faster than 1, 10-17% faster than 4 on the
# large layers, and as fast as 4 on 4096 x 4096.
ONE_ROW_INT4_GROUPS = 2
# Triton's software pipeline for the 2-to-16-row kernel: int8's tiles go straight from memory to
# registers (1 stage) and int4's words through a 3-stage ring in shared memory. On an H200, 2, 8 and
# 16 rows of int8 took 30-38 µs on 4096 x 14336 with 1 stage against 43-44 with Triton's default 3
# (slower than fp16's 33-35), and 13 against 15-16 on 4096 x 4096; int4 at 16 rows took 31 µs with
# 3 stages against 36 with 1 (BENCHMARKS.md, 2026-11-28).
GEMV_STAGES_INT4, GEMV_STAGES_INT8 = 3, 1


@triton.jit
def _word_tile_loads(x_rows, w_ptr, rows, mask_m, mask_n, k0, SUB_K: tl.constexpr):
    """The inputs [rows, SUB_K] and int32 words [channels, SUB_K // 8] of one group's tile at k0."""
    x = tl.load(x_rows + (k0 + tl.arange(0, SUB_K))[None, :], mask=mask_m[:, None], other=0.0)
    w = tl.load(w_ptr + rows + (k0 // 8 + tl.arange(0, SUB_K // 8))[None, :], mask=mask_n[:, None], other=0)
    return x, w


@triton.jit
def _word_tile_sum(acc, x, w, scales_ptr, zeros_ptr, offs_n, mask_n, stride_sn, k0, GROUP_SIZE: tl.constexpr,
                   OFFSET: tl.constexpr, PRECISION: tl.constexpr):
    """acc plus one group's tile of int32 words times its inputs: one tl.dot per nibble, each over
    the word columns (16 of them, tl.dot's least), with the inputs that meet that nibble."""
    planes = nibble_inputs(x, w.shape[1])
    products = tl.zeros(acc.shape, tl.float32)
    for i in tl.static_range(8):
        products = tl.dot(planes[i], tl.trans(word_dot_level(w, i, x.dtype)), products, input_precision=PRECISION)
    group = k0 // GROUP_SIZE
    scale = tl.load(scales_ptr + offs_n * stride_sn + group, mask=mask_n, other=0.0).to(tl.float32)
    zero = tl.load(zeros_ptr + offs_n * stride_sn + group, mask=mask_n, other=0.0).to(tl.float32)
    x_sums = tl.sum(x.to(tl.float32), 1)[:, None]
    return acc + (products - x_sums * (zero + OFFSET)[None, :]) * scale[None, :]


@triton.jit
def _gemv_kernel(x_ptr, w_ptr, scales_ptr, zeros_ptr, bias_ptr, out_ptr, partial_ptr, counter_ptr, M, N, K,
                 tiles_per_split, num_splits, stride_xm, stride_wn, stride_sn, stride_om, stride_split,
                 INT4: tl.constexpr, GROUP_SIZE: tl.constexpr, HAS_BIAS: tl.constexpr, OFFSET: tl.constexpr,
                 SPLIT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 PRECISION: tl.constexpr, SUB_K: tl.constexpr = 0):
    """Program (n, s, m): output channels of block n, input slice s, rows of block m (a single
    block up to GEMV_MAX_ROWS rows). int4 in words (SUB_K >= 128): a tile is one or two sub-tiles
    of SUB_K inputs, each within a group, whose loads are all issued before either's arithmetic, so
    that a row's words are requested together."""
    pid_n = tl.program_id(0)
    split = tl.program_id(1)
    offs_m = tl.program_id(2) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_m = offs_m < M
    mask_n = offs_n < N
    x_rows = x_ptr + offs_m.to(tl.int64)[:, None] * stride_xm
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    start = split * tiles_per_split * BLOCK_K
    end = tl.minimum(K, start + tiles_per_split * BLOCK_K)
    if INT4 and SUB_K >= 128:
        tl.static_assert(BLOCK_K == SUB_K or BLOCK_K == 2 * SUB_K, "a tile of one or two sub-tiles")
        rows = offs_n.to(tl.int64)[:, None] * stride_wn
        for k0 in range(start, end, BLOCK_K):
            x, w = _word_tile_loads(x_rows, w_ptr, rows, mask_m, mask_n, k0, SUB_K)
            if BLOCK_K > SUB_K:
                x2, w2 = _word_tile_loads(x_rows, w_ptr, rows, mask_m, mask_n, k0 + SUB_K, SUB_K)
            acc = _word_tile_sum(acc, x, w, scales_ptr, zeros_ptr, offs_n, mask_n, stride_sn, k0, GROUP_SIZE, OFFSET,
                                 PRECISION)
            if BLOCK_K > SUB_K:
                acc = _word_tile_sum(acc, x2, w2, scales_ptr, zeros_ptr, offs_n, mask_n, stride_sn, k0 + SUB_K,
                                     GROUP_SIZE, OFFSET, PRECISION)
    else:
        for k0 in range(start, end, BLOCK_K):
            offs_k = k0 + tl.arange(0, BLOCK_K)
            x = tl.load(x_rows + offs_k[None, :], mask=mask_m[:, None] & (offs_k < K)[None, :], other=0.0)
            acc = dot_tile(acc, x, w_ptr, scales_ptr, zeros_ptr, offs_n, mask_n, k0, K, stride_wn, stride_sn,
                           BLOCK_K, GROUP_SIZE, INT4, OFFSET, PRECISION)
    finish_rows(acc, scales_ptr, bias_ptr, out_ptr, partial_ptr, counter_ptr, offs_m, offs_n, mask_m, mask_n,
                stride_om, split, num_splits, stride_split, INT4, HAS_BIAS, SPLIT)


def gemv_tiles(target: GPUSpec | None, rows: int, int4: bool, group_size: int, element_size: int,
               in_features: int) -> tuple[int, int, int]:
    """(BLOCK_N, BLOCK_K, warps) of the gemv path on `target` (None: the interpreter); in_features is
    a multiple of the group size, and of BLOCK_K. The one-row kernel holds its tiles in registers:
    int8's sizes are the fastest of a sweep on an H100 (BENCHMARKS.md); int4's give each thread 4 rows
    of 4 words, so that the inputs it converts serve 4 rows (8 rows on 2 warps issue a few percent
    fewer instructions a byte, but in 255 registers, which leave room for 8 warps an SM to wait on
    memory; `python -m minillm.kernels.sass` counts them). Its tile spans ONE_ROW_INT4_GROUPS
    sub-tiles of at most 128 inputs of one group each, where the inputs divide into such tiles: for
    groups of 128 and more, 128 channels x 128 inputs for one, 64 x 256 for two, 32 x 512 for four,
    each the same 16 words a thread.
    The tl.dot kernel stages x's rows and the weight tile in shared memory for the tensor cores, and
    takes narrower tiles where a GPU has too little of it; its int4 tiles lie in one group."""
    block_k = min(128, group_size) if int4 else (128 if rows > 1 else 256)
    if rows == 1:
        if not int4:
            return 16, block_k, 4
        subtiles = next(n for n in (ONE_ROW_INT4_GROUPS, 2, 1) if in_features % (n * block_k) == 0)
        return 128 // subtiles, subtiles * block_k, 4
    if target is None:
        return 64, block_k, 4
    if target.capability < 80:
        # On a T4 the compiler fits 64 x 128 tiles in 64 registers a thread and spills 2.5-2.8 KB
        # (ptxas's report, `kernels/aot.py`); 32 x 64 tiles spill nothing.
        return 32, min(64, block_k), 4
    # int4 in words (block_k 128): 128 channels, so that a thread's share of a tile is 8 words.
    widths = [128, 64, 32] if int4 and block_k >= 128 else [64, 32]
    block_n = first_fitting(target, widths,
                            lambda n: shared_bytes_estimate(target, GEMV_MAX_ROWS + n, block_k, element_size))
    return block_n, block_k, 4


def _gemv_splits(target: GPUSpec | None, n_blocks: int, k_tiles: int, rows: int, n: int, weight_bytes: int,
                 programs_per_sm: int) -> int:
    """Slices of K for the gemv path: enough programs to keep every SM's loads in flight (a
    4096-wide layer in blocks of 64 channels is only 64 programs), but no slice shorter than 2
    tiles, and a buffer of fp32 partial sums no larger than a quarter of the weight bytes (it is
    written, then read back by the last slice, mostly from L2)."""
    if target is None:
        return 1  # the interpreter runs programs one after another: slicing only adds work
    want = triton.cdiv(programs_per_sm * target.num_sms, n_blocks)
    return max(1, min(want, k_tiles // 2, weight_bytes // (16 * rows * n)))


_counters: dict[torch.device, list[torch.Tensor]] = {}


def split_counters(device: torch.device, count: int) -> torch.Tensor:
    """int32 zeros, one per output block of a split-K launch, kept per device and left at zero by
    every launch, so that a CUDA graph replays with the same buffer and no host work. Launches on a
    device run one after another (the engine uses one stream), so they can share it. It grows only
    on a launch wider than any before, which a graph's warm-up run makes outside the capture; the
    smaller buffers are kept, since a captured graph may still point at one."""
    buffers = _counters.setdefault(device, [])
    if not buffers or buffers[-1].numel() < count:
        buffers.append(torch.zeros(max(1024, triton.next_power_of_2(count)), dtype=torch.int32, device=device))
    return buffers[-1]


def gemv(x: torch.Tensor, weight: torch.Tensor, scales: torch.Tensor, zeros_arg: torch.Tensor,
         bias: torch.Tensor | None, bias_arg: torch.Tensor, out: torch.Tensor, int4: bool, group_size: int,
         stride_sn: int, precision: str, split_k: int | None) -> None:
    """out [rows, out] = x [rows, in] @ dequant(weight).T (+ bias), for up to a few rows (more, when
    forced, take several blocks of GEMV_MAX_ROWS); arguments as `quant_matmul._quant_matmul` makes them."""
    rows, out_features = out.shape
    in_features = x.shape[1]
    target = launch_target(x.device)
    block_n, block_k, warps = gemv_tiles(target, rows, int4, group_size, x.element_size(), in_features)
    n_blocks, k_tiles = triton.cdiv(out_features, block_n), triton.cdiv(in_features, block_k)
    if split_k is None:
        split_k = _gemv_splits(target, n_blocks, k_tiles, rows, out_features, weight.numel() * weight.element_size(),
                               programs_per_sm=8 if int4 and rows == 1 else 4)
    tiles_per_split = triton.cdiv(k_tiles, min(split_k, k_tiles))
    splits = triton.cdiv(k_tiles, tiles_per_split)  # no slice left empty
    m_blocks = 1 if rows == 1 else triton.cdiv(rows, GEMV_MAX_ROWS)
    if splits > 1:  # the slices' partial sums, laid out as out, one plane per slice
        partial = torch.empty((splits, rows, out_features), dtype=torch.float32, device=x.device)
        counters = split_counters(x.device, n_blocks * m_blocks)
    else:
        partial, counters = out, out  # never read
    common = dict(INT4=int4, GROUP_SIZE=group_size, HAS_BIAS=bias is not None, SPLIT=splits > 1, BLOCK_N=block_n,
                  BLOCK_K=block_k, num_warps=warps)
    # int4 as int32 words, 8 levels each (see the kernels), where a tile holds 16 words or more.
    words = int4 and (rows == 1 or block_k >= 128)
    sub_k = min(128, group_size)
    # The word paths read whole tiles of whole sub-tiles (no mask along the inputs): what the tile
    # rules give, and what a forced tile (scripts/quant_gemv_sweep.py) must keep to.
    assert not words or (in_features % block_k == 0 and block_k % sub_k == 0
                         and (rows == 1 or sub_k == 128 and block_k in (128, 256))), (in_features, block_k, group_size)
    packed = weight.view(torch.int32) if words else weight
    if rows == 1:
        # The packed step reads the inputs two at a time, as int32: a row at an odd element keeps fp32.
        _gemv_row_kernel[(n_blocks, splits)](
            x, packed, scales, zeros_arg, bias_arg, out, partial, counters, out_features, in_features,
            tiles_per_split, splits, packed.stride(0), stride_sn, partial.stride(0),
            SUB_K=sub_k if int4 else block_k,
            HALF2=int4 and packs(x.dtype, target) and x.data_ptr() % 4 == 0, ASM=runs_ptx(target), **common)
    else:
        offset = word_level_offset(x.dtype) if words else dot_level_offset(int4, x.dtype)
        _gemv_kernel[(n_blocks, splits, m_blocks)](
            x, packed, scales, zeros_arg, bias_arg, out, partial, counters, rows, out_features, in_features,
            tiles_per_split, splits, x.stride(0), packed.stride(0), stride_sn, out.stride(0), partial.stride(0),
            OFFSET=offset, BLOCK_M=GEMV_MAX_ROWS, PRECISION=precision, SUB_K=sub_k if words else 0,
            num_stages=GEMV_STAGES_INT4 if int4 else GEMV_STAGES_INT8, **common)
