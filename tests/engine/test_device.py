"""dtype choice on CUDA GPUs of each generation, faked: bf16 is decided by compute capability, not by
torch.cuda.is_bf16_supported(), which says True on a T4 (7.5) through emulation."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from minillm.utils.device import resolve_dtype
from minillm.utils.env import collect_env, format_env

CUDA = torch.device("cuda")
NO_BF16_NOTE = ("this GPU has no native bfloat16 (compute capability 7.5 < 8.0): "
                "dtype='auto' runs bfloat16 checkpoints in float16")


@pytest.fixture
def fake_gpu(monkeypatch):
    """Returns a function that makes torch see one CUDA GPU of the given compute capability."""
    def make(capability: tuple[int, int]) -> None:
        props = SimpleNamespace(name=f"Fake GPU {capability}", major=capability[0], minor=capability[1],
                                total_memory=16 * 2**30)
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *args, **kwargs: True)
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
        monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: props)
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: props.name)
    return make


def test_auto_runs_bf16_checkpoints_in_fp16_on_a_t4(fake_gpu):
    fake_gpu((7, 5))
    assert resolve_dtype("auto", "bfloat16", CUDA) == torch.float16
    assert resolve_dtype("auto", "torch.bfloat16", CUDA) == torch.float16


@pytest.mark.parametrize("capability", [(8, 0), (9, 0)])
def test_auto_keeps_bf16_from_ampere_on(fake_gpu, capability):
    fake_gpu(capability)
    assert resolve_dtype("auto", "bfloat16", CUDA) == torch.bfloat16
    assert resolve_dtype("bfloat16", "float16", CUDA) == torch.bfloat16


@pytest.mark.parametrize("capability", [(7, 5), (8, 0), (9, 0)])
def test_auto_keeps_fp16_checkpoints_fp16(fake_gpu, capability):
    fake_gpu(capability)
    assert resolve_dtype("auto", "float16", CUDA) == torch.float16


@pytest.mark.parametrize("dtype", ["bfloat16", torch.bfloat16])
def test_explicit_bf16_on_a_t4_is_refused(fake_gpu, dtype):
    fake_gpu((7, 5))
    with pytest.raises(ValueError, match=r"dtype='bfloat16'.*compute capability 7\.5.*8\.0\+.*dtype='float16'"):
        resolve_dtype(dtype, "bfloat16", CUDA)
    assert resolve_dtype("float16", "bfloat16", CUDA) == torch.float16


def test_env_notes_missing_bf16_on_a_t4(fake_gpu):
    fake_gpu((7, 5))
    info = collect_env()
    assert info["cuda"]["capability"] == "7.5" and info["cuda"]["bf16"] is False
    assert f"note             {NO_BF16_NOTE}" in format_env(info).splitlines()


def test_env_has_no_bf16_note_on_ampere(fake_gpu):
    fake_gpu((8, 0))
    info = collect_env()
    assert info["cuda"]["bf16"] is True
    assert "no native bfloat16" not in format_env(info)
