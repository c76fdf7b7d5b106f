"""`minillm bench step`: every phase of a decode step is timed, once, and the phases fit in the step;
--baseline measures another revision's engine the same way, in the same run."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
from test_cli import minillm

import minillm as package
from minillm.bench import revision, step
from minillm.bench.step import PhaseClock, bench_step, timed_phases

REPO = Path(__file__).resolve().parents[2]
LAYOUTS = ({"schedule", "prepare", "execute", "sample", "wait", "update"},  # a step read by get_output
           {"schedule", "prepare", "execute", "sample", "update"},  # before: sample read the tokens
           {"schedule", "runner"},  # before: ModelRunner.run for prepare, execute and sample; update in step()
           {"schedule", "propose", "prepare", "execute", "verify", "update"})  # speculating


def check_phases(row: dict) -> None:
    assert set(row["phases"]) in LAYOUTS, row["phases"]
    assert all(row[f"{phase}_us"] > 0 for phase in [*row["phases"], "runner"]), row
    assert row["other_us"] >= 0, row  # the phases add up to the step's time at most
    assert 0 < row["median_us"] <= row["p90_us"] and row["tokens_per_s"] > 0


def test_every_phase_of_a_decode_step_is_timed():
    rows, summary = bench_step("tiny", [1, 4], steps=4, device="cpu")
    assert [(row["version"], row["batch"]) for row in rows] == [("working tree", 1), ("working tree", 4)]
    for row in rows:
        assert row["phases"] == ["schedule", "prepare", "execute", "sample", "wait", "update"]
        check_phases(row)
        assert row["tokens_per_step"] == row["batch"]  # a token per request and step
    assert summary["vs_before"] == {}


@pytest.mark.parametrize("config", [{"model": "tiny-draft", "num_speculative_tokens": 3},
                                    {"method": "ngram", "num_speculative_tokens": 3}], ids=["draft", "ngram"])
def test_a_speculative_step_is_timed_by_its_own_phases(config):
    """Drafting and verifying in place of sampling; its tokens per step counted, up to k + 1 a request."""
    rows, _ = bench_step("tiny", [1, 2], steps=4, device="cpu", speculative_config=config)
    for row in rows:
        assert row["phases"] == ["schedule", "propose", "prepare", "execute", "verify", "update"]
        check_phases(row)
        assert row["batch"] <= row["tokens_per_step"] <= row["batch"] * 4


def test_a_phase_called_inside_another_counts_once(monkeypatch):
    now = [0.0]
    monkeypatch.setattr(step, "perf_counter", lambda: now[0])

    class Runner:
        def prepare(self):
            now[0] += 1

        def execute(self):
            now[0] += 2
            self.sample()

        def sample(self):
            now[0] += 4

    class Scheduler:
        def schedule(self):
            now[0] += 8

    engine = SimpleNamespace(scheduler=Scheduler(), model_runner=Runner())
    clock = PhaseClock()
    with timed_phases(engine, clock) as phases:
        engine.scheduler.schedule()
        engine.model_runner.prepare()
        engine.model_runner.execute()
    assert phases == ["schedule", "prepare", "execute", "sample"]
    assert clock.lap(phases) == {"schedule": 8, "prepare": 1, "execute": 2, "sample": 4}
    assert not vars(engine.model_runner) and not vars(engine.scheduler)  # the classes' methods again


@pytest.mark.slow
def test_baseline_measures_the_revision_in_a_temporary_worktree(tmp_path):
    out = tmp_path / "step.json"
    result = minillm("bench", "step", "--batch-sizes", "1", "4", "--steps", "4", "--device", "cpu",
                     "--baseline", "HEAD", "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert "x before" in result.stdout
    payload = json.loads(out.read_text())
    rows = payload["rows"]
    before = rows[0]["version"]
    assert before.startswith("HEAD (")
    assert [(row["version"], row["batch"]) for row in rows] == [
        (before, 1), ("working tree", 1), (before, 4), ("working tree", 4)]
    for row in rows:
        check_phases(row)
    for old, new in zip(rows[::2], rows[1::2]):
        assert new["vs_before"] == pytest.approx(new["median_us"] / old["median_us"])
    # The baseline imported minillm from its worktree, since removed; this tree measured itself.
    imported = payload["summary"]["minillm"]
    tree = Path(imported[before]).parents[1]
    assert not tree.resolve().is_relative_to(REPO) and not tree.exists()
    worktrees = subprocess.run(["git", "-C", str(REPO), "worktree", "list"], capture_output=True, text=True,
                               check=True).stdout
    assert str(tree) not in worktrees
    assert Path(imported["working tree"]).resolve() == Path(package.__file__).resolve()


def test_baseline_can_be_a_tree_exported_for_a_machine_without_git_history(tmp_path, monkeypatch):
    """A GPU machine's copy of the checkout has no git history: the before is a folder that holds the
    revision's minillm (scripts/gpu_wheels.sh exports it), used as it is and left as it was."""
    tree = tmp_path / "baseline-abc1234"
    (tree / "minillm").mkdir(parents=True)
    (tree / "minillm" / "__init__.py").write_text("")
    ran = []

    def run_here(folder: Path, script: Path, config: str, out: str) -> None:
        ran.append(folder)
        Path(out).write_text(json.dumps(step.measure(**json.loads(config))))

    monkeypatch.setattr(revision, "run_against", run_here)
    monkeypatch.setattr(revision, "_git", lambda *args: pytest.fail(f"git asked: {args}"))
    rows, summary = bench_step("tiny", [1], steps=2, device="cpu", baseline=str(tree))
    assert ran == [tree.resolve()]
    assert [row["version"] for row in rows] == [f"{tree} (baseline-abc1234)", "working tree"]
    assert set(summary["vs_before"]) == {"1"}
    assert sorted(p.relative_to(tree).as_posix() for p in tree.rglob("*")) == ["minillm", "minillm/__init__.py"]


def test_async_scheduling_is_timed_by_the_same_phases():
    """Each step queued before the one before is read: the phases of one call of step() are the next
    step's schedule to sample and the step before's wait and update, a token per request still."""
    rows, _ = bench_step("tiny", [2], steps=4, device="cpu", async_scheduling=True)
    assert rows[0]["phases"] == ["schedule", "prepare", "execute", "sample", "wait", "update"]
    check_phases(rows[0])
    assert rows[0]["tokens_per_step"] == 2
