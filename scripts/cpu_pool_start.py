"""What the KV pool costs an engine's start on a CPU: seconds to construct a second LLM("tiny") in a
process, and the resident memory it adds, with the pool as shipped (pages zero-filled by the
operating system as they are first written) and with torch.zeros (every byte written at start).
Each run in a fresh process, the two in turn, three times.

    .venv/bin/python scripts/cpu_pool_start.py
"""

from __future__ import annotations

import subprocess
import sys

CHILD = r'''
import sys, time, torch
import minillm.kv.pool as pool
if sys.argv[1] == "torch.zeros":
    pool.zeros_on_demand = lambda shape, dtype, device: torch.zeros(shape, dtype=dtype, device=device)
from minillm import LLM
def resident():
    return int(next(l for l in open("/proc/self/status") if l.startswith("VmRSS")).split()[1]) * 1024
LLM("tiny")  # imports and first-use costs out of the way
before, start = resident(), time.perf_counter()
llm = LLM("tiny")
print(time.perf_counter() - start, resident() - before)
'''


def main() -> None:
    runs: dict[str, list[tuple[float, int]]] = {"on first write": [], "torch.zeros": []}
    for _ in range(3):
        for mode, rows in runs.items():
            out = subprocess.run([sys.executable, "-c", CHILD, mode], capture_output=True, text=True, check=True)
            seconds, added = out.stdout.split()
            rows.append((float(seconds), int(added)))
    print(f"{'pool zeroed':16} {'start (s), 3 runs':28} resident added (GiB)")
    for mode, rows in runs.items():
        print(f"{mode:16} {', '.join(f'{s:.3f}' for s, _ in rows):28} "
              f"{', '.join(f'{b / 2**30:.2f}' for _, b in rows)}")


if __name__ == "__main__":
    main()
