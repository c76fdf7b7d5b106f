"""Where a batch-1 decode step's GPU time goes, kernel by kernel: a model in its own dtype, then with
every linear layer in INT4 g128 and in INT8, each step a CUDA-graph replay under torch.profiler
(`minillm.bench.profile_step`).

It says how far weight quantization can speed up a whole step: the quantized matmuls shrink, while
every other kernel (norms, rotary, attention, activation, the head's matmul) and the gaps between
kernels stay. A step whose matmuls took no time at all would still take what those others take.

    python scripts/profile_decode_kernels.py MODEL [OUT.json]   # about 40 s for a 1.1B model on an H200
                                                               # (PYTHONPATH=. where minillm is not installed)
"""

from __future__ import annotations

import gc
import sys
from pathlib import Path

import torch

from minillm.bench.profile_step import MATMUL, merged, profile_steps
from minillm.bench.report import format_table, write_json
from minillm.llm import LLM

SCHEMES = (None, "int4", "int8")
COLUMNS = [("scheme", "weights"), ("step_us", "step µs (profiled)"), ("kernels", "kernels"),
           ("kernel_us", "kernel µs"), ("linear_us", "linear-layer µs"), ("other_us", "other kernels µs"),
           ("linear_calls", "linear calls"), ("us_per_linear", "µs per linear call")]


def profile(model: str, quantization: str | None) -> dict:
    """One scheme's kernels per step: the linear layers' matmuls (every kernel of the matmul group but
    the head's, the one call a step of its own shape) against all the others."""
    llm = LLM(model, device="cuda", dtype="bfloat16", quantization=quantization, skip_tokenizer_init=True,
              enable_prefix_caching=False, max_num_seqs=1, max_model_len=256)
    layers = llm.llm_engine.model_config.num_hidden_layers
    mean = merged(profile_steps(llm, batch=1, context=16, steps=5))
    del llm
    gc.collect()
    torch.cuda.empty_cache()
    kernels = sorted((r for r in mean.rows if r.device_us > 0), key=lambda r: -r.device_us)
    # A linear layer's kernels run once or more per decoder layer (cuBLAS may add a split-K reduction,
    # a matmul by its name); on Hopper cuBLAS's own kernels are named nvjet.
    linear = [r for r in kernels if (r.group == MATMUL or r.name.startswith("nvjet")) and r.calls >= layers]
    total, matmul = sum(r.device_us for r in kernels), sum(r.device_us for r in linear)
    calls = sum(r.calls for r in linear)
    return {"scheme": quantization or "bf16", "step_us": mean.step_us, "kernels": sum(r.calls for r in kernels),
            "kernel_us": total, "linear_us": matmul, "other_us": total - matmul, "linear_calls": calls,
            "us_per_linear": matmul / calls if calls else None,
            "by_kernel": [{"name": r.name, "calls": r.calls, "us": r.device_us} for r in kernels]}


def main() -> None:
    if not torch.cuda.is_available():
        sys.exit("profile_decode_kernels.py profiles CUDA-graph replays; no CUDA GPU is visible")
    model, out = sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None
    rows = [profile(model, scheme) for scheme in SCHEMES]
    print(format_table(rows, COLUMNS))
    for row in rows:
        print(f"{row['scheme']}: " + ", ".join(f"{k['name'][:48]} {k['us']:.0f} µs / {k['calls']:.0f}"
                                               for k in row["by_kernel"][:6]))
    base = rows[0]
    summary = {}
    for row in rows[1:]:
        # The replay's gaps between kernels are not in these sums: the bound holds for kernel time.
        summary[row["scheme"]] = {"kernels_speedup": base["kernel_us"] / row["kernel_us"],
                                  "kernels_speedup_bound": base["kernel_us"] / row["other_us"]}
        print(f"{row['scheme']}: kernels {summary[row['scheme']]['kernels_speedup']:.2f}x bf16's; with linear "
              f"layers that took no time, at most {summary[row['scheme']]['kernels_speedup_bound']:.2f}x")
    if out:
        write_json(Path(out), "profile_decode_kernels", {"model": model, "device": torch.cuda.get_device_name()},
                   rows, summary)
        print(f"wrote {out}")


if __name__ == "__main__":
    main()
