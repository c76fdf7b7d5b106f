"""Paged attention: K/V live in the block pool; a step writes its new K/V through the slot mapping,
then attends by reading each sequence's blocks through its block table.

Two kernels do the reading: decode (every sequence brings one query) and prefill (a ragged batch
of several queries per sequence, attending to their cached prefix and causally to each other). A
step that mixes them has its single-query sequences first (the scheduler orders them so): one
decode call takes those, one prefill call the rest. Which implementation runs is the engine's
KernelOps: the readable PyTorch references, or Triton's kernels (minillm.kernels.ops).

The backend builds its own metadata from the sequences' block tables, into tensors allocated once:
their addresses never change, so a CUDA graph captured at start-up reads every later step's.
"""

from __future__ import annotations

import torch

from minillm.attention.base import AttentionMetadata, query_start_loc
from minillm.kernels.ops import KernelOps
from minillm.kv.pool import KVPool
from minillm.sequence import Sequence
from minillm.utils.staging import stage


class PagedAttention:
    name = "paged"
    supports_cuda_graphs = True

    def __init__(self, kv_pool: KVPool, ops: KernelOps, head_dim: int, max_num_tokens: int, max_num_seqs: int,
                 max_model_len: int) -> None:
        """max_num_tokens, max_num_seqs: the most a step computes (its metadata tensors' sizes)."""
        self.kv_pool = kv_pool
        self.ops = ops
        self.scale = head_dim ** -0.5
        self.block_size = block_size = kv_pool.block_size
        self.max_num_tokens, self.max_num_seqs, self.max_model_len = max_num_tokens, max_num_seqs, max_model_len
        # An int8 pool: every op also takes the layer's scales, quantizes on store and dequantizes on
        # load. (Not passed at all otherwise, so that a kernel with the plain signature still plugs in.)
        self.scale_args = [{} for _ in kv_pool.kv_caches] if kv_pool.kv_scales is None else [
            {"k_scales": k_scales, "v_scales": v_scales} for k_scales, v_scales in kv_pool.kv_scales]
        device = kv_pool.kv_caches[0][0].device

        def zeros(*shape: int) -> torch.Tensor:
            return torch.zeros(shape, dtype=torch.int32, device=device)

        self.slot_mapping = zeros(max_num_tokens)
        self.block_tables = zeros(max_num_seqs, -(-max_model_len // block_size))  # wide enough for max_model_len
        self.seq_lens = zeros(max_num_seqs)
        self.cu_seqlens_q = zeros(max_num_seqs + 1)

    @property
    def kernel(self) -> str:
        return self.ops.kernel

    def build_metadata(self, seqs: list[Sequence], start_pos: list[int], query_lens: list[int],
                       num_rows: int | None = None) -> AttentionMetadata:
        size = self.block_size
        loc = query_start_loc(query_lens)
        slots: list[int] = []
        seq_lens = []
        for seq, n, start in zip(seqs, query_lens, start_pos):
            table = seq.block_table
            slots += (table[p // size] * size + p % size for p in range(start, start + n))
            seq_lens.append(start + n)
        width = max(len(seq.block_table) for seq in seqs)
        tables = torch.tensor([seq.block_table + [0] * (width - len(seq.block_table)) for seq in seqs],
                              dtype=torch.int32)
        self.block_tables[:len(seqs), :width].copy_(tables, non_blocking=True)
        return AttentionMetadata(
            query_start_loc=loc, start_pos=list(start_pos), block_tables=self.block_tables[:len(seqs), :width],
            slot_mapping=stage(self.slot_mapping, slots, num_rows, pad=-1),  # -1: store nothing
            seq_lens=stage(self.seq_lens, seq_lens, num_rows),  # 0: attend to nothing
            cu_seqlens_q=stage(self.cu_seqlens_q, loc), max_seq_len=max(seq_lens), max_query_len=max(query_lens),
            num_decodes=next((i for i, n in enumerate(query_lens) if n > 1), len(seqs)))

    def decode_graph_metadata(self, num_rows: int) -> AttentionMetadata:
        """The metadata of a pure decode step of num_rows rows, whatever the sequences: what a CUDA graph
        captures, every tensor a fixed view of this backend's, sized for max_model_len."""
        return AttentionMetadata(
            query_start_loc=list(range(num_rows + 1)), start_pos=[0] * num_rows,
            slot_mapping=self.slot_mapping[:num_rows], block_tables=self.block_tables[:num_rows],
            seq_lens=self.seq_lens[:num_rows], max_query_len=1, max_seq_len=self.max_model_len, num_decodes=num_rows)

    def forward(self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                metadata: AttentionMetadata) -> torch.Tensor:
        k_cache, v_cache = self.kv_pool.kv_caches[layer_idx]
        scales = self.scale_args[layer_idx]
        self.ops.store_kvcache(k, v, k_cache, v_cache, metadata.slot_mapping, **scales)
        d = metadata.num_decodes
        if d == metadata.num_seqs:
            return self.ops.paged_decode_attention(q, k_cache, v_cache, metadata.block_tables, metadata.seq_lens,
                                                   self.scale, max_seq_len=metadata.max_seq_len, **scales)
        # Prompt chunks (their queries start at row d), and any decodes before them in one decode call.
        out = torch.empty_like(q)
        if d:
            out[:d] = self.ops.paged_decode_attention(q[:d], k_cache, v_cache, metadata.block_tables[:d],
                                                      metadata.seq_lens[:d], self.scale,
                                                      max_seq_len=metadata.max_seq_len, **scales)
        out[d:] = self.ops.paged_prefill_attention(q[d:], k_cache, v_cache, metadata.cu_seqlens_q[d:] - d,
                                                   metadata.seq_lens[d:], metadata.block_tables[d:], self.scale,
                                                   max_query_len=metadata.max_query_len, **scales)
        return out
