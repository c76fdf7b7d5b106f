"""The peak memory of a block of code, above what was held when it began: what loading a model costs
at its worst, which is what decides whether it fits, not only what it holds once loaded.

On CUDA, the caching allocator's peak of allocated bytes. On a CPU under Linux, the peak resident set
of the process (VmHWM, which writing 5 to /proc/self/clear_refs resets to the current resident set),
so whatever else the process allocates meanwhile counts too: the first model a process loads, for
one, also brings in the code torch imports on first use (about 0.15 GiB). Elsewhere (macOS, MPS)
nothing is measured and `bytes` stays None.
"""

from __future__ import annotations

from pathlib import Path

import torch

_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")


class PeakMemory:
    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.bytes: int | None = None
        self._start: int | None = None

    def __enter__(self) -> PeakMemory:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self._start = torch.cuda.memory_allocated(self.device)
        elif self.device.type == "cpu":
            try:
                _CLEAR_REFS.write_text("5")
            except OSError:  # not Linux, or a kernel that does not let a process reset it
                return self
            self._start = _status_bytes("VmRSS")
        return self

    def __exit__(self, *exc) -> None:
        if self._start is None:
            return
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            peak = torch.cuda.max_memory_allocated(self.device)
        else:
            peak = _status_bytes("VmHWM")
        self.bytes = max(0, peak - self._start)


def _status_bytes(field: str) -> int:
    for line in _STATUS.read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) * 1024  # given in kB
    raise ValueError(f"{_STATUS} has no {field} line")
