"""`minillm bench spec` on the shipped pair: the rows and the cost model's columns are there and
consistent; the target as its own draft accepts every greedy token. Timings are not asserted."""

from __future__ import annotations

import json

from minillm.bench.spec import _serve_in_groups, _summary
from minillm.cli import main


def test_bench_spec_writes_rows_and_json(tmp_path, capsys):
    out = tmp_path / "spec.json"
    main(["bench", "spec", "--ks", "2", "--batch-sizes", "1", "2", "--temperatures", "0", "--num-tokens", "12",
          "--methods", "draft_model", "draft=target", "--out", str(out)])
    assert "predicted" in capsys.readouterr().out
    payload = json.loads(out.read_text())
    rows = payload["rows"]
    assert set(payload["summary"]["stops_paying_at_batch"]) == {"draft_model temp=0.0", "draft=target temp=0.0"}
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
        assert 1 / cost < row["count_over_cost"] <= row["tokens_per_call"] / cost
    # The target drafting for itself: every greedy token is accepted (up to float ties), k + 1 per call.
    assert all(r["alpha"] > 0.95 for r in rows if r["method"] == "draft=target")


def test_the_summary_names_the_batch_where_speculation_stops_paying():
    rows = [{"method": "plain", "temperature": 0.0, "batch": b, "k": 0, "speedup": 1.0} for b in (1, 4, 16)]
    speedups = {("a", 1, 2): 1.5, ("a", 1, 4): 1.8, ("a", 4, 2): 0.9, ("a", 4, 4): 1.1, ("a", 16, 2): 0.8,
                ("a", 16, 4): 0.7, ("b", 1, 2): 1.2, ("b", 4, 2): 1.1, ("b", 16, 2): 1.05}
    rows += [{"method": m, "temperature": 0.0, "batch": b, "k": k, "speedup": x, "predicted_speedup": None}
             for (m, b, k), x in speedups.items()]
    summary = _summary(rows)
    # "a" still pays at batch 4 with its best k (1.1), not at 16; "b" pays at every batch measured.
    assert summary["stops_paying_at_batch"] == {"a temp=0.0": 16, "b temp=0.0": None}
    assert summary["best_k"]["a temp=0.0 batch=4"] == {"k": 4, "speedup": 1.1, "predicted_speedup": None}


def test_requests_are_served_in_groups_of_the_batch_size_each_after_the_one_before():
    """Batch 1 is several requests one after another (BATCH1_REQUESTS), not one request alone."""

    class Recorded:
        def __init__(self):
            self.calls = []

        def generate(self, prompts, params, use_tqdm):
            self.calls.append(prompts)
            return [f"out {p}" for p in prompts]

    llm = Recorded()
    assert _serve_in_groups(llm, ["a", "b", "c", "d"], [0, 1, 2, 3], 1) == ["out a", "out b", "out c", "out d"]
    assert llm.calls == [["a"], ["b"], ["c"], ["d"]]
    llm.calls.clear()
    _serve_in_groups(llm, ["a", "b", "c"], [0, 1, 2], 2)
    assert llm.calls == [["a", "b"], ["c"]]
