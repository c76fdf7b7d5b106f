"""`minillm-grade`: run learners' notebooks and score their check cells.

    minillm-grade submissions/*.ipynb --release exercises/01_kv_cache.ipynb --report grades.csv --jobs 4

Each submission runs in a fresh kernel, driven by its own child process with its own wall-clock
limit, so a crash, an exception or an endless loop costs that submission only; `--jobs` of them at
a time. Submissions are
untrusted code: run this inside a container (see INSTRUCTORS.md).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from minillm.grading.notebook import Check, checks, read, write
from minillm.grading.report import Row, summary, write_csv
from minillm.grading.submission import prepare

# The child stops at its own deadline and shuts its kernel down; this margin is for kernel start-up
# and shutdown. Past it, the child's process group is killed (its kernel, which runs in a session
# of its own, exits when it sees its parent gone).
GRACE_SECONDS = 30


def grade_submission(path: Path, release: list[Check] | None, timeout: float) -> list[Row]:
    try:
        nb, expected = prepare(path, release)
    except Exception as e:  # not JSON, not a notebook, unreadable: the learner's loss alone
        why = f"not run: could not read the notebook ({type(e).__name__}: {e})"
        return [Row(str(path), c.grade_id, False, 0.0, c.points, why) for c in release or []] or \
            [Row(str(path), "(notebook)", False, 0.0, 0.0, why)]
    if not expected:
        return [Row(str(path), "(notebook)", False, 0.0, 0.0,
                    "not run: the notebook has no check cells (--release would restore them)")]
    with tempfile.TemporaryDirectory(prefix="minillm-grade-") as tmp:
        notebook, results, log = Path(tmp, "submission.ipynb"), Path(tmp, "results.jsonl"), Path(tmp, "log")
        write(nb, notebook)
        # The kernel's temporary files too go with the folder: a kernel killed at its deadline, or
        # one that never cleans up, would otherwise leave them on the grading machine's disk.
        scratch = Path(tmp, "tmp")
        scratch.mkdir()
        killed = _run_child(notebook, results, log, timeout, path.resolve().parent, scratch)
        records = _read_records(results)
        stderr_tail = (log.read_text(errors="replace").strip().splitlines() or ["no output"])[-1]
    verdicts: dict[str, dict] = {}
    for record in records:
        if "grade_id" in record:
            verdicts.setdefault(record["grade_id"], record)
        elif "error" in record:  # no points ride on the cell: a line for the instructor, not a row
            print(f"{path}: cell {record['cell']} raised {record['error']}, outside the checks", file=sys.stderr)
    end = next((r for r in records if "end" in r), {})
    if killed or end.get("end") == "timeout":
        unfinished = f"timeout after {timeout:g}s"
    elif end.get("end") == "kernel died":
        unfinished = f"not run: the kernel died in cell {end['cell']} (a crash, an exit, or out of memory)"
    else:
        unfinished = f"not run: the grading process ended early ({stderr_tail})"
    rows = []
    for check in expected:
        verdict = verdicts.get(check.grade_id)
        if verdict is None:
            rows.append(Row(str(path), check.grade_id, False, 0.0, check.points, unfinished))
        else:
            rows.append(Row(str(path), check.grade_id, verdict["passed"],
                            check.points if verdict["passed"] else 0.0, check.points, verdict["message"]))
    return rows


def _read_records(results: Path) -> list[dict]:
    records = []
    for line in results.read_text(errors="replace").splitlines() if results.exists() else []:
        try:
            record = json.loads(line)
        except ValueError:  # a line cut short when the child was killed
            continue
        if isinstance(record, dict):
            records.append(record)
    return records


def _run_child(notebook: Path, results: Path, log: Path, timeout: float, cwd: Path, scratch: Path) -> bool:
    """Run the notebook in a child process, its temporary files in `scratch`; True if it had to be killed."""
    command = [sys.executable, "-m", "minillm.grading.run_notebook", str(notebook), str(results),
               "--timeout", str(timeout), "--cwd", str(cwd)]
    with log.open("wb") as stderr:
        child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=stderr, start_new_session=True,
                                 env={**os.environ, "TMPDIR": str(scratch)})
        try:
            child.wait(timeout=timeout + GRACE_SECONDS)
            return False
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
            return True


def _grade_all(paths: list[Path], release: list[Check] | None, timeout: float, jobs: int) -> list[list[Row]]:
    """Each submission's rows, in the order given; up to `jobs` children run at once (threads only
    wait for them), and each submission's limit is its own, however many run beside it."""
    def one(numbered: tuple[int, Path]) -> list[Row]:
        i, path = numbered
        print(f"[{i}/{len(paths)}] {path}", file=sys.stderr, flush=True)
        return grade_submission(path, release, timeout)

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        return list(pool.map(one, enumerate(paths, start=1)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="minillm-grade", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("submissions", nargs="+", type=Path, metavar="SUBMISSION.ipynb")
    parser.add_argument("--report", required=True,
                        help="CSV file to write, one row per check; '-' writes it to stdout (and the "
                             "summary to stderr)")
    parser.add_argument("--timeout", type=float, default=300,
                        help="wall-clock seconds per submission, kernel start included (default 300)")
    parser.add_argument("--jobs", type=int, default=1,
                        help="submissions graded at a time, each in its own kernel (default 1); each kernel "
                             "uses up to OMP_NUM_THREADS cores, so jobs x threads should not exceed the cores")
    parser.add_argument("--release", type=Path,
                        help="the notebook handed out (exercises/NN_name.ipynb): its check cells and points "
                             "replace the submissions' copies, which learners could have edited")
    args = parser.parse_args(argv)
    if args.timeout <= 0:
        parser.error("--timeout must be positive")
    if args.jobs < 1:
        parser.error("--jobs must be at least 1")
    release = None
    if args.release is not None:
        release = checks(read(args.release))
        if not release:
            parser.error(f"{args.release} has no check cells (code cells with nbgrader grade: true)")
    else:
        print("warning: no --release given, so each submission's own check cells and points are trusted; "
              "a learner who edited a check can pass it", file=sys.stderr)
    rows = [row for rows in _grade_all(args.submissions, release, args.timeout, args.jobs) for row in rows]
    if args.report == "-":
        write_csv(rows, sys.stdout)
        print(summary(rows), file=sys.stderr)
    else:
        with open(args.report, "w", newline="", encoding="utf-8") as f:
            write_csv(rows, f)
        print(f"{summary(rows)}\nreport: {args.report}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
