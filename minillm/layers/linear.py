"""Linear layers that hold several of the checkpoint's matrices stacked along the output dim, and
how a layer takes its weights from a checkpoint.

Q, K and V (and the MLP's gate and up) read the same input, so one matmul against the stacked
weights does the work of three (two) and reads the input once. Checkpoints store them separately:
each merged layer's `weight_loader` puts a checkpoint matrix into its own rows (`output_sizes`).
The loader calls a layer's `weight_loader` for every tensor it owns, so a layer that stores its
weights another way (stacked experts, a tensor-parallel shard) loads its slice without touching
the loader."""

from __future__ import annotations

import torch
from torch import nn


def default_weight_loader(param: torch.Tensor, loaded: torch.Tensor, shard_id: int | None = None) -> None:
    """Copy a checkpoint tensor into a parameter (or buffer) of the same shape."""
    copy_checked(param.data, loaded)


def copy_checked(dest: torch.Tensor, loaded: torch.Tensor) -> None:
    if tuple(loaded.shape) != tuple(dest.shape):
        raise ValueError(f"has shape {tuple(loaded.shape)}, but config.json implies {tuple(dest.shape)}")
    dest.copy_(loaded)


def shard_range(output_sizes: list[int], index: int) -> tuple[int, int]:
    """The rows of the stacked output that hold checkpoint matrix `index`."""
    start = sum(output_sizes[:index])
    return start, start + output_sizes[index]


def load_output_shard(output_sizes: list[int], param: torch.Tensor, loaded: torch.Tensor,
                      shard_id: int | None) -> None:
    """Checkpoint matrix `shard_id` into its rows of a stacked tensor (every tensor of a merged layer,
    quantized ones included, has the output channels first); the whole tensor where shard_id is None."""
    if shard_id is None:
        copy_checked(param.data, loaded)
        return
    start, end = shard_range(output_sizes, shard_id)
    copy_checked(param.data[start:end], loaded)


class MergedLinear(nn.Linear):
    def __init__(self, in_features: int, output_sizes: list[int], bias: bool) -> None:
        super().__init__(in_features, sum(output_sizes), bias=bias)
        self.output_sizes = list(output_sizes)

    def weight_loader(self, param: torch.Tensor, loaded: torch.Tensor, shard_id: int | None) -> None:
        load_output_shard(self.output_sizes, param, loaded, shard_id)
