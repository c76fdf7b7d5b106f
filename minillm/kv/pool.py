"""The paged KV pool: for every layer, one tensor of fixed-size blocks allocated once, at start.

The block manager decides which block holds which tokens; the pool only stores them. Allocating
everything up front is what makes paging cheap: a sequence that grows takes a block id from a list,
and no tensor is ever allocated, copied or freed while serving.

With kv_cache_dtype="int8" the pool holds K and V quantized: symmetric int8, one fp32 scale per
(token, kv head) kept beside the values (kernels/attention_reference.py has the formula). A token then takes
head_dim + 4 bytes per layer, K or V, and kv head instead of 2 * head_dim in fp16: about half.
"""

from __future__ import annotations

import math
import mmap
import os

import torch

from minillm.config.model import ModelConfig

# Without a GPU there is no "free device memory" to size the pool from; like vLLM's CPU backend,
# take a fixed KV budget (never more than gpu_memory_utilization of the RAM still available).
CPU_KV_CACHE_BYTES = 4 << 30
# "auto": the model's dtype. vLLM's engine argument; its other values (fp8 variants) are not implemented.
KV_SCALE_DTYPE = torch.float32  # of an int8 cache's scales


def kv_bytes_per_token(config: ModelConfig, dtype: torch.dtype, kv_cache_dtype: str = "auto") -> int:
    """What one token's K and V take in the pool, every layer, scales included."""
    if kv_cache_dtype == "int8":
        return config.kv_bytes_per_token(torch.int8.itemsize, KV_SCALE_DTYPE.itemsize)
    return config.kv_bytes_per_token(dtype.itemsize)


class KVPool:
    def __init__(self, config: ModelConfig, num_blocks: int, block_size: int, dtype: torch.dtype,
                 device: torch.device, kv_cache_dtype: str = "auto") -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.bytes_per_token = kv_bytes_per_token(config, dtype, kv_cache_dtype)
        quantized = kv_cache_dtype == "int8"
        shape = (2, num_blocks, block_size, config.num_key_value_heads, config.head_dim)
        layers = range(config.num_hidden_layers)
        # kv_caches[layer][0] holds K, [1] holds V: [num_blocks, block_size, kv_heads, head_dim]
        self.kv_caches = [zeros_on_demand(shape, torch.int8 if quantized else dtype, device) for _ in layers]
        # int8 only: kv_scales[layer][0] the scales of K, [1] of V: [num_blocks, block_size, kv_heads]
        self.kv_scales = [zeros_on_demand(shape[:-1], KV_SCALE_DTYPE, device)
                          for _ in layers] if quantized else None

    @property
    def reserved_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.kv_caches + (self.kv_scales or []))


def zeros_on_demand(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """torch.zeros, except on a CPU, where the memory is a private anonymous mapping: the operating
    system hands its pages out zero-filled as they are first written. The default 4 GiB pool then
    takes memory as tokens are stored, where torch.zeros writes every byte at start (0.6 s on a
    2-core cloud CPU, and 3-4 GiB resident for a model that stores a few thousand tokens)."""
    if device.type != "cpu" or not hasattr(mmap, "MAP_PRIVATE"):  # MAP_PRIVATE: any POSIX system
        return torch.zeros(shape, dtype=dtype, device=device)
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes == 0:
        return torch.zeros(shape, dtype=dtype)
    # The tensor keeps the mapping alive, and it is unmapped when the tensor is freed.
    return torch.frombuffer(mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE), dtype=dtype).view(shape)


def available_kv_bytes(device: torch.device, gpu_memory_utilization: float) -> int:
    """The memory the pool may take, measured after the model is loaded. On a GPU, vLLM's meaning:
    gpu_memory_utilization of the device's whole memory, less what this process holds already (the
    weights); the rest of the memory is left for activations, CUDA graphs and the runtime. Never more
    than that share of the memory still free, where other processes hold some of it. On a CPU, that
    share of the memory available, at most CPU_KV_CACHE_BYTES."""
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        budget = int(total * gpu_memory_utilization) - torch.cuda.memory_reserved(device)
        return max(0, min(budget, int(free * gpu_memory_utilization)))
    available = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
    return min(CPU_KV_CACHE_BYTES, int(available * gpu_memory_utilization))


def plan_kv_blocks(config: ModelConfig, free_bytes: int, block_size: int, dtype: torch.dtype,
                   kv_cache_dtype: str = "auto", extra_bytes_per_token: int = 0) -> int:
    """How many whole blocks of `block_size` tokens fit in `free_bytes`: a block holds K and V of
    its tokens in every layer (scales included for an int8 cache), and as much again for a draft
    model's pool (`extra_bytes_per_token`)."""
    bytes_per_block = block_size * (kv_bytes_per_token(config, dtype, kv_cache_dtype) + extra_bytes_per_token)
    return max(0, free_bytes) // bytes_per_block


def resolve_num_kv_blocks(num_kv_blocks: int | None, gpu_memory_utilization: float, *, config: ModelConfig,
                          block_size: int, dtype: torch.dtype, device: torch.device, max_model_len: int,
                          max_num_seqs: int, kv_cache_dtype: str = "auto", extra_bytes_per_token: int = 0) -> int:
    """How many blocks the pool gets: `num_kv_blocks` if given, else what fits in the budget of
    `available_kv_bytes` (gpu_memory_utilization of the device's memory, less the weights), capped at
    what max_num_seqs sequences of
    max_model_len tokens could ever use. Fails if one sequence of max_model_len would not fit.
    extra_bytes_per_token: a draft model's pool, which has as many blocks and shares the budget."""
    per_seq = -(-max_model_len // block_size)
    if num_kv_blocks is None:
        budget = available_kv_bytes(device, gpu_memory_utilization)
        fit = plan_kv_blocks(config, budget, block_size, dtype, kv_cache_dtype, extra_bytes_per_token)
        num_kv_blocks = min(fit, per_seq * max_num_seqs)
        source = (f"gpu_memory_utilization={gpu_memory_utilization} of the memory, less the weights "
                  f"({budget / 2**20:.0f} MiB)")
    else:
        source = f"num_kv_blocks={num_kv_blocks}"
    if num_kv_blocks < per_seq:
        raise ValueError(
            f"the KV pool is too small: {source} gives {num_kv_blocks} blocks of {block_size} tokens, but one "
            f"sequence of max_model_len={max_model_len} tokens needs {per_seq}; raise num_kv_blocks or "
            "gpu_memory_utilization, or lower max_model_len")
    return num_kv_blocks
