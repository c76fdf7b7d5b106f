"""Install, from a folder of wheels and with no index, each distribution this Python does not have yet,
into a folder for PYTHONPATH (the GPU machine's own torch, numpy and friends are never shadowed);
then this checkout itself, so that its mapped package (minillm.widgets) imports as it does for a learner.

    python scripts/install_wheels.py WHEEL_DIR TARGET    # then: export PYTHONPATH=TARGET
"""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def missing(wheels: list[Path]) -> list[Path]:
    lacking = []
    for wheel in wheels:
        name = wheel.name.split("-")[0]
        try:
            metadata.version(name)
        except metadata.PackageNotFoundError:
            lacking.append(wheel)
    return lacking


def main() -> int:
    wheel_dir, target = Path(sys.argv[1]), Path(sys.argv[2])
    wheels = missing(sorted(wheel_dir.glob("*.whl")))
    pip = [sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-index", "--no-deps",
           "--no-compile", "--no-cache-dir", "--upgrade", "--target", str(target)]
    if wheels:
        subprocess.run([*pip, *map(str, wheels)], check=True)
    # The checkout, built here (setuptools is all it needs); its build folder is ignored by git.
    subprocess.run([*pip, "--no-build-isolation", str(ROOT)], check=True)
    print(f"installed {len(wheels)} wheels and minillm into {target}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
