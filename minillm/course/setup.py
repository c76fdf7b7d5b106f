"""What every course notebook does first: pick the device and the model, fix the seeds.

Every notebook's setup cell (written from minillm/course/release.py) ends by calling `setup()`.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass

import torch

from minillm.course import gpu_standin
from minillm.utils.device import default_device

GPU_MODELS = ("HuggingFaceTB/SmolLM2-360M", "HuggingFaceTB/SmolLM2-135M")  # target, draft
CPU_MODELS = ("tiny", "tiny-draft")
SEED = 0


@dataclass(frozen=True)
class CourseSetup:
    device: str
    model: str
    draft_model: str

    def __repr__(self) -> str:
        return f"CourseSetup(device={self.device!r}, model={self.model!r}, draft_model={self.draft_model!r})"


def setup(seed: int = SEED) -> CourseSetup:
    """Device (cuda, then mps, then cpu), models ($MINILLM_MODEL / $MINILLM_DRAFT_MODEL override the
    defaults: the SmolLM2 pair on an NVIDIA GPU, tiny on an Apple GPU or a CPU), and every seed fixed.
    With $MINILLM_GPU_STANDIN=1 the CPU stands in for a CUDA GPU (gpu_standin.py), with the tiny pair."""
    device = default_device()
    standin = gpu_standin.active()
    if standin:
        gpu_standin.activate()
    if device != "cuda":
        # Without a CUDA GPU, Triton's kernels run only in its CPU interpreter (chapters 03, 06 and 08
        # run them there). Triton reads the switch when it is first imported, and importing
        # transformers imports it: set it now, before any chapter's imports.
        os.environ.setdefault("TRITON_INTERPRET", "1")
    default_model, default_draft = GPU_MODELS if device == "cuda" and not standin else CPU_MODELS
    choice = CourseSetup(device="cuda" if standin else device, model=os.environ.get("MINILLM_MODEL", default_model),
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
