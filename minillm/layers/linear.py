"""Linear layers that hold several of the checkpoint's matrices stacked along the output dim.

Q, K and V (and the MLP's gate and up) read the same input, so one matmul against the stacked
weights does the work of three (two) and reads the input once. Checkpoints store them separately;
`output_sizes` tells the loader where each one goes."""

from __future__ import annotations

from torch import nn


class MergedLinear(nn.Linear):
    def __init__(self, in_features: int, output_sizes: list[int], bias: bool) -> None:
        super().__init__(in_features, sum(output_sizes), bias=bias)
        self.output_sizes = list(output_sizes)


def shard_range(output_sizes: list[int], index: int) -> tuple[int, int]:
    """The rows of the stacked output that hold checkpoint matrix `index`."""
    start = sum(output_sizes[:index])
    return start, start + output_sizes[index]
