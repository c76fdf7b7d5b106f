"""Triton kernels, each with a plain-PyTorch reference of the same signature in `reference.py`.

The kernel modules import triton, so they are imported only when the Triton backend is chosen. On a
CPU, set TRITON_INTERPRET=1 before the first import and the same kernels run in Triton's numpy
interpreter: slow, but exact enough to test against the references.
"""

import torch


def dot_precision(dtype: torch.dtype) -> str:
    """tl.dot's input_precision: fp32 inputs would otherwise be rounded to tf32 (a 10-bit mantissa)
    on the GPU's tensor cores, far off the fp32 reference."""
    return "ieee" if dtype == torch.float32 else "tf32"
