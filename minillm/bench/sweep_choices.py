"""What the GPU check's sweeps say to change: in each sweep, for every group of rows timed on the
same work, the fastest variant against the shipped one, so that a short loan of a GPU ends with the
choice beside the table (`scripts/gpu_check.sh` appends it to summary.md).

    python -m minillm.bench.sweep_choices OUTDIR     # reads attention.json and quant-sweep.json

Each variant was timed once, so a lead under MARGIN is reported and not acted on: the same run on
another machine of the same kind has moved figures by that much. A few variants time the shipped
launch again under another name (the quantized sweep's split-K 8 where 8 slices are chosen anyway,
or a tile that a half2 row repeats); a "change" to one of those is noise past the margin.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

MARGIN = 0.05  # a variant must beat the shipped one by 5% to be worth a change


def attention_choices(payload: dict) -> list[dict]:
    """Per prompt length of `bench attention --tilings`: the launcher's own tiling (its prefill row)
    against the fastest tiling of the sweep."""
    shipped = {r["tokens"]: r["triton_ms"] for r in payload["rows"] if "tokens" in r and "triton_ms" in r}
    choices = []
    for tokens, ms in sorted(shipped.items()):
        timed = [r for r in payload["summary"].get("tilings", []) if r["tokens"] == tokens and "triton_ms" in r]
        if timed:
            best = min(timed, key=lambda r: r["triton_ms"])
            choices.append(_choice(f"ragged attention, {tokens:,} tokens", ms, f"tiling {best['tiling']}",
                                   best["triton_ms"]))
    return choices


def _is_shipped(row: dict) -> bool:
    """The quantized sweep's row of the launcher's own choices: named "shipped" (as what is varied or
    as its value), or the split-K row that leaves the slices as chosen (the one-row int4 kernel's)."""
    return "shipped" in (row["varied"], row["value"]) or (row["varied"], row["value"]) == ("split-K", "as chosen")


def quant_choices(payload: dict) -> list[dict]:
    """Per weights, rows and layer shape of `scripts/quant_gemv_sweep.py`: the shipped launch against
    the fastest variant (F.linear's rows have no variants)."""
    groups: dict[tuple, list[dict]] = {}
    for row in payload["rows"]:
        groups.setdefault((row["kind"], row["rows"], row["shape"]), []).append(row)
    choices = []
    for (kind, rows, shape), timed in groups.items():
        shipped = next((r for r in timed if _is_shipped(r)), None)
        variants = [r for r in timed if r is not shipped]
        if shipped is None or not variants:
            continue
        best = min(variants, key=lambda r: r["us"])
        label = f"{best['varied']} {best['value']}".strip()
        choices.append(_choice(f"{kind}, {rows} row{'s' * (rows > 1)}, {shape}", shipped["us"], label, best["us"]))
    return choices


def _choice(work: str, shipped: float, best_name: str, best: float) -> dict:
    gain = shipped / best
    return {"work": work, "shipped_time": shipped, "fastest": best_name, "fastest_time": best, "gain": gain,
            "verdict": "change" if gain > 1 + MARGIN else "keep"}


def format_choices(outdir: Path) -> str:
    """The markdown section of the sweeps found in outdir ("" where there is none)."""
    sections = []
    for name, read, unit in (("attention", attention_choices, "ms"), ("quant-sweep", quant_choices, "µs")):
        path = outdir / f"{name}.json"
        choices = read(json.loads(path.read_text())) if path.is_file() else []
        if not choices:
            continue
        lines = [f"### {name}.json", "",
                 f"| work | shipped ({unit}) | fastest variant | {unit} | shipped / fastest | |",
                 "| --- | ---: | --- | ---: | ---: | --- |"]
        lines += [f"| {c['work']} | {c['shipped_time']:.4g} | {c['fastest']} | {c['fastest_time']:.4g} | "
                  f"{c['gain']:.2f} | {c['verdict']} |" for c in choices]
        sections.append("\n".join(lines))
    if not sections:
        return ""
    header = ["", "## What the sweeps suggest", "",
              f"Each variant timed once: \"change\" where it beats the shipped launch by more than {MARGIN:.0%}."]
    return "\n".join(header) + "\n\n" + "\n\n".join(sections)


def main(argv: list[str]) -> int:
    print(format_choices(Path(argv[0])))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
