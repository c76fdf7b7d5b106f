"""The text the shipped `tiny` models learn from: the running interpreter's standard library.

Every Python installation carries the same corpus, so training and evaluation need no download.
A fixed list of modules is held out: the models never see them, and perplexity on them tells how
well the models learned Python rather than memorised the training files.
"""

from __future__ import annotations

import hashlib
import sysconfig
from pathlib import Path

# Held out from training for evaluation; chosen to span plain algorithms, text handling and a
# package, and to be present in every CPython 3.9+ standard library.
HELD_OUT_MODULES: tuple[str, ...] = (
    "bisect.py",
    "calendar.py",
    "colorsys.py",
    "csv.py",
    "difflib.py",
    "fractions.py",
    "heapq.py",
    "json/",
    "queue.py",
    "shlex.py",
    "statistics.py",
    "textwrap.py",
)

# Not Python that anyone writes by hand: generated codec tables, documentation strings stored as
# code, and test suites (large, repetitive, and not what a learner's prompt looks like).
_EXCLUDED_PARTS = {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__"}
_EXCLUDED_PREFIXES = ("encodings/", "pydoc_data/")


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def _is_held_out(rel: str) -> bool:
    return any(rel == m or (m.endswith("/") and rel.startswith(m)) for m in HELD_OUT_MODULES)


def stdlib_files(split: str) -> list[Path]:
    """Sorted source files of the standard library for `split` ("train" or "heldout")."""
    if split not in ("train", "heldout"):
        raise ValueError(f"split must be 'train' or 'heldout', got {split!r}")
    root = stdlib_root()
    files = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if _EXCLUDED_PARTS.intersection(path.relative_to(root).parts[:-1]):
            continue
        if rel.startswith(_EXCLUDED_PREFIXES) and rel != "encodings/__init__.py":
            continue
        if _is_held_out(rel) == (split == "heldout"):
            files.append(path)
    return files


def read_texts(files: list[Path]) -> list[str]:
    return [p.read_text(encoding="utf-8", errors="replace") for p in files]


def corpus_fingerprint(files: list[Path]) -> str:
    """Short hash of the corpus contents, so a model card can say exactly what it was trained on."""
    digest = hashlib.sha256()
    root = stdlib_root()
    for path in files:
        digest.update(path.relative_to(root).as_posix().encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]
