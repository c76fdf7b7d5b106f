"""Execute every chapter and solution notebook as a learner would, top to bottom, and keep the results:
each executed notebook (outputs and all) and one JSON line per notebook with its time and its error.

    python scripts/run_notebooks.py OUTDIR                  # every notebook, 4 at a time
    python scripts/run_notebooks.py OUTDIR --jobs 1 notebooks/00_welcome.ipynb

The GPU check runs it on a CUDA machine, where no chapter has a test of its own; the model is what
$MINILLM_MODEL / $MINILLM_DRAFT_MODEL choose (the course's switch), the shipped pair unless set.
Needs nbclient and ipykernel, and the course's widget libraries.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENV = {"TQDM_DISABLE": "1", "HF_HUB_OFFLINE": "1", "PYDEVD_DISABLE_FILE_VALIDATION": "1"}


def run_one(notebook: Path, outdir: Path, timeout: int) -> dict:
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(notebook, as_version=4)
    start = time.perf_counter()
    error = None
    try:
        NotebookClient(nb, timeout=timeout, kernel_name="python3",
                       resources={"metadata": {"path": str(notebook.parent)}}).execute()
    except Exception as e:  # the notebook's own error, with its traceback, is the result
        error = f"{type(e).__name__}: {str(e)[-2000:]}"
    seconds = time.perf_counter() - start
    # The widgets' saved state (every frame a live view ever sent: 20 MB for chapter 04) is left
    # out, so that the results copy back from a GPU machine; the outputs themselves are kept.
    nb.metadata.pop("widgets", None)
    nbformat.write(nb, outdir / f"{notebook.parent.name}__{notebook.name}")
    return {"notebook": f"{notebook.parent.name}/{notebook.name}", "seconds": round(seconds, 1), "ok": error is None,
            "error": error}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("outdir", type=Path)
    parser.add_argument("notebooks", type=Path, nargs="*", help="default: every chapter and solution")
    parser.add_argument("--jobs", type=int, default=4, help="notebooks run at once")
    parser.add_argument("--timeout", type=int, default=600, help="seconds a cell may take")
    args = parser.parse_intermixed_args()
    notebooks = args.notebooks or sorted([*ROOT.glob("notebooks/*.ipynb"), *ROOT.glob("solutions/*.ipynb")])
    args.outdir.mkdir(parents=True, exist_ok=True)
    os.environ.update({k: v for k, v in ENV.items() if k not in os.environ})
    results = args.outdir / "results.jsonl"
    failed = 0
    with ProcessPoolExecutor(args.jobs) as pool, results.open("w") as out:
        futures = [pool.submit(run_one, nb.resolve(), args.outdir, args.timeout) for nb in notebooks]
        for future in futures:
            result = future.result()
            failed += not result["ok"]
            out.write(json.dumps(result) + "\n")
            out.flush()
            print(f"{'ok    ' if result['ok'] else 'FAILED'} {result['seconds']:7.1f} s  {result['notebook']}"
                  + (f"\n    {result['error'][-600:]}" if result["error"] else ""), flush=True)
    print(f"{len(notebooks) - failed} of {len(notebooks)} notebooks ran without error")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
