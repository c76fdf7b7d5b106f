"""The GPU targets of the open work, read off the benchmarks' JSON: each with its figure, its
threshold and PASS, FAIL or NOT RUN. `scripts/gpu_check.sh` appends this table to its summary.

    python -m minillm.bench.targets OUTDIR     # OUTDIR: where the benchmarks wrote their JSON

Thresholds are for one H100 (on another GPU the figures are still worth reading; the verdicts less so).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

Results = dict[str, dict]  # file stem -> the benchmark's JSON payload


@dataclass(frozen=True)
class Target:
    what: str
    source: str  # the JSON file (stem) the figure comes from
    figure: Callable[[dict], float | None]
    threshold: float
    at_most: bool = False  # True: the figure must not exceed the threshold
    over: str | None = None  # a speedup: the figure read from this file over the same figure from `source`

    def verdict(self, value: float | None) -> str:
        if value is None:
            return "NOT RUN"
        return "PASS" if (value <= self.threshold if self.at_most else value >= self.threshold) else "FAIL"


def _row(payload: dict, **match) -> dict | None:
    return next((r for r in payload["rows"] if all(r.get(k) == v for k, v in match.items())), None)


def _key(payload: dict, *path: str) -> float | None:
    value = payload["summary"]
    for key in path:
        if not isinstance(value, dict) or key not in value:
            return None
        value = value[key]
    return value


def _field(key: str, **match) -> Callable[[dict], float | None]:
    return lambda payload: (_row(payload, **match) or {}).get(key)


def _graphed(key: str) -> Callable[[dict], float | None]:
    """A summary figure of a run that replayed CUDA graphs; a run that could not is not the target's."""
    return lambda payload: _key(payload, key) if any(r.get("mode") == "graphs" for r in payload["rows"]) else None


def _prefill_ms(tokens: int) -> Callable[[dict], float | None]:
    """The prefill step's time, graphed where the run had graphs."""
    return lambda payload: (_row(payload, tokens=tokens, mode="graphs") or _row(payload, tokens=tokens) or {}).get("ms")


def _cost_model_error(payload: dict) -> float | None:
    best = _key(payload, "best_k", "draft_model temp=0.0 batch=1")
    if not best or not best.get("predicted_speedup"):
        return None
    return abs(best["predicted_speedup"] / best["speedup"] - 1)


def _least_int4_speedup(payload: dict) -> float | None:
    rows = [r for r in payload["rows"] if r.get("batch") == 1 and "int4_speedup" in r
            and (r["in_features"], r["out_features"]) != (4096, 4096)]
    return min((r["int4_speedup"] for r in rows), default=None)


TARGETS = [
    Target("batch-1 decode of the 1.1B model, CUDA graphs: share of copy bandwidth", "decode",
           lambda p: _key(p, "batch1_of_copy_bw"), 0.55),
    # The same steps queued each before the one before is read (async scheduling), timed back to back.
    Target("batch-1 decode of the 1.1B model, CUDA graphs and async scheduling: share of copy bandwidth", "decode",
           lambda p: _key(p, "batch1_async_of_copy_bw"), 0.55),
    Target("batch-1 decode of the Llama-2-7B shape, CUDA graphs: share of copy bandwidth", "decode-7b",
           _graphed("batch1_of_copy_bw"), 0.75),
    # Issue 26's bound on the graphs' start-up, for every step shape of the 1.1B decode engine (up to
    # 256 sequences and 2,048 tokens; the JSON has the graph count): "a few seconds" on an H100, as
    # vLLM's start-up capture of its decode sizes takes, with room for the warm-up pass each capture
    # begins with; within 1 GiB, so that a 16 GiB T4 keeps its KV cache beside the 2.2 GB of weights.
    Target("CUDA graph capture of the 1.1B decode engine, every step shape (s)", "decode",
           lambda p: _key(p, "graph_capture_s"), 10, at_most=True),
    Target("CUDA graph memory of the 1.1B decode engine, every step shape (GiB)", "decode",
           lambda p: _key(p, "graph_memory_GiB"), 1, at_most=True),
    Target("launches per decoder layer per decode step, tiny, Triton", "kernels",
           _field("per_layer", kernel="triton"), 10, at_most=True),
    Target("launches per decoder layer per decode step, 1.1B, Triton", "kernels-1b",
           _field("per_layer", kernel="triton"), 10, at_most=True),
    Target("prefill step of a 2,048-token prompt, 1.1B (ms)", "decode", _prefill_ms(2048), 12, at_most=True),
    Target("Triton prefill attention against SDPA at 2,048 tokens (speed ratio)", "attention",
           _field("speed_vs_sdpa", tokens=2048), 0.8),
    Target("Triton prefill attention against SDPA at 4,096 tokens (speed ratio)", "attention",
           _field("speed_vs_sdpa", tokens=4096), 0.8),
    Target("continuous over static batching, 64 requests, 1.1B", "throughput",
           lambda p: _key(p, "continuous_over_static"), 2.0),
    Target("continuous batching over transformers generate, 1.1B", "throughput",
           lambda p: _key(p, "continuous_over_transformers"), 10.0),
    Target("verification step of k = 4 at batch 1, 1.1B, in plain decode steps", "spec-1b",
           _field("v", method="draft=target", k=4, batch=1), 1.15, at_most=True),
    Target("speculative decoding at batch 1, greedy, tiny + tiny-draft (speedup, best k)", "spec",
           lambda p: _key(p, "best_k", "draft_model temp=0.0 batch=1", "speedup"), 1.5),
    Target("speculative decoding at batch 1, greedy, n-gram (speedup, best k)", "spec",
           lambda p: _key(p, "best_k", "ngram temp=0.0 batch=1", "speedup"), 1.5),
    Target("chapter 05's cost model against the measured speedup (relative error)", "spec", _cost_model_error,
           0.15, at_most=True),
    # Issue 27's whole step: every linear layer quantized, the rest of the step (attention, norms,
    # the bf16 output head) as it was, so the fixed cost of each kernel caps the ratio below the bytes'.
    Target("INT4 g128 decode step over the bf16 step, 1.1B, batch 1, CUDA graphs", "decode-int4",
           _graphed("batch1_step_ms"), 1.4, over="decode"),
    Target("INT4 g128 matmul over fp16 at batch 1, least of the three large shapes", "quant", _least_int4_speedup,
           3.0),
    Target("INT4 g128 matmul over fp16 at batch 1, 4096x4096", "quant",
           _field("int4_speedup", in_features=4096, out_features=4096, batch=1), 2.3),
    Target("INT8 matmul over fp16 at batch 1, 4096x14336", "quant",
           _field("int8_speedup", in_features=4096, out_features=14336, batch=1), 1.85),
    Target("INT4 g128 matmul over fp16 at batch 16, 4096x14336", "quant",
           _field("int4_speedup", in_features=4096, out_features=14336, batch=16), 2.0),
]


def load_results(outdir: Path) -> Results:
    results = {}
    for path in sorted(outdir.glob("*.json")):
        payload = json.loads(path.read_text())
        if isinstance(payload, dict) and "rows" in payload and "summary" in payload:
            results[path.stem] = payload
    return results


def evaluate(results: Results) -> list[dict]:
    table = []
    for target in TARGETS:
        payload = results.get(target.source)
        value = target.figure(payload) if payload is not None else None
        if target.over is not None:
            baseline = target.figure(results[target.over]) if target.over in results else None
            value = baseline / value if baseline is not None and value else None
        table.append({"target": target.what, "figure": value, "threshold": ("<= " if target.at_most else ">= ")
                      + f"{target.threshold:g}", "verdict": target.verdict(value),
                      "source": f"{target.source}.json" + (f" over {target.over}.json" if target.over else "")})
    return table


def format_targets(table: list[dict], results: Results) -> str:
    devices = sorted({(p.get("environment", {}).get("cuda") or {}).get("device", "") for p in results.values()} - {""})
    lines = ["", "## Targets", "", f"device: {', '.join(devices) or 'unknown'}", "",
             "| target | figure | threshold | verdict | from |", "| --- | ---: | ---: | --- | --- |"]
    for row in table:
        figure = "" if row["figure"] is None else f"{row['figure']:.3g}"
        lines.append(f"| {row['target']} | {figure} | {row['threshold']} | {row['verdict']} | {row['source']} |")
    counts = {v: sum(r["verdict"] == v for r in table) for v in ("PASS", "FAIL", "NOT RUN")}
    lines += ["", ", ".join(f"{n} {v}" for v, n in counts.items())]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    outdir = Path(argv[0])
    results = load_results(outdir)
    print(format_targets(evaluate(results), results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
