"""The GPU check's "what the sweeps suggest": the shipped launch against the fastest variant of each
group, read from the JSON the sweeps write."""

from __future__ import annotations

import json

from minillm.bench.sweep_choices import MARGIN, attention_choices, format_choices, quant_choices


def _attention() -> dict:
    rows = [{"batch": 8, "context": 4096, "ms": 0.06},  # a decode row: no prompt, not a choice
            {"tokens": 2048, "triton_ms": 0.143, "sdpa_ms": 0.093},
            {"tokens": 4096, "triton_ms": 0.454, "sdpa_ms": 0.277}]
    tilings = [{"tokens": 2048, "tiling": "64x32x4x5", "triton_ms": 0.120},
               {"tokens": 2048, "tiling": "64x64x4x5", "triton_ms": 0.130},
               {"tokens": 2048, "tiling": "128x64x8x5", "error": "OutOfResources: shared memory"},
               {"tokens": 4096, "tiling": "64x32x4x5", "triton_ms": 0.450}]
    return {"rows": rows, "summary": {"tilings": tilings}}


def _quant() -> dict:
    def row(kind, rows, varied, value, us, shape="4096x14336"):
        return {"kind": kind, "rows": rows, "varied": varied, "value": value, "shape": shape, "us": us}

    return {"device": "H100", "rows": [
        row("fp16", 1, "shipped", "", 43.7),  # F.linear: nothing to choose
        row("int4", 1, "split-K", "4", 25.0), row("int4", 1, "split-K", "as chosen", 22.6),
        row("int4", 1, "tile", "128x128x4 (1 group)", 20.0), row("int4", 1, "half2", "off", 30.0),
        row("int4", 1, "split-K", "as chosen", 29.1, "8192x8192"),
        row("int4", 1, "tile", "64x128x2", 28.5, "8192x8192"),
        row("int4", 16, "tile", "shipped", 60.0), row("int4", 16, "stages", "4", 50.0),
        row("int8", 2, "shipped", "", 40.0), row("int8", 2, "split-K", "1", 41.0)]}


def test_attention_compares_the_launchers_tiling_with_the_fastest_timed_one():
    two_k, four_k = attention_choices(_attention())
    assert two_k["work"] == "ragged attention, 2,048 tokens" and two_k["fastest"] == "tiling 64x32x4x5"
    assert two_k["gain"] == 0.143 / 0.120 and two_k["verdict"] == "change"
    # 0.454 against 0.450: a lead within the margin of one run is not acted on
    assert four_k["fastest"] == "tiling 64x32x4x5" and four_k["verdict"] == "keep"


def test_quant_finds_each_groups_shipped_row_and_its_fastest_variant():
    by_work = {c["work"]: c for c in quant_choices(_quant())}
    assert set(by_work) == {"int4, 1 row, 4096x14336", "int4, 1 row, 8192x8192", "int4, 16 rows, 4096x14336",
                            "int8, 2 rows, 4096x14336"}
    one_row = by_work["int4, 1 row, 4096x14336"]
    assert (one_row["shipped_time"], one_row["fastest"], one_row["verdict"]) == (22.6, "tile 128x128x4 (1 group)",
                                                                                  "change")
    assert by_work["int4, 1 row, 8192x8192"]["verdict"] == "keep"  # 29.1 / 28.5 = 1.02 < 1 + MARGIN
    assert by_work["int4, 16 rows, 4096x14336"]["fastest"] == "stages 4"
    slower = by_work["int8, 2 rows, 4096x14336"]
    assert slower["gain"] < 1 and slower["verdict"] == "keep"
    assert 29.1 / 28.5 < 1 + MARGIN < 22.6 / 20.0


def test_the_summary_section_lists_both_sweeps_and_says_nothing_without_them(tmp_path):
    assert format_choices(tmp_path) == ""
    (tmp_path / "attention.json").write_text(json.dumps(_attention()))
    (tmp_path / "quant-sweep.json").write_text(json.dumps(_quant()))
    text = format_choices(tmp_path)
    assert "## What the sweeps suggest" in text and "### attention.json" in text and "### quant-sweep.json" in text
    assert "| ragged attention, 2,048 tokens | 0.143 | tiling 64x32x4x5 | 0.12 | 1.19 | change |" in text
    assert "| int4, 1 row, 4096x14336 | 22.6 | tile 128x128x4 (1 group) | 20 | 1.13 | change |" in text
