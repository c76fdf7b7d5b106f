"""One decode step under `torch.profiler`: where its time goes, op by op and in groups.

The profiler records every aten op a step calls (and on a CUDA GPU every kernel the GPU ran and
every call into the CUDA runtime). An op's *self* time excludes the ops it called, so the self
times of a step's ops, plus the Python between them, add up to the step. Each step runs inside a
`record_function` label: the label's self time is exactly that Python, the engine's own code
between ops (scheduling, building inputs, bookkeeping).

The groups answer the chapter's question: how much of a step is the work the roofline counts
(matmuls, attention), and how much is everything around it (the Python, each small op's dispatch,
on a GPU the launches)? On a CPU the ops' self times are their computation; on a GPU an op's CPU
time is only its dispatch and launch, and the kernels' own time is the device column.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from minillm.bench.engine_steps import decoding
from minillm.bench.verdict import MIN_SAMPLES, NOISY_NOTE, Verdict, estimate, verdict
from minillm.llm import LLM

STEP_LABEL = "minillm.step"
MATMUL, ATTENTION, OTHER = "matmuls", "attention", "other ops"
RUNTIME, HOST = "CUDA runtime", "Python between ops"
GROUPS = (MATMUL, ATTENTION, OTHER, RUNTIME, HOST)
WORK_MOST = 0.5  # the conclusion: matmuls and attention take more (or less) than half of a step
# Attention first: a fused attention kernel's name may also say "cutlass" or "gemm".
_ATTENTION = re.compile(r"attention|attn|flash|fmha|decode_partition|merge_partitions", re.IGNORECASE)
_MATMUL = re.compile(r"aten::(mm|addmm|bmm|matmul|linear|_int_mm)$|gemm|gemv|matmul|cublas|cutlass|xmma",
                     re.IGNORECASE)
_RUNTIME = re.compile(r"^cuda[A-Z]|^cu[A-Z]")  # cudaLaunchKernel, cuLaunchKernelEx, cudaStreamSynchronize


def op_group(name: str) -> str:
    """The group of a profiler event, by its name."""
    if name == STEP_LABEL:
        return HOST
    if _RUNTIME.match(name):
        return RUNTIME
    if _ATTENTION.search(name):
        return ATTENTION
    if _MATMUL.search(name):
        return MATMUL
    return OTHER


@dataclass(frozen=True)
class OpRow:
    """One op (or kernel) of the profile, per step: calls, and self time on the CPU and the device."""

    name: str
    group: str
    calls: float
    cpu_us: float
    device_us: float


@dataclass(frozen=True)
class StepProfile:
    """The ops of a few decode steps, per step; `step_us` is a step's wall time."""

    step_us: float
    on_device: bool  # the rows have device times (a CUDA GPU)
    rows: tuple[OpRow, ...]

    def by_group(self, side: str) -> dict[str, float]:
        """µs per step in each group, on `side` ("cpu" or "device")."""
        if side not in ("cpu", "device"):
            raise ValueError(f"side: must be 'cpu' or 'device', got {side!r}")
        totals = dict.fromkeys(GROUPS, 0.0)
        for row in self.rows:
            totals[row.group] += row.cpu_us if side == "cpu" else row.device_us
        return totals

    def work_share(self) -> float:
        """The share of a step's wall time that matmuls and attention took: their kernels' time on a
        GPU, their computation on a CPU."""
        groups = self.by_group("device" if self.on_device else "cpu")
        return (groups[MATMUL] + groups[ATTENTION]) / self.step_us


@contextmanager
def _steady_threads(device: torch.device) -> Iterator[None]:
    # On a CPU one thread: a small model's ops gain nothing from two, and two threads wait for each
    # other at every op when other programs share the cores, which would bill that wait to the ops.
    threads = torch.get_num_threads()
    if device.type != "cuda":
        torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def profile_steps(llm: LLM, batch: int = 1, context: int = 16, steps: int = 3,
                  rounds: int = MIN_SAMPLES) -> list[StepProfile]:
    """`rounds` profiles of `steps` decode steps each, of `batch` sequences whose prompts have
    `context` tokens, on the engine as it is configured (eager or with CUDA graphs)."""
    if steps < 1:
        raise ValueError(f"steps: must be at least 1, got {steps}")
    if rounds < MIN_SAMPLES:
        raise ValueError(f"rounds: need at least {MIN_SAMPLES} profiles to judge their spread, got {rounds}")
    cuda = llm.llm_engine.device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    profiles = []
    with _steady_threads(llm.llm_engine.device), decoding(llm, batch, context, rounds * steps + 1) as engine:
        engine.step()  # warm: the first step of this batch size allocates and may compile
        for _ in range(rounds):
            with profile(activities=activities) as prof:
                for _ in range(steps):
                    with record_function(STEP_LABEL):
                        engine.step()  # ends reading the sampled tokens back: the device is done too
            profiles.append(_step_profile(prof, steps, cuda))
    return profiles


def _step_profile(prof: profile, steps: int, cuda: bool) -> StepProfile:
    # The label's own CPU events only: on a GPU it is also drawn on the device's timeline, as an
    # annotation that spans the step's kernels but is none of them. Each time on its own side: a
    # CPU op also carries the time of the kernels it launched, which the kernels' rows hold already.
    labels = [e for e in prof.events() if e.name == STEP_LABEL and e.device_type == torch.autograd.DeviceType.CPU]
    rows = [OpRow(STEP_LABEL, HOST, 1.0, sum(e.self_cpu_time_total for e in labels) / steps, 0.0)]
    for e in prof.key_averages():
        if e.key != STEP_LABEL:
            on_cpu = e.device_type == torch.autograd.DeviceType.CPU
            rows.append(OpRow(e.key, op_group(e.key), e.count / steps, e.self_cpu_time_total / steps if on_cpu else 0.0,
                              0.0 if on_cpu or not cuda else e.self_device_time_total / steps))
    return StepProfile(sum(e.cpu_time_total for e in labels) / steps, cuda, tuple(rows))


def merged(profiles: Sequence[StepProfile]) -> StepProfile:
    """The mean of several profiles, op by op."""
    if not profiles:
        raise ValueError("profiles: need at least one")
    totals: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])
    for p in profiles:
        for row in p.rows:
            for i, value in enumerate((row.calls, row.cpu_us, row.device_us)):
                totals[row.name][i] += value
    n = len(profiles)
    rows = tuple(OpRow(name, op_group(name), calls / n, cpu / n, device / n)
                 for name, (calls, cpu, device) in totals.items())
    return StepProfile(sum(p.step_us for p in profiles) / n, profiles[0].on_device, rows)


def step_table(profiles: Sequence[StepProfile], top: int = 10) -> str:
    """The `top` ops by self time, then the groups, per step. On a GPU an op's time is on one side,
    the CPU's (an aten op, a runtime call, the Python) or the GPU's (a kernel), and both columns show."""
    mean = merged(profiles)
    gpu = mean.on_device
    width = 44
    lines = [f"{'op':{width}} {'group':18} {'calls':>6} {'CPU µs':>9}" + (f" {'GPU µs':>9}" if gpu else "")
             + f" {'of step':>8}"]
    for r in sorted(mean.rows, key=lambda r: r.cpu_us + r.device_us, reverse=True)[:top]:
        name = r.name if len(r.name) <= width else r.name[:width - 3] + "..."
        lines.append(f"{name:{width}} {r.group:18} {r.calls:6.0f} {r.cpu_us:9,.0f}"
                     + (f" {r.device_us:9,.0f}" if gpu else "") + f" {(r.cpu_us + r.device_us) / mean.step_us:8.0%}")
    lines.append(f"by group, µs per step (a step took {mean.step_us:,.0f} µs of wall time):")
    cpu, device = mean.by_group("cpu"), mean.by_group("device")
    for group in GROUPS:
        if cpu[group] or device[group]:
            lines.append(f"  {group:20} CPU {cpu[group]:9,.0f} ({cpu[group] / mean.step_us:.0%})" + (
                f"   GPU {device[group]:9,.0f} ({device[group] / mean.step_us:.0%})" if gpu else ""))
    return "\n".join(lines)


def where_the_time_goes(profiles: Sequence[StepProfile]) -> str:
    """Whether matmuls and attention took most of a step, decided from every profile's share with
    the margin of their spread, or the note that the machine was too busy to tell."""
    share = estimate([p.work_share() for p in profiles])
    where = "kernels on the GPU" if profiles[0].on_device else "computation on the CPU"
    said = (f"matmuls and attention took {share.median:.0%} of a step as {where} (middle half of the "
            f"profiles {share.low:.0%} to {share.high:.0%})")
    match verdict(share, WORK_MOST):
        case Verdict.ABOVE:
            return (f"{said}: most of the step is the work the roofline counts; only fewer bytes or flops per "
                    "token, or more tokens per weight read, make it much faster")
        case Verdict.BELOW:
            return (f"{said}: most of the step is everything around them, the engine's Python, a dispatch for "
                    "each small op and, on a GPU, a launch for each kernel; that is why a batch-1 step sits so "
                    "far below the roof, and what CUDA graphs and fused kernels remove")
    return f"{said}: {NOISY_NOTE}"
