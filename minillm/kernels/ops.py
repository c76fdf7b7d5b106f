"""Which kernels run, and their functions: "torch" (the PyTorch references) or "triton".

One choice covers both users of kernels, paged attention and the quantized matmuls, so an engine
never runs Triton attention beside PyTorch matmuls by accident. It is made from the engine's
`attention_backend` argument (vLLM's name, kept although it now picks more than attention).
"""

from __future__ import annotations

import os
from types import SimpleNamespace

import torch

from minillm.config.engine import KERNEL_CHOICES, KERNELS
from minillm.kernels import reference
from minillm.quant.reference import int4_matmul_ref, int8_matmul_ref
from minillm.utils.device import triton_status


def resolve_kernel(name: str, device: torch.device, block_size: int) -> str:
    """`auto` is Triton on a CUDA GPU where Triton runs (and blocks are at least 16 tokens, the
    smallest tile its kernels take), PyTorch elsewhere (Triton's CPU interpreter is exact but far
    too slow to serve with; ask for it by name to study the kernels)."""
    if name not in KERNEL_CHOICES:
        raise ValueError(f"attention_backend must be one of {KERNEL_CHOICES}, got {name!r}")
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


def load_ops(kernel: str) -> SimpleNamespace:
    """store_kvcache, paged_decode_attention, paged_prefill_attention, int8_matmul and int4_matmul of
    `kernel`, each with its reference's signature. A new namespace every call: an exercise replaces
    one op of one attention backend, and no other backend or layer sees it."""
    if kernel not in KERNELS:
        raise ValueError(f"the kernel must be one of {KERNELS}, got {kernel!r}")
    if kernel == "triton":
        # Imported here: the kernel modules need triton, which the torch path never does.
        from minillm.kernels.paged_decode import paged_decode_attention
        from minillm.kernels.paged_prefill import paged_prefill_attention
        from minillm.kernels.quant_matmul import int4_matmul, int8_matmul
        from minillm.kernels.store_kv import store_kvcache

        return SimpleNamespace(store_kvcache=store_kvcache, paged_decode_attention=paged_decode_attention,
                               paged_prefill_attention=paged_prefill_attention, int8_matmul=int8_matmul,
                               int4_matmul=int4_matmul)
    return SimpleNamespace(store_kvcache=reference.store_kvcache_ref,
                           paged_decode_attention=reference.paged_decode_attention_ref,
                           paged_prefill_attention=reference.paged_prefill_attention_ref,
                           int8_matmul=int8_matmul_ref, int4_matmul=int4_matmul_ref)
