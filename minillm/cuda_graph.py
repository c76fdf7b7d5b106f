"""CUDA graphs for decode steps.

A decode step of a small model is hundreds of kernel launches of a few microseconds of GPU work
each, and the CPU needs tens of microseconds of Python to issue each one: the GPU waits on the CPU
(on an H100, a 0.44B model's eager decode step took 25 ms, where reading its weights takes 0.3).
A CUDA graph records the launches of one step once and replays them all with a single call.

A graph replays fixed shapes at fixed addresses. So the step's inputs are copied into buffers
allocated once, sized for the largest batch, and a graph is captured for each of a few batch sizes
(`capture_sizes`); a batch of n sequences replays the smallest one that holds it, padded. Padding
rows are harmless: slot -1 (their K and V are not stored) and length 0 (they attend to nothing,
and the decode kernel gives them zeros). The attention kernel is captured for max_model_len, its
partitions past a sequence's length returning at once. Only pure decode steps are replayed;
prefill and mixed steps, whose shapes vary with every prompt, run eagerly.

Without `capture`, the same padded buffers run eagerly: that is how a CPU tests this path.
"""

from __future__ import annotations

import bisect
import functools
import time
from collections.abc import Callable
from typing import TypeVar

import torch

from minillm.attention import AttentionBackend, AttentionMetadata
from minillm.logger import init_logger
from minillm.models.llama import LlamaForCausalLM

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
    def __init__(self, model: LlamaForCausalLM, attn_backend: AttentionBackend, max_num_seqs: int,
                 max_model_len: int, block_size: int, device: torch.device, capture: bool = True) -> None:
        self.model = model
        self.attn_backend = attn_backend
        self.max_model_len = max_model_len
        self.sizes = capture_sizes(max_num_seqs)
        n, blocks = self.sizes[-1], -(-max_model_len // block_size)
        self.input_ids = torch.zeros(n, dtype=torch.long, device=device)
        self.positions = torch.zeros(n, dtype=torch.long, device=device)
        self.slot_mapping = torch.full((n,), -1, dtype=torch.int32, device=device)
        self.block_tables = torch.zeros((n, blocks), dtype=torch.int32, device=device)
        self.seq_lens = torch.zeros(n, dtype=torch.int32, device=device)
        self.cu_seqlens_q = torch.arange(n + 1, dtype=torch.int32, device=device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.logits: dict[int, torch.Tensor] = {}
        self.capture_seconds = 0.0
        self.memory_bytes = 0
        if capture:
            self._capture()

    @property
    def max_batch_size(self) -> int:
        return self.sizes[-1]

    @torch.inference_mode()
    def run(self, input_ids: list[int], positions: list[int], slots: list[int], block_tables: list[list[int]],
            seq_lens: list[int]) -> torch.Tensor:
        """One decode step of len(input_ids) <= max_batch_size sequences -> logits [n, vocab];
        block_tables padded to one width."""
        n = len(input_ids)
        size = self.sizes[bisect.bisect_left(self.sizes, n)]
        tables = torch.tensor(block_tables, dtype=torch.int32)
        width = tables.shape[1]
        self.input_ids[:n].copy_(torch.tensor(input_ids), non_blocking=True)
        self.positions[:n].copy_(torch.tensor(positions), non_blocking=True)
        self.slot_mapping[:n].copy_(torch.tensor(slots, dtype=torch.int32), non_blocking=True)
        self.slot_mapping[n:size].fill_(-1)
        self.block_tables[:n, :width].copy_(tables, non_blocking=True)
        self.seq_lens[:n].copy_(torch.tensor(seq_lens, dtype=torch.int32), non_blocking=True)
        self.seq_lens[n:size].zero_()
        if size in self.graphs:
            self.graphs[size].replay()
            return self.logits[size][:n]
        return self._forward(size)[:n]

    def _forward(self, size: int) -> torch.Tensor:
        """The model on the first `size` rows of the buffers."""
        metadata = AttentionMetadata(
            query_start_loc=list(range(size + 1)), start_pos=[0] * size, slot_mapping=self.slot_mapping[:size],
            block_tables=self.block_tables[:size], seq_lens=self.seq_lens[:size],
            cu_seqlens_q=self.cu_seqlens_q[:size + 1], max_query_len=1, max_seq_len=self.max_model_len,
            num_decodes=size)
        hidden = self.model(self.input_ids[:size], self.positions[:size],
                            functools.partial(self.attn_backend.forward, metadata=metadata))
        return self.model.compute_logits(hidden)

    @torch.inference_mode()
    def _capture(self) -> None:
        # What the graphs' private memory pool reserves (their intermediate and output tensors).
        start, reserved_before = time.perf_counter(), torch.cuda.memory_reserved()
        pool = None
        # Largest first: the smaller graphs then fit in the memory pool the largest one left.
        for size in reversed(self.sizes):
            graph, self.logits[size] = capture_graph(functools.partial(self._forward, size), pool)
            pool = graph.pool()
            self.graphs[size] = graph
        torch.cuda.synchronize()
        self.capture_seconds = time.perf_counter() - start
        self.memory_bytes = torch.cuda.memory_reserved() - reserved_before
        logger.info(f"captured CUDA graphs for decode batches of {self.sizes[0]} to {self.sizes[-1]} sequences "
                    f"({len(self.sizes)} sizes) in {self.capture_seconds:.1f} s, using "
                    f"{self.memory_bytes / 2**30:.2f} GiB; enforce_eager=True turns them off")
