"""What every course notebook does first: pick the device and the model, fix the seeds.

The first two cells of every notebook (the "Open in Colab" badge and the setup cell) are written
from this module, so they are the same everywhere: `python -m minillm.course` rewrites them, and
a test fails when a notebook's copy differs.
"""

from __future__ import annotations

import os
import random
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from minillm.device import default_device
from minillm.version import __version__

# Where Colab installs the course from: a release tag, never a moving branch, so that a notebook
# always runs against the engine version it was written for.
REPOSITORY = "https://github.com/minillm-course/minillm"
RELEASE = f"v{__version__}"
GPU_MODELS = ("HuggingFaceTB/SmolLM2-360M", "HuggingFaceTB/SmolLM2-135M")  # target, draft
CPU_MODELS = ("tiny", "tiny-draft")
SEED = 0

SETUP_CELL = f'''# Setup: the same first cell in every chapter.
# On Colab this installs minillm at a fixed release; Colab's torch, ipywidgets and plotly are kept.
import sys

if "google.colab" in sys.modules:
    !pip install -q "minillm @ git+{REPOSITORY}@{RELEASE}"

from minillm.course import setup

course = setup()  # device: cuda, then mps, then cpu; model: $MINILLM_MODEL, else tiny (CPU) or SmolLM2 (GPU)'''


def colab_badge(notebook: str) -> str:
    url = f"https://colab.research.google.com/github/{REPOSITORY.split('github.com/')[1]}/blob/{RELEASE}/{notebook}"
    return f"[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]({url})"


@dataclass(frozen=True)
class CourseSetup:
    device: str
    model: str
    draft_model: str

    def __repr__(self) -> str:
        return f"CourseSetup(device={self.device!r}, model={self.model!r}, draft_model={self.draft_model!r})"


def setup(seed: int = SEED) -> CourseSetup:
    """Device (cuda, then mps, then cpu), models ($MINILLM_MODEL / $MINILLM_DRAFT_MODEL override the
    defaults: tiny on a CPU, the SmolLM2 pair on a GPU), and every seed fixed."""
    device = default_device()
    default_model, default_draft = GPU_MODELS if device == "cuda" else CPU_MODELS
    choice = CourseSetup(device=device, model=os.environ.get("MINILLM_MODEL", default_model),
                         draft_model=os.environ.get("MINILLM_DRAFT_MODEL", default_draft))
    random.seed(seed)
    torch.manual_seed(seed)
    try:
        import numpy

        numpy.random.seed(seed)
    except ImportError:
        pass
    print(choice)
    return choice


def sync_notebooks(root: Path) -> list[Path]:
    """Give every notebook under root the setup cell first and the badge atop its title cell;
    returns the files changed."""
    import nbformat

    changed = []
    for path in sorted(p for folder in ("notebooks", "solutions") for p in (root / folder).glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        setup_cell, title_cell = nb.cells[0], nb.cells[1]
        badge = colab_badge(path.relative_to(root).as_posix())
        title_lines = title_cell.source.split("\n")
        if title_lines[0].startswith("[![Open In Colab]"):
            title_lines = title_lines[1:]
        if setup_cell.source != SETUP_CELL or title_cell.source.split("\n")[0] != badge:
            setup_cell.source = SETUP_CELL
            title_cell.source = "\n".join([badge, *title_lines])
            nbformat.write(nb, path)
            changed.append(path)
    return changed


if __name__ == "__main__":
    for changed_path in sync_notebooks(Path(sys.argv[1] if len(sys.argv) > 1 else ".")):
        print(f"updated {changed_path}")
