"""`minillm bench spec` on the shipped pair: the rows and the cost model's columns are there and
consistent; the target as its own draft accepts every greedy token. Timings are not asserted."""

from __future__ import annotations

import json

from minillm.cli import main


def test_bench_spec_writes_rows_and_json(tmp_path, capsys):
    out = tmp_path / "spec.json"
    main(["bench", "spec", "--ks", "2", "--batch-sizes", "1", "2", "--temperatures", "0", "--num-tokens", "12",
          "--methods", "draft_model", "draft=target", "--out", str(out)])
    assert "predicted" in capsys.readouterr().out
    rows = json.loads(out.read_text())["rows"]
    assert [(r["method"], r["batch"]) for r in rows] == [
        ("plain", 1), ("draft_model", 1), ("draft=target", 1), ("plain", 2), ("draft_model", 2), ("draft=target", 2)]
    for row in rows[1:]:
        if row["method"] == "plain":
            continue
        assert row["k"] == 2 and row["c"] > 0 and row["v"] > 0 and row["speedup"] > 0
        assert 1 <= row["tokens_per_call"] <= 3
        # The formula for decodes that verified drafts, one token for those that did not (the last
        # token of a request, where max_tokens leaves no room for drafts), over the step's cost.
        cost = row["c"] * 2 + row["v"]
        assert 1 / cost < row["predicted_speedup"] <= row["expected_tokens_per_call"] / cost
    # The target drafting for itself: every greedy token is accepted (up to float ties), k + 1 per call.
    assert all(r["alpha"] > 0.95 for r in rows if r["method"] == "draft=target")
