"""Published spec-sheet figures of common GPUs, to set beside the roofs `bench decode` measures.

Each is the vendor's headline for dense 16-bit tensor-core matmul (no structured sparsity, which
doubles the headline) and for memory bandwidth. They are what a datasheet promises, not what a
program reaches: a large copy typically gets 70-90% of the bandwidth and a large matmul 60-80% of
the flops, and `bench decode` measures both on the machine at hand.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class PublishedSpec:
    name: str
    precision: str  # the 16-bit format the matmul figure is for
    tflops: float  # dense matmul, TFLOP/s
    tb_s: float  # memory bandwidth, TB/s

    @property
    def ridge(self) -> float:
        """Flops per byte at which the two published roofs meet."""
        return self.tflops / self.tb_s


# (pattern of torch.cuda.get_device_name, figures); the first match wins, so variants come first.
PUBLISHED_SPECS: tuple[tuple[str, PublishedSpec], ...] = (
    (r"H200", PublishedSpec("H200 SXM", "bf16", 989, 4.8)),
    (r"H100.*PCIe", PublishedSpec("H100 PCIe", "bf16", 756, 2.0)),
    (r"H100 80GB HBM3|H100 SXM", PublishedSpec("H100 SXM", "bf16", 989, 3.35)),
    (r"A100.*80GB.*PCIe", PublishedSpec("A100 80GB PCIe", "bf16", 312, 1.94)),
    (r"A100.*80GB", PublishedSpec("A100 80GB SXM", "bf16", 312, 2.04)),
    (r"\bL4\b", PublishedSpec("L4", "bf16", 121, 0.3)),
    (r"\bT4\b", PublishedSpec("T4", "fp16", 65, 0.32)),
    # GeForce cards accumulate fp16 products in fp32 (as PyTorch's matmul does) at half the fp16-accumulate rate.
    (r"RTX 4090", PublishedSpec("RTX 4090", "fp16, fp32 accumulate", 165, 1.01)),
)


def published_spec(device_name: str) -> PublishedSpec | None:
    """The figures for a device named as torch.cuda.get_device_name names it, e.g. "NVIDIA H100 80GB
    HBM3" or "Tesla T4"; None for a device not in the table (a CPU, an unlisted GPU)."""
    return next((spec for pattern, spec in PUBLISHED_SPECS if re.search(pattern, device_name)), None)
