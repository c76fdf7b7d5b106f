"""`minillm bench attention` (CUDA only): the Triton attention kernels against the hardware.

Decode reads every cached K and V once per step and does little arithmetic, so its ceiling is
memory bandwidth: the table reports the kernel's achieved GB/s (bytes of K, V and q read, output
written, over time) against the copy bandwidth measured on the same device in the same run.
Prefill is compute-bound: the ragged paged kernel against PyTorch's scaled_dot_product_attention
on the same tokens held contiguously (which needs no block table, so it is the harder baseline),
as [batch, heads, tokens, head_dim]: given 3-D inputs, SDPA falls back to its slow math path on a
GPU, which would flatter the Triton kernel. Times are GPU times (bench/timing.py). `tilings`
times the ragged kernel again at other (BLOCK_M, BLOCK_N, warps[, pipeline stages]) than its
launcher picks, to choose a GPU's entry in `kernels/paged_prefill.py` from measurements.
"""

from __future__ import annotations

import functools
from unittest import mock

import torch

from minillm.bench.timing import copy_bandwidth, graph_time

DECODE_COLUMNS = [("batch", "batch"), ("context", "context"), ("ms", "ms"), ("GB_s", "GB/s"),
                  ("of_copy_bw", "of copy bandwidth"), ("max_abs_err", "max |err| vs torch")]
TILING_COLUMNS = [("tokens", "tokens"), ("tiling", "BLOCK_M x BLOCK_N x warps"), ("triton_ms", "triton ms"),
                  ("speed_vs_sdpa", "SDPA time / triton time"), ("max_abs_err", "max |err| vs SDPA"),
                  ("error", "error")]
PREFILL_COLUMNS = [("tokens", "tokens"), ("triton_ms", "triton ms"), ("sdpa_ms", "SDPA ms"),
                   ("triton_TFLOP_s", "triton TFLOP/s"), ("sdpa_TFLOP_s", "SDPA TFLOP/s"),
                   ("speed_vs_sdpa", "SDPA time / triton time"), ("max_abs_err", "max |err| vs SDPA")]


def paged_inputs(batch: int, context: int, num_kv_heads: int, group: int, head_dim: int, block_size: int,
                 dtype: torch.dtype):
    blocks_per_seq = -(-context // block_size)
    num_blocks = batch * blocks_per_seq
    k_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, dtype=dtype, device="cuda")
    v_cache = torch.randn_like(k_cache)
    tables = torch.randperm(num_blocks, device="cuda").view(batch, blocks_per_seq).to(torch.int32)
    lens = torch.full((batch,), context, dtype=torch.int32, device="cuda")
    return k_cache, v_cache, tables, lens


def parse_tiling(text: str) -> tuple[int, ...]:
    """'64x32x8' -> (BLOCK_M, BLOCK_N, warps): powers of two, tiles of 16 to 256, 1 to 16 warps; a
    fourth field, '64x64x4x3', also sets the pipeline's stages (1 to 6; the launcher's: 2)."""
    parts = text.lower().split("x")
    if len(parts) not in (3, 4) or not all(p.isdigit() for p in parts):
        raise ValueError(f"must be BLOCK_MxBLOCK_NxWARPS[xSTAGES], e.g. 64x32x8, got {text!r}")
    m, n, warps, *stages = map(int, parts)
    if any(v & (v - 1) for v in (m, n, warps)) or not (16 <= m <= 256 and 16 <= n <= 256 and 1 <= warps <= 16):
        raise ValueError(f"must be powers of two, tiles of 16 to 256 and 1 to 16 warps, got {text!r}")
    if stages and not 1 <= stages[0] <= 6:
        raise ValueError(f"stages must be 1 to 6, got {text!r}")
    return m, n, warps, *stages


def bench_attention(contexts=(4096, 8192, 16384, 32768), batch: int = 8, num_kv_heads: int = 8, group: int = 4,
                    head_dim: int = 128, block_size: int = 16, prefill_tokens=(512, 2048, 4096),
                    dtype: torch.dtype = torch.float16, tilings: tuple[tuple[int, ...], ...] = ()
                    ) -> tuple[list[dict], list[dict], dict]:
    if not torch.cuda.is_available():
        raise ValueError("minillm bench attention measures the Triton kernels on a CUDA GPU; none is visible")
    from minillm.kernels import paged_prefill
    from minillm.kernels.attention_reference import paged_decode_attention_ref
    from minillm.kernels.paged_decode import paged_decode_attention
    from minillm.kernels.paged_prefill import paged_prefill_attention

    copy_bw = copy_bandwidth()
    scale = head_dim ** -0.5
    decode_rows = []
    for context in contexts:
        k_cache, v_cache, tables, lens = paged_inputs(batch, context, num_kv_heads, group, head_dim, block_size,
                                                      dtype)
        q = torch.randn(batch, num_kv_heads * group, head_dim, dtype=dtype, device="cuda")
        seconds = graph_time([functools.partial(paged_decode_attention, q, k_cache, v_cache, tables, lens, scale,
                                                max_seq_len=context)])
        moved = 2 * k_cache.numel() * k_cache.element_size() + 2 * q.numel() * q.element_size()
        err = (paged_decode_attention(q, k_cache, v_cache, tables, lens, scale).float()
               - paged_decode_attention_ref(q.float(), k_cache.float(), v_cache.float(), tables, lens, scale)).abs()
        decode_rows.append({"batch": batch, "context": context, "ms": seconds * 1e3, "GB_s": moved / seconds / 1e9,
                            "of_copy_bw": moved / seconds / copy_bw, "max_abs_err": err.max().item()})
        del k_cache, v_cache

    prefill_rows, tiling_rows = [], []
    heads = num_kv_heads * group
    for tokens in prefill_tokens:
        k_cache, v_cache, tables, lens = paged_inputs(1, tokens, num_kv_heads, group, head_dim, block_size, dtype)
        q = torch.randn(tokens, heads, head_dim, dtype=dtype, device="cuda")
        cu = torch.tensor([0, tokens], dtype=torch.int32, device="cuda")
        # The same K/V, contiguous and expanded to every query head, [1, heads, tokens, head_dim] as
        # SDPA's flash path takes them.
        order = tables[0].long()
        k = k_cache[order].flatten(0, 1)[:tokens].transpose(0, 1).repeat_interleave(group, 0)[None].contiguous()
        v = v_cache[order].flatten(0, 1)[:tokens].transpose(0, 1).repeat_interleave(group, 0)[None].contiguous()
        sdpa = functools.partial(torch.nn.functional.scaled_dot_product_attention,
                                 q.transpose(0, 1)[None].contiguous(), k, v, is_causal=True, scale=scale)
        triton = functools.partial(paged_prefill_attention, q, k_cache, v_cache, cu, lens, tables, scale,
                                   max_query_len=tokens)
        t_triton, t_sdpa = graph_time([triton]), graph_time([sdpa])
        err = (triton().float() - sdpa()[0].transpose(0, 1).float()).abs().max().item()
        flops = 2 * 2 * heads * head_dim * tokens * (tokens + 1) / 2  # two matmuls over the causal half
        prefill_rows.append({"tokens": tokens, "triton_ms": t_triton * 1e3, "sdpa_ms": t_sdpa * 1e3,
                             "triton_TFLOP_s": flops / t_triton / 1e12, "sdpa_TFLOP_s": flops / t_sdpa / 1e12,
                             "speed_vs_sdpa": t_sdpa / t_triton, "max_abs_err": err})
        for tiling in tilings:
            row = {"tokens": tokens, "tiling": "x".join(map(str, tiling))}
            stages = tiling[3] if len(tiling) > 3 else paged_prefill.STAGES
            with mock.patch.object(paged_prefill, "ragged_tiles", lambda *args, tiling=tiling: tiling[:3]), \
                    mock.patch.object(paged_prefill, "STAGES", stages):
                try:
                    t_tiled = graph_time([triton])
                    err = (triton().float() - sdpa()[0].transpose(0, 1).float()).abs().max().item()
                except Exception as e:  # a tiling this GPU cannot launch is a row of the table, not its end
                    tiling_rows.append({**row, "error": f"{type(e).__name__}: {e}"[:200]})
                    continue
            tiling_rows.append({**row, "triton_ms": t_tiled * 1e3, "speed_vs_sdpa": t_sdpa / t_tiled,
                                "max_abs_err": err})
    summary = {"device": torch.cuda.get_device_name(), "copy_GB_s": copy_bw / 1e9, "dtype": str(dtype),
               "min_decode_fraction_of_copy_bw": min((r["of_copy_bw"] for r in decode_rows), default=None),
               "prefill_speed_vs_sdpa_at_2048": next((r["speed_vs_sdpa"] for r in prefill_rows
                                                      if r["tokens"] == 2048), None),
               "tilings": tiling_rows}
    return decode_rows, prefill_rows, summary
