"""Paged attention: K/V live in the block pool; a step writes its new K/V through the slot mapping,
then attends by reading each sequence's blocks through its block table.

Two kernels do the reading: decode (every sequence brings one query) and prefill (a ragged batch
of several queries per sequence, attending to their cached prefix and causally to each other). A
step that mixes them has its single-query sequences first (the scheduler orders them so): one
decode call takes those, one prefill call the rest. The `torch` implementation is the readable
reference; `triton` runs the kernels in minillm/kernels (both from minillm.kernels.ops.load_ops).
"""

from __future__ import annotations

import torch

from minillm.attention.base import AttentionMetadata
from minillm.kernels.ops import load_ops
from minillm.kv.pool import KVPool


class PagedAttention:
    name = "paged"

    def __init__(self, kv_pool: KVPool, kernel: str, head_dim: int) -> None:
        self.kv_pool = kv_pool
        self.kernel = kernel  # "torch" or "triton"
        self.ops = load_ops(kernel)
        self.scale = head_dim ** -0.5
        # An int8 pool: every op also takes the layer's scales, quantizes on store and dequantizes on
        # load. (Not passed at all otherwise, so that a kernel with the plain signature still plugs in.)
        self.scale_args = [{} for _ in kv_pool.kv_caches] if kv_pool.kv_scales is None else [
            {"k_scales": k_scales, "v_scales": v_scales} for k_scales, v_scales in kv_pool.kv_scales]

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
