"""The KV pool's budget on a GPU is vLLM's: gpu_memory_utilization of the device's whole memory, less
what the process holds already (the weights), and never more than that share of what is still free."""

from __future__ import annotations

import torch

from minillm.kv.pool import available_kv_bytes

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
