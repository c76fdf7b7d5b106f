"""The step's inputs on the device, allocated once at start.

Every step writes its token ids, positions and paged-attention metadata into the front rows of these
tensors instead of allocating new ones. Their addresses never change, which is what lets a CUDA
graph captured at start-up read each later step's inputs (cuda_graph.py).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


class InputBuffers:
    def __init__(self, max_num_tokens: int, max_num_seqs: int, max_blocks_per_seq: int,
                 device: torch.device) -> None:
        def zeros(*shape: int, dtype: torch.dtype = torch.int32) -> torch.Tensor:
            return torch.zeros(shape, dtype=dtype, device=device)

        self.input_ids = zeros(max_num_tokens, dtype=torch.long)
        self.positions = zeros(max_num_tokens, dtype=torch.long)
        self.slot_mapping = zeros(max_num_tokens)  # paged cache: where each new token's K/V go
        self.block_tables = zeros(max_num_seqs, max_blocks_per_seq)  # wide enough for max_model_len
        self.seq_lens = zeros(max_num_seqs)
        self.cu_seqlens_q = zeros(max_num_seqs + 1)


def stage(buffer: torch.Tensor, values: Sequence[int], num_rows: int | None = None,
          pad: int = 0) -> torch.Tensor:
    """values written to the front of buffer, rows up to num_rows set to pad; returns that view."""
    n = len(values)
    if n > buffer.shape[0]:
        # Only a step without a KV cache feeds more tokens than the step budget: it gets its own tensor.
        return torch.tensor(values, dtype=buffer.dtype, device=buffer.device)
    view = buffer[:n if num_rows is None else num_rows]
    view[:n].copy_(torch.tensor(values, dtype=buffer.dtype), non_blocking=True)
    view[n:].fill_(pad)
    return view
