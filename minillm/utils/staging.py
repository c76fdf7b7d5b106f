"""Writing a step's values into tensors allocated once, instead of allocating new ones.

A CUDA graph captured at start-up reads its inputs from fixed addresses; the runner's token ids and
positions and the attention backends' metadata are therefore persistent tensors whose front rows
each step overwrites (engine/cuda_graph.py).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


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
