"""What each of the learner's pieces costs in the capstone's engine: the workload timed with the engine's
own pieces, with every seam of the learner's, and with the seams of one piece alone, in rounds (each
round times every configuration once, so that a busy spell of the machine falls on all of them). A
piece's cost is its time over the engine's own in the same round, decided with a margin from the
rounds' spread, or called too noisy (minillm/bench/verdict.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from minillm.bench.verdict import NOISY_NOTE, Verdict, estimate, verdict
from minillm.grading.capstone_pieces import Pieces
from minillm.grading.checks_capstone import Seam, assembled, serve
from minillm.llm import LLM

SAME_WITHIN = 1.1  # a 10% margin either way for "slower", "faster" and "the same"
# The seams of one piece go together (exercise 06's weights are many seams, and the matmul that reads them).
GROUPS = {"sampler": "sample (00)", "append_slots": "append_slots, free, allocate (02)",
          "free": "append_slots, free, allocate (02)", "allocate": "append_slots, free, allocate (02)",
          "paged_decode_attention": "paged_decode (03)", "admit": "admit (04)", "token_budget": "token_budget (07)",
          "greedy_accept": "greedy_accept, stochastic_accept (05)",
          "stochastic_accept": "greedy_accept, stochastic_accept (05)",
          "dequantize_int4": "quantize_int4, pack_int4, dequantize_int4 (06)",
          "qweight": "quantize_int4, pack_int4, dequantize_int4 (06)",
          "scales": "quantize_int4, pack_int4, dequantize_int4 (06)",
          "zeros": "quantize_int4, pack_int4, dequantize_int4 (06)",
          "ops": "quantize_int4, pack_int4, dequantize_int4 (06)", "fused_add_rms_norm": "fused_add_rms_norm (08)"}
ALL = "all of them (your engine)"


def by_piece(seams: list[Seam]) -> dict[str, list[Seam]]:
    """The seams grouped by the piece they plug in (an attribute the table does not know is its own group)."""
    groups: dict[str, list[Seam]] = {}
    for seam in seams:
        groups.setdefault(GROUPS.get(seam[1], f"{type(seam[0]).__name__}.{seam[1]}"), []).append(seam)
    return groups


def piece_costs(seams: Callable[[LLM, Pieces], list[Seam]], pieces: Pieces, llm: LLM,
                rounds: int = 3) -> dict[str, list[float]]:
    """Seconds of each round's run of the workload: the engine's own pieces ("engine"), each piece alone, all."""
    plugged = seams(llm, pieces)
    configurations = {"engine": [], **by_piece(plugged), ALL: plugged}
    times: dict[str, list[float]] = {name: [] for name in configurations}
    with assembled(llm, []):
        serve(llm, "a warm-up")  # the first run pays one-off costs
    for _ in range(rounds):
        for name, chosen in configurations.items():
            with assembled(llm, chosen):
                start = time.perf_counter()
                serve(llm, name)
                times[name].append(time.perf_counter() - start)
    return times


def cost_line(piece: str, times: list[float], engine: list[float]) -> str:
    """One row of the table: the piece's time over the engine's own, round by round, and what it says."""
    ratio = estimate([t / e for t, e in zip(times, engine, strict=True)])
    if verdict(ratio, SAME_WITHIN) is Verdict.ABOVE:
        said = "slower"
    elif verdict(ratio, 1 / SAME_WITHIN) is Verdict.BELOW:
        said = "faster"
    elif verdict(ratio, SAME_WITHIN) is Verdict.BELOW and verdict(ratio, 1 / SAME_WITHIN) is Verdict.ABOVE:
        said = f"the same, within {SAME_WITHIN - 1:.0%}"
    else:
        said = NOISY_NOTE
    return f"{piece:48} {ratio.factor():48} {said}"


def cost_table(times: dict[str, list[float]]) -> str:
    engine = times["engine"]
    header = f"{'your piece, in the engine alone':48} {'time / the engine with its own pieces':48} verdict"
    return "\n".join([header, *(cost_line(name, t, engine) for name, t in times.items() if name != "engine")])
