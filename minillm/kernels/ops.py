"""Which kernels run, and their functions: "torch" (the PyTorch references) or "triton".

An engine chooses once, from its `attention_backend` argument (vLLM's name, kept although it now picks
more than attention), and every layer that has a kernel (attention and the KV store, the quantized
matmuls, RMSNorm with and without the residual add, rotary embedding alone and fused with the KV
store, SiLU-and-mul) calls its op from that one `KernelOps`, so an engine never runs Triton
attention beside PyTorch matmuls by accident. The dense matmuls are torch's (cuBLAS) under both names.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import torch

from minillm.config.engine import KERNEL_CHOICES, KERNELS
from minillm.kernels import attention_reference, layer_reference
from minillm.quant.matmul_reference import int4_matmul_ref, int8_matmul_ref
from minillm.utils.device import triton_status


@dataclass
class KernelOps:
    """One engine's kernel functions, each with its reference's signature. Mutable on purpose: an
    exercise replaces one op of one engine, and no other engine sees it."""

    kernel: str  # "torch" or "triton"
    store_kvcache: Callable
    paged_decode_attention: Callable
    paged_prefill_attention: Callable
    int8_matmul: Callable
    int4_matmul: Callable
    rms_norm: Callable
    fused_add_rms_norm: Callable
    rotary_embedding: Callable
    # Rotary embedding (with Qwen3's q/k norm) and the KV store in one: what the paged backend calls
    # in place of rotary_embedding then store_kvcache. The references' is the two in a row.
    fused_rotary_store_kvcache: Callable
    silu_and_mul: Callable


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


def load_ops(kernel: str = "torch") -> KernelOps:
    """The ops of `kernel`: a new KernelOps every call, so that replacing an op in one engine's (or one
    layer's) changes nothing anywhere else."""
    if kernel not in KERNELS:
        raise ValueError(f"the kernel must be one of {KERNELS}, got {kernel!r}")
    ops = KernelOps(kernel, store_kvcache=attention_reference.store_kvcache_ref,
                    paged_decode_attention=attention_reference.paged_decode_attention_ref,
                    paged_prefill_attention=attention_reference.paged_prefill_attention_ref,
                    int8_matmul=int8_matmul_ref, int4_matmul=int4_matmul_ref,
                    rms_norm=layer_reference.rms_norm_ref,
                    fused_add_rms_norm=layer_reference.fused_add_rms_norm_ref,
                    rotary_embedding=layer_reference.rotary_embedding_ref,
                    fused_rotary_store_kvcache=layer_reference.fused_rotary_store_kvcache_ref,
                    silu_and_mul=layer_reference.silu_and_mul_ref)
    if kernel == "triton":
        # Imported here: the kernel modules need triton, which the torch path never does.
        from minillm.kernels.activation import silu_and_mul
        from minillm.kernels.paged_decode import paged_decode_attention
        from minillm.kernels.paged_prefill import paged_prefill_attention
        from minillm.kernels.quant_matmul import int4_matmul, int8_matmul
        from minillm.kernels.rms_norm import fused_add_rms_norm, rms_norm
        from minillm.kernels.rotary import rotary_embedding
        from minillm.kernels.rotary_store import fused_rotary_store_kvcache
        from minillm.kernels.store_kv import store_kvcache

        ops.store_kvcache, ops.int8_matmul, ops.int4_matmul = store_kvcache, int8_matmul, int4_matmul
        ops.paged_decode_attention, ops.paged_prefill_attention = paged_decode_attention, paged_prefill_attention
        ops.rms_norm, ops.fused_add_rms_norm = rms_norm, fused_add_rms_norm
        ops.rotary_embedding, ops.silu_and_mul = rotary_embedding, silu_and_mul
        ops.fused_rotary_store_kvcache = fused_rotary_store_kvcache
    return ops
