"""CUDA graphs for decode steps.

A decode step of a small model is hundreds of kernel launches of a few microseconds of GPU work
each, and the CPU needs tens of microseconds of Python to issue each one: the GPU waits on the CPU
(on an H100, a 0.44B model's eager decode step took 25 ms, where reading its weights takes 0.3).
A CUDA graph records the launches of one step once and replays them all with a single call.

A graph replays fixed shapes at fixed addresses. So the step's inputs are copied into buffers
allocated once (input_buffers.py, and the paged attention backend's metadata tensors), sized for
the largest batch, and a graph is captured for each
of a few batch sizes (`capture_sizes`); a batch of n sequences replays the smallest one that holds it, padded. Padding
rows are harmless: slot -1 (their K and V are not stored) and length 0 (they attend to nothing,
and the decode kernel gives them zeros). The attention kernel is captured for max_model_len, its
partitions past a sequence's length returning at once. Only pure decode steps are replayed;
prefill and mixed steps, whose shapes vary with every prompt, run eagerly.

Without `capture`, the same padded buffers run eagerly: that is how a CPU tests this path.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import TypeVar

import torch

from minillm.utils.logger import init_logger

logger = init_logger(__name__)
T = TypeVar("T")


def capture_sizes(max_num_seqs: int) -> list[int]:
    """1, 2, 4, 8, then steps of 16, up to max_num_seqs (itself included)."""
    sizes = [s for s in [1, 2, 4, 8, *range(16, max_num_seqs + 1, 16)] if s <= max_num_seqs]
    return sizes if sizes[-1] == max_num_seqs else [*sizes, max_num_seqs]


def capture_graph(fn: Callable[[], T], pool=None) -> tuple[torch.cuda.CUDAGraph, T]:
    """fn's launches recorded in a CUDA graph (its memory from `pool`, if given), and what fn returned,
    which each replay overwrites. A warm-up run first compiles the kernels and lets libraries
    allocate their workspaces outside the capture; on a side stream, as torch's documentation asks."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        out = fn()
    return graph, out


class DecodeGraphs:
    def __init__(self, forward: Callable[[int], torch.Tensor], sizes: list[int], capture: bool = True) -> None:
        """forward(n): a decode step on the first n rows of the runner's persistent buffers -> logits [n, vocab]."""
        self.forward = forward
        self.sizes = sizes
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.logits: dict[int, torch.Tensor] = {}
        self.capture_seconds = 0.0
        self.memory_bytes = 0
        if capture:
            self._capture()

    def run(self, size: int) -> torch.Tensor:
        """The step on the first `size` rows of the buffers (one of self.sizes) -> logits [size, vocab]."""
        if size in self.graphs:
            self.graphs[size].replay()
            return self.logits[size]
        return self.forward(size)

    @torch.inference_mode()
    def _capture(self) -> None:
        # What the graphs' private memory pool reserves (their intermediate and output tensors).
        start, reserved_before = time.perf_counter(), torch.cuda.memory_reserved()
        pool = None
        # Largest first: the smaller graphs then fit in the memory pool the largest one left.
        for size in reversed(self.sizes):
            graph, self.logits[size] = capture_graph(functools.partial(self.forward, size), pool)
            pool = graph.pool()
            self.graphs[size] = graph
        torch.cuda.synchronize()
        self.capture_seconds = time.perf_counter() - start
        self.memory_bytes = torch.cuda.memory_reserved() - reserved_before
        logger.info(f"captured CUDA graphs for decode batches of {self.sizes[0]} to {self.sizes[-1]} sequences "
                    f"({len(self.sizes)} sizes) in {self.capture_seconds:.1f} s, using "
                    f"{self.memory_bytes / 2**30:.2f} GiB; enforce_eager=True turns them off")
