"""`minillm bench quant` (CUDA only): the quantized matmul kernels against fp16 F.linear, at decode
batch sizes.

With a few rows a linear layer reads its whole weight to do two flops per weight and row, so its
time is bytes over bandwidth: each row of the table gives the time of fp16 F.linear, of the int8
kernel and of the int4 kernel (group size 128), their speedups over fp16 (at best 2x for int8, and a
little under 4x for int4 once its scales and zero points are counted), and the GB/s each achieves
(weights with their scales and zero points, plus the activations read and written, over time),
against the copy bandwidth measured on the same device in the same run.

Times are GPU times of CUDA-graph replays (bench/timing.py), each call on its own copy of the
weights so that none is read from L2: a 4096 x 4096 int4 weight (8 MB) fits in an H100's 50 MB of
L2, and timing it warm would report L2 bandwidth, not memory's. Timing launches one by one from
Python would instead report the CPU's launch overhead for the smaller layers.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from minillm.bench.timing import copy_bandwidth, graph_time, num_copies

COLUMNS = [("in_features", "in"), ("out_features", "out"), ("batch", "batch"), ("fp16_ms", "fp16 ms"),
           ("int8_ms", "int8 ms"), ("int4_ms", "int4 ms"), ("int8_speedup", "int8 x"), ("int4_speedup", "int4 x"),
           ("fp16_GB_s", "fp16 GB/s"), ("int8_GB_s", "int8 GB/s"), ("int4_GB_s", "int4 GB/s"),
           ("int4_of_copy_bw", "int4 of copy bw"), ("max_rel_err", "max rel err vs ref")]
INT4_GROUP_SIZE = 128


def _nbytes(*tensors: torch.Tensor | None) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


def _relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.float() - ref.float()).norm() / ref.float().norm()).item()


def bench_quant_matmul(shapes: tuple[tuple[int, int], ...] = ((4096, 4096), (4096, 14336), (14336, 4096),
                                                              (8192, 8192)),
                       batches: tuple[int, ...] = (1, 2, 4, 8, 16), dtype: torch.dtype = torch.float16,
                       device: str | torch.device = "cuda") -> list[dict]:
    """shapes: (in_features, out_features) of the layers (Llama-3-8B's attention, MLP up and down
    projections, and a 70B-sized square); batches: rows of x. One row per (shape, batch)."""
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        raise ValueError(f"minillm bench quant measures the Triton quantized matmul kernels on a CUDA GPU; "
                         f"{'none is visible' if not torch.cuda.is_available() else f'got device {device}'}")
    from minillm.kernels.quant_matmul import int4_matmul, int8_matmul
    from minillm.quant.int4 import quantize_int4
    from minillm.quant.int8 import quantize_int8
    from minillm.quant.matmul_reference import int4_matmul_ref, int8_matmul_ref

    kernels = {"fp16": F.linear, "int8": int8_matmul, "int4": int4_matmul}
    rows = []
    with torch.cuda.device(device):
        copy_bw = copy_bandwidth()
        for in_features, out_features in shapes:
            weight = torch.randn(out_features, in_features, dtype=dtype, device=device) * in_features ** -0.5
            int8_args = quantize_int8(weight)
            int4_args = (*quantize_int4(weight, INT4_GROUP_SIZE), INT4_GROUP_SIZE)
            weight_bytes = {"fp16": _nbytes(weight), "int8": _nbytes(*int8_args), "int4": _nbytes(*int4_args[:3])}
            copies = {name: [tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in args)
                             for _ in range(num_copies(weight_bytes[name]))]
                      for name, args in (("fp16", (weight,)), ("int8", int8_args), ("int4", int4_args))}
            for batch in batches:
                x = torch.randn(batch, in_features, dtype=dtype, device=device)
                activation_bytes = _nbytes(x) + batch * out_features * x.element_size()  # x read, y written
                row = {"in_features": in_features, "out_features": out_features, "batch": batch}
                for name, kernel in kernels.items():
                    seconds = graph_time([functools.partial(kernel, x, *args) for args in copies[name]])
                    row[f"{name}_ms"] = seconds * 1e3
                    row[f"{name}_GB_s"] = (weight_bytes[name] + activation_bytes) / seconds / 1e9
                for name in ("int8", "int4"):
                    row[f"{name}_speedup"] = row["fp16_ms"] / row[f"{name}_ms"]
                row["int4_of_copy_bw"] = row["int4_GB_s"] * 1e9 / copy_bw
                row["copy_GB_s"] = copy_bw / 1e9
                # Against the references in fp32 on the same quantized weights: what the kernels add.
                xf = x.float()
                row["max_rel_err"] = max(
                    _relative_error(int8_matmul(x, *int8_args), int8_matmul_ref(xf, int8_args[0],
                                                                                int8_args[1].float())),
                    _relative_error(int4_matmul(x, *int4_args), int4_matmul_ref(
                        xf, int4_args[0], int4_args[1].float(), int4_args[2].float(), INT4_GROUP_SIZE)))
                rows.append(row)
            del weight, int8_args, int4_args, copies
    return rows
