"""Paged attention: K/V live in the block pool; a step writes its new K/V through the slot mapping,
then attends by reading each sequence's blocks through its block table.

Two kernels do the reading: decode, where every sequence brings one query (split-KV, which keeps a
GPU busy on long contexts at small batches), and the ragged kernel for every other step: prompt
chunks, verification rows and decodes mixed in one launch, each sequence attending to its cached
prefix and causally to its own new tokens. Which implementation runs is the engine's KernelOps: the
readable PyTorch references, or Triton's kernels (minillm.kernels.ops).

The backend builds its own metadata from the sequences' block tables, into tensors allocated once:
their addresses never change, so a CUDA graph captured at start-up reads every later step's. A graph
is captured for a padded shape (a BatchDescriptor); a step padded to it has padding token rows that
store nothing (slot -1) and belong to a last sequence row with no keys, and padding sequence rows
of length 0: every padding row attends to nothing and gives zeros.
"""

from __future__ import annotations

import copy

import torch

from minillm.attention.base import AttentionMetadata, BatchDescriptor, query_start_loc
from minillm.kernels.ops import KernelOps
from minillm.kv.pool import KVPool
from minillm.layers.rotary import QKRotation
from minillm.sequence import Sequence
from minillm.utils.staging import CpuGpuBuffer, StagingArena


class PagedAttention:
    name = "paged"
    supports_cuda_graphs = True

    def __init__(self, kv_pool: KVPool, ops: KernelOps, head_dim: int, max_num_tokens: int, max_num_seqs: int,
                 max_model_len: int, arena: StagingArena) -> None:
        """max_num_tokens, max_num_seqs: the most a step computes (its metadata tensors' sizes); arena:
        where they are staged, the model runner's, whose flush sends them with the step's token ids."""
        self.kv_pool = kv_pool
        self.ops = ops
        self.scale = head_dim ** -0.5
        self.block_size = block_size = kv_pool.block_size
        self.max_num_tokens, self.max_num_seqs, self.max_model_len = max_num_tokens, max_num_seqs, max_model_len
        # An int8 pool: every op also takes the layer's scales, quantizes on store and dequantizes on
        # load. (Not passed at all otherwise, so that a kernel with the plain signature still plugs in.)
        self.scale_args = [{} for _ in kv_pool.kv_caches] if kv_pool.kv_scales is None else [
            {"k_scales": k_scales, "v_scales": v_scales} for k_scales, v_scales in kv_pool.kv_scales]

        def int32(*shape: int, fill: int = 0) -> CpuGpuBuffer:
            return arena.buffer(*shape, dtype=torch.int32, fill=fill)

        # One sequence row more than a step has: a padded step's padding tokens belong to it. The
        # tables last, the largest: a step writes their first rows, next to the other buffers'.
        self.slot_mapping = int32(max_num_tokens, fill=-1)
        self.seq_lens = int32(max_num_seqs + 1)
        self.cu_seqlens_q = int32(max_num_seqs + 2)
        self.block_tables = int32(max_num_seqs + 1, -(-max_model_len // block_size))  # wide enough for max_model_len
        self._graph_metadata: dict[BatchDescriptor, AttentionMetadata] = {}

    @property
    def kernel(self) -> str:
        return self.ops.kernel

    def build_metadata(self, seqs: list[Sequence], start_pos: list[int], query_lens: list[int],
                       batch: BatchDescriptor | None = None) -> AttentionMetadata:
        size = self.block_size
        loc = query_start_loc(query_lens)
        slots: list[int] = []
        seq_lens = []
        for seq, n, start in zip(seqs, query_lens, start_pos):
            table = seq.block_table
            slots += (table[p // size] * size + p % size for p in range(start, start + n))
            seq_lens.append(start + n)
        tables = [seq.block_table for seq in seqs]
        block_tables = self.block_tables.stage_rows(tables, max(map(len, tables)))
        if batch is None:
            return AttentionMetadata(
                query_start_loc=loc, start_pos=list(start_pos), block_tables=block_tables,
                slot_mapping=self.slot_mapping.stage(slots), seq_lens=self.seq_lens.stage(seq_lens),
                cu_seqlens_q=self.cu_seqlens_q.stage(loc), max_seq_len=max(seq_lens),
                max_query_len=max(query_lens), decode_only=all(n == 1 for n in query_lens))
        # Padding sequence rows own no tokens but the last, which owns the padding token rows.
        pad_rows = batch.num_seqs - len(seqs)
        padded_loc = loc + [loc[-1]] * (pad_rows - 1) + [batch.num_tokens] if pad_rows else loc
        self.slot_mapping.stage(slots, batch.num_tokens, pad=-1)  # -1: store nothing
        self.seq_lens.stage(seq_lens, batch.num_seqs)  # 0: attend to nothing
        self.cu_seqlens_q.stage(padded_loc)
        metadata = copy.copy(self.graph_metadata(batch))
        metadata.query_start_loc, metadata.start_pos = loc, list(start_pos)
        return metadata

    def graph_metadata(self, batch: BatchDescriptor) -> AttentionMetadata:
        """The metadata of any step padded to `batch`, whatever its sequences: what a CUDA graph
        captures, every tensor a fixed view of this backend's, the tables as wide as max_model_len
        needs. Its bounds are the shape's: the decode kernel's partitions cover max_model_len, the
        ragged kernel's tiles are chosen for queries as long as the whole shape."""
        if batch not in self._graph_metadata:  # the same views every step: made once per shape
            n = batch.num_seqs
            self._graph_metadata[batch] = AttentionMetadata(
                query_start_loc=list(range(n + 1)), start_pos=[0] * n,
                slot_mapping=self.slot_mapping.tensor[:batch.num_tokens], block_tables=self.block_tables.tensor[:n],
                seq_lens=self.seq_lens.tensor[:n], cu_seqlens_q=self.cu_seqlens_q.tensor[:n + 1],
                max_seq_len=self.max_model_len, max_query_len=1 if batch.uniform_decode else batch.num_tokens,
                decode_only=batch.uniform_decode)
        return self._graph_metadata[batch]

    def advance_decode(self, num_seqs: int) -> torch.Tensor:
        """The metadata of a uniform decode step of num_seqs padded rows that follows a padded step of
        the same sequences in the same rows (a draft model's next step), each sequence one token
        further: written on the device from the metadata already there, so that no host work (and a
        CUDA graph) makes it. Rows of length 0 are padding and stay so: the step before padded at least
        as many sequence rows with length 0 (a ragged step has a row per token and one more, a decode
        step of the same sequences the same rows). Returns each row's position (0 for padding): a
        sequence's next token sits at its current length."""
        seq_lens = self.seq_lens.tensor[:num_seqs]
        valid = seq_lens > 0
        positions = torch.where(valid, seq_lens, 0).long()
        blocks = self.block_tables.tensor[:num_seqs].gather(1, (positions // self.block_size)[:, None])[:, 0]
        slots = torch.where(valid, blocks * self.block_size + positions % self.block_size, -1)
        self.slot_mapping.tensor[:num_seqs].copy_(slots)
        seq_lens.add_(valid)
        return positions

    def forward(self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                metadata: AttentionMetadata, rotation: QKRotation | None = None) -> torch.Tensor:
        """rotation: q and k come unrotated, and are rotated as k and v are stored, in one op (with the
        Triton kernels one launch, where rotating and storing apart take two). Either way K/V are
        stored once, before attention reads them back from the pool."""
        k_cache, v_cache = self.kv_pool.kv_caches[layer_idx]
        scales = self.scale_args[layer_idx]
        if rotation is None:
            self.ops.store_kvcache(k, v, k_cache, v_cache, metadata.slot_mapping, **scales)
        else:
            q = self.ops.fused_rotary_store_kvcache(
                rotation.positions, q, k, v, rotation.cos_sin_cache, k_cache, v_cache, metadata.slot_mapping,
                q_norm_weight=rotation.q_norm_weight, k_norm_weight=rotation.k_norm_weight, eps=rotation.eps,
                **scales)
        if metadata.decode_only:
            return self.ops.paged_decode_attention(q, k_cache, v_cache, metadata.block_tables, metadata.seq_lens,
                                                   self.scale, max_seq_len=metadata.max_seq_len, **scales)
        return self.ops.paged_prefill_attention(q, k_cache, v_cache, metadata.cu_seqlens_q, metadata.seq_lens,
                                                metadata.block_tables, self.scale,
                                                max_query_len=metadata.max_query_len, **scales)
