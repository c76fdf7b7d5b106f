"""Busy is not bound: how busy the device looks while the engine decodes, beside how much of its
memory bandwidth the steps actually use.

`nvidia-smi`'s "GPU utilisation" is the share of a sample period (1/6 s to 1 s) during which at
least one kernel was running: it says nothing of how much of the GPU that kernel used. A decode
step whose kernels run back to back shows about 100% while it moves a fraction of the bandwidth
and leaves the tensor cores idle. On a CPU the counterpart is what `top` shows: the CPU time the
process used over the wall time, per thread.
"""

from __future__ import annotations

import time

import torch

from minillm.bench.engine_steps import decoding
from minillm.llm import LLM


def busy_while_decoding(llm: LLM, batch: int = 1, context: int = 16, seconds: float = 1.0,
                        max_steps: int = 2000) -> dict:
    """Decode steps of `batch` sequences for about `seconds`; returns the steps, ms per step, and
    the device's busy share over them with how it was measured ("busy" is None where it could not
    be read: NVML missing on a CUDA machine)."""
    device = llm.llm_engine.device
    with decoding(llm, batch, context, max_steps) as engine:
        if device.type == "cuda":
            torch.cuda.synchronize()
        start, cpu_start, steps = time.perf_counter(), time.process_time(), 0
        while steps < max_steps and time.perf_counter() - start < seconds:
            engine.step()
            steps += 1
        wall = time.perf_counter() - start
        cpu = time.process_time() - cpu_start
        busy, how = _device_busy(device, cpu, wall)
    return {"steps": steps, "step_ms": wall / steps * 1e3, "busy": busy, "measured_by": how}


def _device_busy(device: torch.device, cpu_seconds: float, wall_seconds: float) -> tuple[float | None, str]:
    if device.type != "cuda":
        threads = torch.get_num_threads()
        return min(1.0, cpu_seconds / (wall_seconds * threads)), f"CPU time / wall time over {threads} threads, as top"
    try:
        # NVML's figure for the last sample period, the very number nvidia-smi prints.
        return torch.cuda.utilization(device) / 100, "NVML GPU utilisation, as nvidia-smi"
    except Exception as error:  # pynvml (nvidia-ml-py) not installed, or no NVML on this machine
        return None, f"NVML unavailable ({type(error).__name__}): run `nvidia-smi dmon -s u` while decoding"
