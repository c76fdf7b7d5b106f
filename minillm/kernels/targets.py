"""What a kernel launcher needs to know of the GPU it launches on, so that its tile sizes fit it.

Triton's interpreter checks none of this: a tile that needs more shared memory than a block may
have compiles and runs on the CPU, and fails to launch on the GPU. A T4 (Colab's GPU) allows 64 KiB
per block, an RTX 30/40 or an L4 99 KiB, an A100 163 KiB, an H100 227 KiB. `kernels/aot.py` compiles
every launch the engine makes for each of them, ahead of time, on a machine with no GPU; there the
target is one of `TARGETS`, set with `aot_target`. Everywhere else it is the device's own.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class GPUSpec:
    name: str
    capability: int  # major * 10 + minor, as Triton names targets: 75 is sm_75
    num_sms: int
    max_shared_bytes: int  # per block, with the opt-in that Triton uses
    clock_ghz: float  # the SMs' boost clock


# One GPU of each architecture the course meets (NVIDIA's CUDA programming guide, table of
# compute capabilities: shared memory per block; boost clocks from NVIDIA's data sheets, the H100's
# for the SXM card).
TARGETS = {t.capability: t for t in (
    GPUSpec("T4", 75, 40, 64 << 10, 1.59),
    GPUSpec("A100", 80, 108, 163 << 10, 1.41),
    GPUSpec("RTX 3090", 86, 82, 99 << 10, 1.695),
    GPUSpec("L4", 89, 58, 99 << 10, 2.04),
    GPUSpec("H100", 90, 132, 227 << 10, 1.98),
)}

_aot: GPUSpec | None = None


@contextlib.contextmanager
def aot_target(target: GPUSpec) -> Iterator[None]:
    """Launchers size their tiles for `target` rather than for the device their tensors are on."""
    global _aot
    previous, _aot = _aot, target
    try:
        yield
    finally:
        _aot = previous


def launch_target(device: torch.device) -> GPUSpec | None:
    """The GPU a launch is for; None in Triton's interpreter (a CPU tensor outside `aot_target`)."""
    if _aot is not None:
        return _aot
    if device.type != "cuda":
        return None
    return _device_target(device.index if device.index is not None else torch.cuda.current_device())


_device_targets: dict[int, GPUSpec] = {}


def _device_target(index: int) -> GPUSpec:
    if index not in _device_targets:
        import triton

        props = torch.cuda.get_device_properties(index)
        device = triton.runtime.driver.active.utils.get_device_properties(index)
        _device_targets[index] = GPUSpec(props.name, props.major * 10 + props.minor, props.multi_processor_count,
                                           device["max_shared_mem"], device["sm_clock_rate"] / 1e6)  # from kHz
    return _device_targets[index]


def shared_bytes_estimate(target: GPUSpec, rows: int, width: int, element_size: int) -> int:
    """An estimate of the shared memory of a kernel that stages `rows` rows of `width` elements (its
    tiles of q, K and V), to rank candidate tiles: Triton adds scratch for layout conversions, up to
    a third more on sm_75 and a fifth more after. It is not a bound: where Triton's software
    pipelining keeps a second stage of the tiles in flight, a kernel takes more (on an H100 the
    ragged kernel's 64 x 64 fp16 tiles take 81,920 bytes, estimated 58,982). What keeps every launch
    within its GPU's limit is `aot.py`, which compiles each one for each GPU and checks the real
    figure (tests/kernels/test_aot.py)."""
    return int(rows * width * element_size * (4 / 3 if target.capability < 80 else 1.2))


def first_fitting(target: GPUSpec, candidates: list, shared_bytes) -> object:
    """The first candidate tile whose shared memory, `shared_bytes(candidate)`, fits a block of `target`."""
    for candidate in candidates:
        if shared_bytes(candidate) <= target.max_shared_bytes:
            return candidate
    raise ValueError(f"no tile of {candidates} fits the {target.max_shared_bytes} bytes of shared memory a block "
                     f"may have on a {target.name}")
