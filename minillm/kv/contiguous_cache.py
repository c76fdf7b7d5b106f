"""Contiguous KV cache: one buffer per running sequence, reserved for its longest possible length.

A sequence may stop early (end of text) or never reach max_tokens, but its buffer was sized for
prompt + max_tokens when it started: what is reserved and what is used differ, and the difference
is memory no other request can have. The course measures that waste before paging removes it.
"""

from __future__ import annotations

import torch

from minillm.config.model import ModelConfig
from minillm.sequence import Sequence


class ContiguousKVCache:
    def __init__(self, config: ModelConfig, dtype: torch.dtype, device: torch.device,
                 capacity_tokens: int) -> None:
        """capacity_tokens: the KV budget; a request is admitted only if its whole reservation fits."""
        self.num_layers = config.num_hidden_layers
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.dtype = dtype
        self.device = device
        self.bytes_per_token = config.kv_bytes_per_token(torch.finfo(dtype).bits // 8)
        self.capacity_tokens = capacity_tokens
        self.buffers: dict[str, torch.Tensor] = {}

    def can_allocate(self, seq: Sequence) -> bool:
        return self.reserved_tokens + seq.max_len <= self.capacity_tokens

    def allocate(self, seq: Sequence) -> None:
        self.buffers[seq.request_id] = torch.empty(
            (self.num_layers, 2, seq.max_len, self.num_kv_heads, self.head_dim),
            dtype=self.dtype, device=self.device)

    def free(self, seq: Sequence) -> None:
        self.buffers.pop(seq.request_id, None)

    def buffer(self, seq: Sequence) -> torch.Tensor:
        """[num_layers, 2 (K, V), capacity, num_kv_heads, head_dim]"""
        return self.buffers[seq.request_id]

    @property
    def reserved_tokens(self) -> int:
        return sum(b.shape[2] for b in self.buffers.values())

    @property
    def reserved_bytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self.buffers.values())
