"""Timing GPU work, and the device's roofs (copy and read-only bandwidth, matmul throughput), for the
benchmarks.

Kernels are timed as CUDA-graph replays: a graph launches its kernels back to back, so what is
measured is GPU time, without the microseconds the CPU spends issuing each launch (which is what
the engine's CUDA graphs remove too). A graph holds several calls on distinct copies of the data,
so that each call reads from memory, not from the 50 MB of L2 cache an H100 has.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import torch

from minillm.engine.cuda_graph import capture_graph

L2_DEFEAT_BYTES = 256 << 20  # more than any GPU's L2 cache


def num_copies(nbytes: int) -> int:
    """How many copies of `nbytes` of data a timed graph cycles through so that none stays in L2."""
    return max(1, math.ceil(L2_DEFEAT_BYTES / max(nbytes, 1)))


def graph_time(calls: list[Callable[[], object]], repeats: int = 10) -> float:
    """Median GPU seconds per call of `calls`, captured once in one CUDA graph and replayed."""
    graph, _ = capture_graph(lambda: [call() for call in calls])
    return replay_time(graph, repeats) / len(calls)


def replay_time(graph: torch.cuda.CUDAGraph, repeats: int = 10) -> float:
    """Median GPU seconds of one replay of `graph`, after one untimed, each timed by CUDA events."""
    graph.replay()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return sorted(times)[len(times) // 2]


def wall_time(call: Callable[[], object], repeats: int = 5) -> float:
    """Median seconds of `call` by the host clock, after one warm-up (the CPU's counterpart)."""
    call()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def copy_bandwidth(device: torch.device | str = "cuda", num_bytes: int = 1 << 30) -> float:
    """Bytes per second of a device-to-device copy, bytes read and bytes written both counted."""
    device = torch.device(device)
    src = torch.empty(num_bytes // 2, dtype=torch.float16, device=device)
    dst = torch.empty_like(src)
    if device.type == "cuda":
        return 2 * src.nbytes / graph_time([lambda: dst.copy_(src)])
    return 2 * src.nbytes / wall_time(lambda: dst.copy_(src))


def read_bandwidth(device: torch.device | str = "cuda", num_bytes: int = 1 << 30) -> float:
    """Bytes per second of a sum over a buffer: it reads every byte once and writes one number. A copy
    writes as much as it reads; a kernel that mostly reads, as a decode step does, can beat it, and
    this is the roof it approaches instead."""
    device = torch.device(device)
    src = torch.ones(num_bytes // 4, dtype=torch.float32, device=device)
    if device.type == "cuda":
        return src.nbytes / graph_time([lambda: src.sum()])
    return src.nbytes / wall_time(lambda: src.sum())


def matmul_flops(device: torch.device | str = "cuda", dtype: torch.dtype = torch.bfloat16, n: int = 8192) -> float:
    """Floating-point operations per second of one large square matmul in `dtype`."""
    device = torch.device(device)
    a = torch.randn(n, n, dtype=dtype, device=device)
    b = torch.randn(n, n, dtype=dtype, device=device)
    seconds = graph_time([lambda: a @ b]) if device.type == "cuda" else wall_time(lambda: a @ b)
    return 2 * n ** 3 / seconds
