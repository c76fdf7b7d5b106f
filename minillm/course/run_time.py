"""How long each chapter takes to run, and what its CPU run cannot show: a note under the engine's map
at the top of every chapter (`minillm course sync` writes it; tests/course/test_book.py checks it).
Only the standard library, like release.py.

The CPU figures are measured: each chapter's run under nbval in the suite on CI's machine (2 cores,
the shipped `tiny` model), the slower of two runs, rounded up to 5 s. The T4 figures are estimates
until a T4 runs the chapters (scripts/gpu_check.sh's notebooks step records each chapter's time on the
GPU it has): the chapter on SmolLM2-360M, whose download (about 1 GB with its draft model) comes once
per machine on top.
"""

from __future__ import annotations

from typing import NamedTuple


class RunTime(NamedTuple):
    cpu_seconds: int  # measured, see above
    t4_minutes: tuple[int, int]  # estimated range
    cpu_cannot_show: str  # what only a GPU run shows


RUN_TIMES: dict[int, RunTime] = {
    0: RunTime(25, (1, 2), "bf16's rounding (the CPU computes in fp32) and a GPU's time per token"),
    1: RunTime(45, (1, 2), "a GPU's flat step time below its ridge point, where 64 sequences cost about what "
                           "one does"),
    2: RunTime(60, (1, 2), "how many blocks a GPU's memory budget (`gpu_memory_utilization`) buys for a real "
                           "model"),
    3: RunTime(45, (2, 4), "the kernels' speed: Triton's interpreter checks what they compute, not how fast"),
    4: RunTime(45, (2, 4), "launch-bound steps and CUDA graphs, which decide whether continuous batching wins "
                           "on a GPU"),
    5: RunTime(50, (2, 4), "a GPU's draft and verification costs (c and v), which decide whether speculation "
                           "pays"),
    6: RunTime(30, (2, 4), "the bandwidth the INT8 and INT4 kernels save: the CPU runs the reference matmuls"),
    7: RunTime(75, (2, 4), "latencies at a GPU's step times: the curves' shapes carry over, not their "
                           "milliseconds"),
    8: RunTime(60, (3, 6), "CUDA graphs, NVML's busy share and the spec sheets' roofs: the chapter's GPU "
                           "branch"),
    9: RunTime(30, (1, 3), "what the pieces cost as compiled kernels: Triton's interpreter runs them as Python, so "
                           "the CPU times the interpreter"),
}
RUN_TIME_HEADING = "**Run time.**"


def run_time_note(chapter: int) -> str:
    """The chapter's run-time note (chapter: 0 to 9)."""
    t = RUN_TIMES[chapter]
    low, high = t.t4_minutes
    return (f"{RUN_TIME_HEADING} About {t.cpu_seconds} s on a 2-core CPU with the shipped `tiny` model "
            f"(measured); {low} to {high} min on a Colab T4 with SmolLM2-360M (estimated; the model's download on "
            f"first use adds to it). What a CPU run cannot show here: {t.cpu_cannot_show}.")
