"""What the engine needs of a model, whatever its architecture: the small protocol that the runner,
the loader, the proposers and the benchmarks are written against (vLLM's model interface, cut down).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch

from minillm.config.model import ModelConfig
from minillm.kernels.ops import KernelOps

# attn(layer_idx, q, k, v, rotation=None) -> out, with q: [tokens, heads, head_dim], k/v: [tokens,
# kv_heads, head_dim]; rotation (layers.rotary.QKRotation): q and k come unrotated, the backend rotates
# them (a paged cache as it stores K/V). The backend's forward with the step's metadata bound.
AttentionFn = Callable[..., torch.Tensor]


class CausalLM(Protocol):
    config: ModelConfig
    ops: KernelOps  # the kernels its layers call
    # Checkpoint tensor name -> (the merged module holding it, its shard index), e.g. q_proj ->
    # ("qkv_proj", 0): the loader finds each tensor's place, and the writer splits it back out.
    packed_modules_mapping: dict[str, tuple[str, int]]

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, attn: AttentionFn) -> torch.Tensor:
        """input_ids, positions: [tokens] (every sequence of the step, flattened) -> hidden [tokens, hidden]."""
        ...

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [rows, hidden] -> fp32 logits [rows, vocab], for the rows that are sampled."""
        ...

    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor, attn: AttentionFn) -> torch.Tensor:
        ...
