"""The KV pool's budget on a GPU is vLLM's: gpu_memory_utilization of the device's whole memory, less
what the process holds already (the weights), and never more than that share of what is still free.
On a CPU the budget is fixed, and the pool takes memory only as it is written."""

from __future__ import annotations

import pytest
import torch

from minillm.kv.pool import KVPool, available_kv_bytes, kv_bytes_per_token
from minillm.models.loader import resolve_model_path
from minillm.models.registry import read_model_config
from minillm.utils.memory import PeakMemory

GIB = 2**30
GPU = torch.device("cuda", 0)


def test_the_budget_is_a_share_of_the_whole_memory_less_the_weights(monkeypatch):
    def device_memory(free: int, total: int, held: int) -> None:
        monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (free, total))
        monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: held)

    device_memory(free=70 * GIB, total=80 * GIB, held=10 * GIB)  # 10 GiB of weights loaded
    assert available_kv_bytes(GPU, 0.9) == int(0.9 * 80 * GIB) - 10 * GIB
    assert available_kv_bytes(GPU, 0.5) == 30 * GIB  # the share is of the whole card, not of what is free
    device_memory(free=20 * GIB, total=80 * GIB, held=10 * GIB)  # another process holds 50 GiB
    assert available_kv_bytes(GPU, 0.9) == int(0.9 * 20 * GIB)
    device_memory(free=4 * GIB, total=80 * GIB, held=76 * GIB)  # weights past the share: no room
    assert available_kv_bytes(GPU, 0.9) == 0


def test_a_cpu_pool_takes_memory_as_tokens_are_stored():
    """A CPU pool is sized from a fixed budget (4 GiB by default), far more than most runs store: it
    must read as zeros everywhere, yet hold memory only where something was written."""
    config = read_model_config(resolve_model_path("tiny"))
    block_size = 16
    num_blocks = GIB // (block_size * kv_bytes_per_token(config, torch.float32))
    with PeakMemory(torch.device("cpu")) as added:
        pool = KVPool(config, num_blocks, block_size, torch.float32, torch.device("cpu"))
        k = pool.kv_caches[0][0]
        k[7].fill_(1.5)  # one block of one layer's keys
    assert pool.reserved_bytes >= 0.99 * GIB
    if added.bytes is None:
        pytest.skip("this system does not let a process measure its resident memory")
    assert added.bytes < 64 * 2**20
    assert k[7].eq(1.5).all() and not k[6].any() and not k[num_blocks - 1].any() and not pool.kv_caches[-1].any()
