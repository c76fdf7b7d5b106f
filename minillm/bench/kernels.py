"""`minillm bench kernels`: how many kernels one decode step launches, per decoder layer.

Each launch costs the GPU a few microseconds whatever its size, even replayed inside a CUDA graph,
and costs the host far more when launched eagerly. At batch 1 a small model's matmuls take about as
long as a handful of launches, so launches per layer times layers is a floor on a step's time that
no bandwidth can lift.

Counted on every device by the dispatcher: each aten op that computes (not a view, not an
allocation) is one launch, and each call of a Triton kernel from the engine's `KernelOps` is one
launch (the aten ops inside it, which only the CPU interpreter makes, are not counted). Each count
is charged to the decoder layer it ran in, or to "outside" (embedding, final norm, head, sampler).
On a CUDA GPU the profiler also counts the kernels the GPU ran in the same steps: the ground truth,
higher than the dispatcher's where one call launches several kernels (a split-KV attention and its
reduction, a split-K matmul).
"""

from __future__ import annotations

import functools
from collections import Counter
from dataclasses import fields

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from minillm.bench.engine_steps import decoding
from minillm.kernels.ops import KernelOps
from minillm.llm import LLM

COLUMNS = [("model", "model"), ("kernel", "kernels"), ("layers", "layers"), ("per_layer", "launches per layer"),
           ("outside_per_step", "outside layers"), ("per_step", "per step"),
           ("profiler_per_step", "GPU kernels per step (profiler)")]
# Ops that allocate without writing (so launch nothing) and are not views.
_ALLOCATIONS = {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "lift_fresh"}


def launches_kernel(func: torch._ops.OpOverload) -> bool:
    return not func.is_view and func._schema.name.removeprefix("aten::") not in _ALLOCATIONS


class LaunchCounter(TorchDispatchMode):
    """Counts launches by (where, op name); `where` is set by the decoder layers' hooks."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter[tuple[str, str]] = Counter()
        self.where = "outside"
        self.inside_triton = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not self.inside_triton and launches_kernel(func):
            self.counts[self.where, func._schema.name.removeprefix("aten::")] += 1
        return func(*args, **(kwargs or {}))

    def count_triton(self, name: str, fn):
        @functools.wraps(fn)
        def launch(*args, **kwargs):
            self.counts[self.where, f"triton:{name}"] += 1
            self.inside_triton += 1
            try:
                return fn(*args, **kwargs)
            finally:
                self.inside_triton -= 1

        return launch


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The model's stack of decoder layers: the ModuleList named `layers`."""
    return next(m for name, m in model.named_modules() if name.endswith("layers") and isinstance(m, nn.ModuleList))


def _is_triton_kernel(fn) -> bool:
    return not getattr(fn, "__module__", "").endswith("_reference")


def count_step_launches(llm: LLM, batch: int = 1, context: int = 32, steps: int = 3) -> dict:
    """Launches of `steps` eager decode steps of `batch` sequences: per layer (mean and each), outside
    the layers, per step, and the op names of the last layer's step."""
    engine = llm.llm_engine
    layers = decoder_layers(engine.model)
    counter = LaunchCounter()
    ops: KernelOps = engine.ops
    saved = {f.name: getattr(ops, f.name) for f in fields(ops) if callable(getattr(ops, f.name))}
    hooks = []
    for i, layer in enumerate(layers):
        hooks.append(layer.register_forward_pre_hook(lambda *_, i=i: setattr(counter, "where", f"layer {i}")))
        hooks.append(layer.register_forward_hook(lambda *_: setattr(counter, "where", "outside")))
    profiled = None
    try:
        with decoding(llm, batch, context, 2 * steps + 1) as running:
            running.step()  # warm: the first step at this size may compile
            if running.device.type == "cuda":
                profiled = _profiled_kernels(running, steps)
            if ops.kernel == "triton":
                for name, fn in saved.items():
                    if _is_triton_kernel(fn):
                        setattr(ops, name, counter.count_triton(name, fn))
            with counter:
                for _ in range(steps):
                    running.step()
    finally:
        for hook in hooks:
            hook.remove()
        for name, fn in saved.items():
            setattr(ops, name, fn)
    by_layer = [sum(n for (where, _), n in counter.counts.items() if where == f"layer {i}") / steps
                for i in range(len(layers))]
    outside = sum(n for (where, _), n in counter.counts.items() if where == "outside") / steps
    # The last layer's ops: a typical one (the first has no residual to add before its first norm).
    last_layer = f"layer {len(layers) - 1}"
    last = Counter({op: n // steps for (where, op), n in counter.counts.items() if where == last_layer})
    return {"layers": len(layers), "per_layer": sum(by_layer) / len(layers), "outside_per_step": outside,
            "per_step": sum(by_layer) + outside,
            "profiler_per_step": profiled / steps if profiled is not None else None,
            "by_layer": by_layer, "layer_ops": dict(last.most_common())}


def _profiled_kernels(engine, steps: int) -> int:
    """Kernels the GPU ran in `steps` decode steps, by the profiler (copies and memsets not counted)."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            engine.step()
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
               and not e.name.startswith(("Memcpy", "Memset")))


def bench_kernels(models: tuple[str, ...], kernels: tuple[str, ...], batch: int = 1, steps: int = 3,
                  device: str | None = None, dtype: str = "auto") -> tuple[list[dict], dict]:
    rows = []
    for model in models:
        for kernel in kernels:
            llm = LLM(model, device=device, dtype=dtype, attention_backend=kernel, enforce_eager=True,
                      skip_tokenizer_init=True, enable_prefix_caching=False, max_num_seqs=max(batch, 1),
                      max_model_len=128, num_kv_blocks=max(batch, 1) * 8 + 8)
            rows.append({"model": model, "kernel": llm.llm_engine.ops.kernel,
                         **count_step_launches(llm, batch, steps=steps)})
            del llm
    summary = {f"{r['model']} {r['kernel']} per_layer": r["per_layer"] for r in rows}
    return rows, summary
