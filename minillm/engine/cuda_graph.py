"""CUDA graphs for every step shape.

A step of a small model is hundreds of kernel launches of a few microseconds of GPU work each, and
the CPU needs tens of microseconds of Python to issue each one: the GPU waits on the CPU (on an
H100, a 1.1B model's eager step took 12-20 ms, where reading its weights takes 0.9). A CUDA graph
records the launches of one step once and replays them all with a single call.

A graph replays fixed shapes at fixed addresses. So the step's inputs are copied into buffers
allocated once (input_buffers.py, and the paged attention backend's metadata tensors), and a graph
is captured for each of a few padded shapes (`BatchDescriptor`s, vLLM's scheme):

- uniform decode steps (one token per sequence, each sampled) by sequence count, 1, 2, 4, 8, then
  steps of 16 (`capture_sizes`): the split-KV decode kernel, captured for max_model_len;
- every other step (prompt chunks, decodes mixed with them, speculative verification, a draft
  model's catch-up) by token count, 8 to max_num_batched_tokens in steps of at most half
  (`token_capture_sizes`): the ragged attention kernel, whose launch depends on the token and
  sequence counts alone, with one sequence row per token (up to max_num_seqs) and one more, whose
  rows are padding; logits at up to max_num_logits rows.

A step replays the smallest graph that holds it; a step too big for every graph runs eagerly.
Padding rows are harmless: slot -1 (their K and V are not stored) and no keys (they attend to
nothing, and get zeros). cudagraph_mode="FULL_DECODE_ONLY" captures the decode graphs alone, to
measure what the others buy (chapter 08).

Without `capture`, the same padded buffers run eagerly: that is how a CPU tests this path.
"""

from __future__ import annotations

import bisect
import functools
import time
from collections.abc import Callable
from typing import TypeVar

import torch

from minillm.attention import AttentionBackend, BatchDescriptor
from minillm.engine.input_buffers import InputBuffers
from minillm.models.interface import CausalLM
from minillm.utils.logger import init_logger

logger = init_logger(__name__)
T = TypeVar("T")


def capture_sizes(max_num_seqs: int) -> list[int]:
    """Sequence counts of the uniform decode graphs: 1, 2, 4, 8, then steps of 16, up to max_num_seqs
    (itself included)."""
    sizes = [s for s in [1, 2, 4, 8, *range(16, max_num_seqs + 1, 16)] if s <= max_num_seqs]
    return sizes if sizes[-1] == max_num_seqs else [*sizes, max_num_seqs]


def token_capture_sizes(max_num_tokens: int) -> list[int]:
    """Token counts of the other graphs: 8, 16, 32, 64, then 1.5x and 2x each power of two (96, 128,
    192, 256, ...), up to max_num_tokens (itself included): a step pads by at most half its tokens,
    and 2,048 tokens take 14 graphs."""
    sizes, power = [8, 16, 32, 64], 64
    while sizes[-1] < max_num_tokens:
        sizes += [power * 3 // 2, power * 2]
        power *= 2
    sizes = [s for s in sizes if s < max_num_tokens]
    return [*sizes, max_num_tokens]


@functools.cache
def capture_stream(device: int) -> torch.cuda.Stream:
    """The one side stream that every graph on `device` is warmed up and recorded on. cuBLAS keeps a
    workspace for each stream it has run on (32 MiB on a Hopper GPU) for good: a new stream for each
    of the 1.1B engine's 34 graphs held about 1.1 GiB of workspaces."""
    return torch.cuda.Stream(device)


def capture_graph(fn: Callable[[], T], pool=None) -> tuple[torch.cuda.CUDAGraph, T]:
    """fn's launches recorded in a CUDA graph (its memory from `pool`, if given), and what fn returned,
    which each replay overwrites. A warm-up run first compiles the kernels and lets libraries
    allocate their workspaces outside the capture; on a side stream, as torch's documentation asks."""
    stream = capture_stream(torch.cuda.current_device())
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool, stream=stream):
        out = fn()
    return graph, out


def padded_forward(model: CausalLM, attn_backend: AttentionBackend, buffers: InputBuffers,
                   batch: BatchDescriptor) -> torch.Tensor:
    """The model on the front rows of the buffers, padded to `batch`: logits [batch.num_logits, vocab],
    at every row of a uniform decode, else at buffers.logits_indices."""
    metadata = attn_backend.graph_metadata(batch)
    hidden = model(buffers.input_ids.tensor[:batch.num_tokens], buffers.positions.tensor[:batch.num_tokens],
                   functools.partial(attn_backend.forward, metadata=metadata))
    if not batch.uniform_decode:
        hidden = hidden[buffers.logits_indices.tensor[:batch.num_logits]]
    return model.compute_logits(hidden)


class CudaGraphs:
    def __init__(self, model: CausalLM, attn_backend: AttentionBackend, buffers: InputBuffers, max_num_seqs: int,
                 max_num_tokens: int, max_num_logits: int, capture: bool = True, decode_only: bool = False,
                 name: str = "model") -> None:
        """Graphs of `model` over attn_backend and buffers: uniform decodes of up to max_num_seqs
        sequences, other steps (unless decode_only) of up to max_num_tokens tokens with logits at up
        to max_num_logits rows. capture=False runs the same padded shapes eagerly."""
        self._padded_forward = functools.partial(padded_forward, model, attn_backend, buffers)
        self.max_num_seqs = max_num_seqs
        self.max_num_logits = max_num_logits
        self.decode_sizes = capture_sizes(max_num_seqs)
        self.token_sizes = [] if decode_only else token_capture_sizes(max_num_tokens)
        self.graphs: dict[BatchDescriptor, torch.cuda.CUDAGraph] = {}
        self.logits: dict[BatchDescriptor, torch.Tensor] = {}
        # One output for every shape: a graph's own logits would stay reserved in the graphs' memory
        # pool for good (a 32k vocabulary over the 1.1B model's 34 shapes: 4,519 rows, 0.54 GiB), where
        # a step reads only its own, before the next step runs.
        rows = max(self.decode_sizes[-1], max_num_logits if self.token_sizes else 0)
        self.logits_out = torch.empty((rows, model.config.vocab_size), dtype=torch.float32,
                                      device=buffers.input_ids.tensor.device)
        self.capture_seconds = 0.0
        self.memory_bytes = 0
        if capture:
            self._capture(name)

    def descriptor(self, query_lens: list[int], num_logits: list[int]) -> BatchDescriptor | None:
        """The padded shape a step replays, sequence i feeding query_lens[i] tokens with logits at
        its last num_logits[i]; None where no graph holds it."""
        num_seqs, num_tokens, logits = len(query_lens), sum(query_lens), sum(num_logits)
        if all(n == 1 for n in query_lens) and all(k == 1 for k in num_logits) and num_seqs <= self.decode_sizes[-1]:
            size = self.decode_sizes[bisect.bisect_left(self.decode_sizes, num_seqs)]
            return BatchDescriptor(size, size, size, uniform_decode=True)
        if (not self.token_sizes or num_tokens > self.token_sizes[-1] or logits > self.max_num_logits
                or num_seqs > self.max_num_seqs):
            return None
        return self._ragged(self.token_sizes[bisect.bisect_left(self.token_sizes, num_tokens)])

    def run(self, batch: BatchDescriptor) -> torch.Tensor:
        """The step padded to `batch`, its inputs already in the buffers -> logits [batch.num_logits, vocab]."""
        if batch in self.graphs:
            self.graphs[batch].replay()
            return self.logits[batch]
        return self.forward(batch)

    def forward(self, batch: BatchDescriptor) -> torch.Tensor:
        """The step padded to `batch`, run eagerly (or recorded): its logits, in the shared output."""
        logits = self._padded_forward(batch)
        out = self.logits_out[:logits.shape[0]]
        out.copy_(logits)
        return out

    def _ragged(self, num_tokens: int) -> BatchDescriptor:
        # A sequence row for each token (up to max_num_seqs) and one for the padding tokens.
        return BatchDescriptor(num_tokens, min(num_tokens, self.max_num_seqs) + 1,
                               min(num_tokens, self.max_num_logits), uniform_decode=False)

    @torch.inference_mode()
    def _capture(self, name: str) -> None:
        # What the graphs' private memory pool reserves (their intermediate and output tensors).
        # Capturing empties the allocator's cache, so it is emptied first: what an engine freed
        # before must not count as the graphs' memory given back.
        torch.cuda.empty_cache()
        start, reserved_before = time.perf_counter(), torch.cuda.memory_reserved()
        pool = None
        # Largest first: the smaller graphs then fit in the memory pool the largest one left.
        batches = [self._ragged(n) for n in reversed(self.token_sizes)]
        batches += [BatchDescriptor(n, n, n, uniform_decode=True) for n in reversed(self.decode_sizes)]
        for batch in batches:
            graph, self.logits[batch] = capture_graph(functools.partial(self.forward, batch), pool)
            pool = graph.pool()
            self.graphs[batch] = graph
        torch.cuda.synchronize()
        self.capture_seconds = time.perf_counter() - start
        # The shared logits output, allocated before, is the graphs' memory too.
        output = self.logits_out.numel() * self.logits_out.element_size()
        self.memory_bytes = torch.cuda.memory_reserved() - reserved_before + output
        others = (f"other steps of {self.token_sizes[0]} to {self.token_sizes[-1]} tokens ({len(self.token_sizes)} "
                  "sizes)" if self.token_sizes else "no other steps (cudagraph_mode='FULL_DECODE_ONLY')")
        logger.info(f"captured CUDA graphs of the {name}: decode batches of {self.decode_sizes[0]} to "
                    f"{self.decode_sizes[-1]} sequences ({len(self.decode_sizes)} sizes), {others}, in "
                    f"{self.capture_seconds:.1f} s, using {self.memory_bytes / 2**30:.2f} GiB; "
                    "enforce_eager=True turns them off")
