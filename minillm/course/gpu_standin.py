"""A CPU standing in for a CUDA GPU, so that a CPU runs the course's GPU branches.

The chapters branch on the GPU (`torch.cuda.is_available()`, `course.device == "cuda"`): the GPU
branch measures at a GPU's scale, with calls only CUDA has. With $MINILLM_GPU_STANDIN=1, `setup()`
calls `activate()` before any chapter's import, and then torch reports one CUDA device, tensors
asked for on "cuda" are made on the CPU, the engine resolves "cuda" to the CPU (utils/device.py),
the CUDA-only calls become host equivalents (peak-memory counters read 0, synchronize and
empty_cache do nothing, NVML is unreadable, kernels are timed by the host clock, once) and the
benchmarks that the branches call measure at a CPU's scale. What the cells print then means
nothing; what it proves is that every line of a GPU branch runs, so that a misspelt name, argument
or key in one fails on a CPU (tests/course/test_gpu_branches.py).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import time
from collections.abc import Callable
from types import SimpleNamespace

import torch
from torch.overrides import TorchFunctionMode

from minillm.utils.device import GPU_STANDIN_ENV

NAME = "CPU standing in for a GPU"


def active() -> bool:
    return os.environ.get(GPU_STANDIN_ENV) == "1"


def _is_cuda(value: object) -> bool:
    return (isinstance(value, str) and value.startswith("cuda")) or (
        isinstance(value, torch.device) and value.type == "cuda")


class CudaOnCpu(TorchFunctionMode):
    """Every tensor asked for on a CUDA device is made, or moved, on the CPU."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if _is_cuda(kwargs.get("device")):
            kwargs["device"] = "cpu"
        if func is torch.Tensor.cuda:
            return args[0]
        if func is torch.Tensor.to:
            args = tuple("cpu" if _is_cuda(arg) else arg for arg in args)
        return func(*args, **kwargs)


def _device_name(device: object = None) -> str:
    return NAME


def _unreadable_nvml(*args, **kwargs) -> int:
    raise RuntimeError(f"NVML cannot be read on a {NAME}")


def _host_time(calls: list[Callable[[], object]], repeats: int = 10) -> float:
    """graph_time's counterpart, called as it is: host seconds per call, each call run once whatever
    `repeats` says (the kernels run in Triton's interpreter)."""
    start = time.perf_counter()
    for call in calls:
        call()
    return (time.perf_counter() - start) / len(calls)


def _at_cpu_scale(func: Callable, **limits: Callable[[object], object]) -> Callable:
    """func with the arguments named in `limits` passed through them: GPU-scale sizes become small ones.
    The call is bound to func's signature first, so that a misspelt argument still raises TypeError."""
    signature = inspect.signature(func)

    @functools.wraps(func)
    def scaled(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        for name, limit in limits.items():
            bound.arguments[name] = limit(bound.arguments[name])
        return func(*bound.args, **bound.kwargs)

    return scaled


def _scale_benchmarks() -> None:
    """The benchmarks a GPU branch calls, at a CPU's scale. Modules import them later, from here."""
    from minillm.bench import attention, decode, quant_matmul, random_llama, timing, utilisation

    timing.graph_time = _host_time
    timing.num_copies = lambda nbytes: 1  # no L2 cache to defeat
    timing.copy_bandwidth = _at_cpu_scale(timing.copy_bandwidth, num_bytes=lambda n: min(n, 1 << 22))
    for module in (attention, quant_matmul):  # they imported the GPU's versions
        for name in ("graph_time", "num_copies", "copy_bandwidth"):
            if hasattr(module, name):
                setattr(module, name, getattr(timing, name))
    attention.bench_attention = _at_cpu_scale(
        attention.bench_attention, contexts=lambda c: (32,), batch=lambda b: 1, num_kv_heads=lambda n: 1,
        head_dim=lambda d: 16, prefill_tokens=lambda t: tuple(min(n, 16) for n in t[:1]))
    quant_matmul.bench_quant_matmul = _at_cpu_scale(
        quant_matmul.bench_quant_matmul, shapes=lambda s: ((128, 128),), batches=lambda b: (1,))
    random_llama.write_random_llama = _at_cpu_scale(
        random_llama.write_random_llama, hidden=lambda h: 64, layers=lambda n: 1, heads=lambda n: 2,
        kv_heads=lambda n: 1, intermediate=lambda n: 128, vocab=lambda n: 256)
    decode.bench_decode = _at_cpu_scale(
        decode.bench_decode, batches=lambda b: tuple(b[:2]), context=lambda c: min(c, 16), steps=lambda s: 2,
        prefill_lens=lambda p: tuple(min(n, 16) for n in p[:1]))
    utilisation.busy_while_decoding = _at_cpu_scale(
        utilisation.busy_while_decoding, seconds=lambda s: min(s, 0.2), max_steps=lambda n: min(n, 2))


def activate() -> None:
    """From here on this process takes the GPU branches, on the CPU. Once: later calls change nothing."""
    cuda = torch.cuda
    if cuda.get_device_name is _device_name:
        return
    properties = SimpleNamespace(name=NAME, major=9, minor=0, multi_processor_count=132,
                                 total_memory=os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    free = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
    for name, value in {
        "is_available": lambda: True, "device_count": lambda: 1, "current_device": lambda: 0,
        "get_device_name": _device_name, "get_device_capability": lambda device=None: (9, 0),
        "get_device_properties": lambda device=None: properties,
        "synchronize": lambda device=None: None, "empty_cache": lambda: None,
        "reset_peak_memory_stats": lambda device=None: None, "memory_allocated": lambda device=None: 0,
        "max_memory_allocated": lambda device=None: 0, "memory_reserved": lambda device=None: 0,
        "mem_get_info": lambda device=None: (free, properties.total_memory), "utilization": _unreadable_nvml,
        "device": lambda device=None: contextlib.nullcontext(),
    }.items():
        setattr(cuda, name, value)
    CudaOnCpu().__enter__()  # for the rest of the process
    _scale_benchmarks()
