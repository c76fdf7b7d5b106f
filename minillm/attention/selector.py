"""Which attention kernels run: `attention_backend="auto"|"torch"|"triton"`."""

from __future__ import annotations

import os

import torch

from minillm.device import triton_status

ATTENTION_BACKENDS = ("auto", "torch", "triton")


def resolve_attention_backend(name: str, device: torch.device, block_size: int) -> str:
    """`auto` is Triton on a CUDA GPU where Triton runs (and blocks are at least 16 tokens, the
    smallest tile its kernels take), PyTorch elsewhere (Triton's CPU interpreter is exact but far
    too slow to serve with; ask for it by name to study the kernels)."""
    if name not in ATTENTION_BACKENDS:
        raise ValueError(f"attention_backend must be one of {ATTENTION_BACKENDS}, got {name!r}")
    if name == "auto":
        # Triton is imported only where it could be chosen: the import alone takes a while.
        return "triton" if device.type == "cuda" and block_size >= 16 and triton_status()[0] else "torch"
    if name == "triton":
        triton_ok, reason = triton_status()
        if not triton_ok:
            raise ValueError(f"attention_backend='triton' cannot run here: {reason}")
        if device.type == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
            raise ValueError("attention_backend='triton' on the CPU runs in Triton's interpreter: set "
                             "TRITON_INTERPRET=1 before minillm is imported, or use a CUDA GPU")
        if device.type == "mps":
            raise ValueError("attention_backend='triton' cannot run on mps: Triton targets CUDA GPUs "
                             "(and the CPU through TRITON_INTERPRET=1)")
        if block_size < 16:
            raise ValueError(f"attention_backend='triton' needs block_size >= 16 (its tiles feed tl.dot), "
                             f"got {block_size}")
    return name
