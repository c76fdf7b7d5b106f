"""The contract between the model runner and an attention backend.

The runner knows which tokens of which sequences a step computes; each backend turns that into the
metadata it reads (vLLM v1's metadata builders), in tensors of its own where a CUDA graph needs fixed
addresses. The KV-cache manager only keeps the scheduler's bookkeeping; the model only calls
`attn(layer_idx, q, k, v)`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch

from minillm.layers.rotary import QKRotation
from minillm.sequence import Sequence


@dataclass
class AttentionMetadata:
    """Describes one step's flattened batch: sequence i owns tokens
    query_start_loc[i]:query_start_loc[i + 1] of q, k and v, which sit at positions
    start_pos[i], start_pos[i] + 1, ... of that sequence (start_pos[i] tokens are cached already)."""

    query_start_loc: list[int]
    start_pos: list[int]
    # Contiguous cache only: one [num_layers, 2, capacity, num_kv_heads, head_dim] buffer per sequence.
    kv_buffers: list[torch.Tensor] = field(default_factory=list)
    # Paged cache only (see kernels/attention_reference.py for the layout).
    slot_mapping: torch.Tensor | None = None  # [tokens]: where each new token's K/V go in the pool
    block_tables: torch.Tensor | None = None  # [num_seqs, max_blocks] int32
    seq_lens: torch.Tensor | None = None  # [num_seqs] int32: cached + new tokens
    cu_seqlens_q: torch.Tensor | None = None  # [num_seqs + 1] int32: query_start_loc on the device
    max_query_len: int = 0
    max_seq_len: int = 0
    # Every sequence row brings one query: the split-KV decode kernel runs (else the ragged kernel).
    decode_only: bool = False

    @property
    def num_seqs(self) -> int:
        return len(self.start_pos)


@dataclass(frozen=True)
class BatchDescriptor:
    """The padded shape of a step that a CUDA graph replays (vLLM's name): num_tokens token rows,
    num_seqs sequence rows, num_logits rows of logits. Rows past the batch's own are padding that
    stores nothing and attends to nothing. uniform_decode: one query per sequence, each sampled (the
    decode kernel's launch, and logits at every row); otherwise the ragged kernel's, whose launch
    depends only on these numbers."""

    num_tokens: int
    num_seqs: int
    num_logits: int
    uniform_decode: bool


def query_start_loc(query_lens: list[int]) -> list[int]:
    """[0, n0, n0 + n1, ...]: where each sequence's tokens start in the flattened batch, and the end."""
    loc = [0]
    for n in query_lens:
        loc.append(loc[-1] + n)
    return loc


class AttentionBackend(Protocol):
    name: str
    # Whether this backend's steps can be captured as CUDA graphs: its metadata lives in persistent
    # tensors (graph_metadata) and it never syncs with the host. A backend that says False always
    # runs eagerly (vLLM: the backend's cudagraph support).
    supports_cuda_graphs: bool

    def build_metadata(self, seqs: list[Sequence], start_pos: list[int], query_lens: list[int],
                       batch: BatchDescriptor | None = None) -> AttentionMetadata:
        """A step's metadata: sequence i computes query_lens[i] tokens from position start_pos[i].
        batch: padded to that shape (a CUDA graph's), the padding reading and writing nothing."""
        ...

    def forward(self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                metadata: AttentionMetadata, rotation: QKRotation | None = None) -> torch.Tensor:
        """q: [tokens, heads, head_dim]; k, v: [tokens, kv_heads, head_dim] for this step's new
        tokens. rotation: q and k come unrotated, and the backend rotates them (a paged one as it
        stores K/V, in one op); None: they come rotated. Stores k and v if the backend keeps a
        cache; returns [tokens, heads, head_dim]."""
        ...
