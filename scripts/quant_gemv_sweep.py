"""What the decode path of the quantized matmuls (`minillm/kernels/quant_gemv.py`) is sensitive to,
on a CUDA GPU: the same layers as `minillm bench quant`, each launch parameter varied alone around
the shipped choice (input slices, tile shape and warps, the groups a one-row int4 tile spans,
Triton's pipeline stages, int4's packed arithmetic or fp32, fp16 or bf16 inputs),
beside F.linear and the device's read-only bandwidth, CUDA-graph timed on copies of the weights as
`bench quant` times them. For deciding what to change in a kernel before changing it.

    python scripts/quant_gemv_sweep.py [OUT.json]     # about 45 s on an H100 (PYTHONPATH=. where
                                                      # minillm is not installed)
"""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from minillm.bench.report import format_table
from minillm.bench.timing import graph_time, num_copies, read_bandwidth
from minillm.kernels import quant_gemv
from minillm.kernels.quant_matmul import int4_matmul, int8_matmul
from minillm.quant.int4 import quantize_int4
from minillm.quant.int8 import quantize_int8

SHAPES = ((4096, 14336), (8192, 8192), (4096, 4096))  # (in, out)
GROUP_SIZE = 128


class _Forced:
    """A kernel whose launches all take `options` (num_stages, a constexpr), whatever the launcher says."""

    def __init__(self, kernel, **options):
        self.kernel, self.options = kernel, options

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.kernel[grid](*args, **{**kwargs, **self.options})


DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


def _kind(kind: str) -> tuple[str, torch.dtype]:
    """("int4", bf16) of "int4 bf16"; a dtype's name alone is F.linear in it; fp16 where unnamed."""
    method, _, dtype = kind.partition(" ")
    return ("dense", DTYPES[method]) if method in DTYPES else (method, DTYPES[dtype or "fp16"])


@functools.cache
def _weights(kind: str, in_features: int, out_features: int) -> tuple[int, list[tuple]]:
    """Bytes of one copy, and enough copies that none is read from L2 (bench/timing.py), made once
    for all the runs."""
    method, dtype = _kind(kind)
    weight = torch.randn(out_features, in_features, dtype=dtype, device="cuda") * in_features ** -0.5
    args = {"dense": lambda: (weight,), "int8": lambda: quantize_int8(weight),
            "int4": lambda: (*quantize_int4(weight, GROUP_SIZE), GROUP_SIZE)}[method]()
    nbytes = sum(a.numel() * a.element_size() for a in args if isinstance(a, torch.Tensor))
    return nbytes, [tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in args)
                    for _ in range(num_copies(nbytes))]


def _time(kind: str, shape: tuple[int, int], rows: int, split_k: int | None) -> tuple[float, int]:
    nbytes, copies = _weights(kind, *shape)
    method, dtype = _kind(kind)
    x = torch.randn(rows, shape[0], dtype=dtype, device="cuda")
    matmul: Callable = {"dense": F.linear, "int8": int8_matmul, "int4": int4_matmul}[method]
    kwargs = {} if method == "dense" else {"split_k": split_k}
    return graph_time([functools.partial(matmul, x, *args, **kwargs) for args in copies]), nbytes


def sweep() -> list[dict]:
    read_bw = read_bandwidth()
    tiles, row_kernel, dot_kernel = quant_gemv.gemv_tiles, quant_gemv._gemv_row_kernel, quant_gemv._gemv_kernel
    # (kind, rows, varied, value, split_k, tile override, options forced on the kernel's launches)
    runs = [("fp16", 1, "shipped", "", None, None, {})]
    # (the one-row kernel has no pipeline stages: Triton pipelines the loads that feed a tl.dot)
    runs += [("int4", 1, "split-K", str(s or "as chosen"), s, None, {}) for s in (1, 2, 4, 8, None)]
    # (left out: on an H100, 2026-11-27, 128 x 128 on 8 warps ran within a tenth of 4 warps, 256 x 128
    # on 8 slower than both)
    runs += [("int4", 1, "tile", "x".join(map(str, t)), None, t, {})
             for t in ((64, 128, 4), (64, 128, 2), (32, 128, 1), (256, 128, 4))]
    # tiles of 1 and 4 groups side by side where the shipped one has 2 (quant_gemv.ONE_ROW_INT4_GROUPS):
    # rows read in runs of 64 and 256 bytes rather than 128, with the same 16 words a thread
    runs += [("int4", 1, "tile", "x".join(map(str, t)) + f" ({t[1] // 128} group{'s' * (t[1] > 128)})", None, t, {})
             for t in ((128, 128, 4), (32, 512, 4), (32, 512, 2))]
    # the fp32 loop the packed one replaced (quant_half2.py), at the shipped tile and those it was measured in
    runs += [("int4", 1, "half2", label, None, t, {"HALF2": False, **extra})
             for label, t, extra in (("off", None, {}), ("off, 128x128x4", (128, 128, 4), {}),
                                     ("off, 64x128x2", (64, 128, 2), {}))]
    runs += [("int4", 1, "half2", "on, 64x128x2", None, (64, 128, 2), {})]
    # bf16 inputs: packed bf16 products (sm_80 and later) against the fp32 loop, beside bf16 F.linear
    runs += [("bf16", 1, "shipped", "", None, None, {}), ("int4 bf16", 1, "shipped", "", None, None, {}),
             ("int4 bf16", 1, "half2", "off", None, None, {"HALF2": False})]
    runs += [("int4", 16, "tile", "x".join(map(str, t)) if t else "shipped", None, t, {})
             for t in (None, (64, 128, 4), (128, 128, 8))]
    # two groups side by side, their loads issued together: runs of 128 bytes (the shipped 64), at
    # the cost of more registers (128 channels) or more instructions a byte (64), `kernels.sass`
    runs += [("int4", 16, "tile", "x".join(map(str, t)) + " (2 groups)", None, t, {})
             for t in ((128, 256, 4), (64, 256, 4))]
    runs += [("int4", 16, "stages", str(n), None, None, {"num_stages": n}) for n in (1, 2, 4)]
    runs += [("int8", 1, "shipped", "", None, None, {}), ("int8", 2, "shipped", "", None, None, {})]
    # Triton's default pipeline (quant_gemv.GEMV_STAGES_INT8 ships 1)
    runs += [("int8", 2, "stages", "3", None, None, {"num_stages": 3})]
    runs += [("int8", 2, "split-K", str(s), s, None, {}) for s in (1, 4)]
    runs += [("int8", 2, "tile", "x".join(map(str, t)), None, t, {})
             for t in ((32, 128, 4), (128, 128, 4), (128, 128, 8))]
    rows = []
    try:
        for kind, m, varied, value, split_k, tile, options in runs:
            quant_gemv.gemv_tiles = (lambda *_, tile=tile: tile) if tile else tiles
            quant_gemv._gemv_row_kernel = _Forced(row_kernel, **options) if options else row_kernel
            forced_dot = {k: v for k, v in options.items() if k != "HALF2"}
            quant_gemv._gemv_kernel = _Forced(dot_kernel, **forced_dot) if forced_dot else dot_kernel
            for shape in SHAPES:
                seconds, nbytes = _time(kind, shape, m, split_k)
                rows.append({"kind": kind, "rows": m, "varied": varied, "value": value,
                             "shape": f"{shape[0]}x{shape[1]}", "us": seconds * 1e6,
                             "of_read_bw": nbytes / seconds / read_bw})
    finally:
        quant_gemv.gemv_tiles, quant_gemv._gemv_row_kernel, quant_gemv._gemv_kernel = tiles, row_kernel, dot_kernel
    return rows


def main() -> None:
    if not torch.cuda.is_available():
        sys.exit("quant_gemv_sweep.py times kernels on a CUDA GPU; none is visible")
    rows = sweep()
    columns = [("kind", "weights"), ("rows", "rows"), ("varied", "varied"), ("value", "value"), ("shape", "in x out"),
               ("us", "µs"), ("of_read_bw", "of read bw")]
    print(format_table(rows, columns))
    if len(sys.argv) > 1:
        Path(sys.argv[1]).write_text(json.dumps({"device": torch.cuda.get_device_name(), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
