"""Compile every kernel launch the engine makes for real GPUs, ahead of time, on a machine with no
GPU: what Triton's interpreter cannot check (shared memory per block, register spills, what a
GPU's compiler accepts) is checked here, in CI.

The launchers themselves are called, under `targets.aot_target`, with CPU tensors of each dtype,
head dim and block size the engine uses; `JITFunction.run` is replaced by a recorder, so nothing
runs, and each recorded launch, specialized as Triton's JIT specializes it on a GPU (`launch_of`),
is compiled with `triton.compile(..., target=GPUTarget("cuda", cc, 32))` into PTX and a cubin. A
launch fits when its shared memory is within the target's limit; registers and spills are ptxas's
report, where ptxas ran (a kernel in Triton's cache is not compiled again, and has none). Every
launch is compiled for one target, and for the others those that bound shared memory and the
decoder layer's kernels in fp32, their largest tiles (compiling one takes seconds: the whole set
for five targets would take many minutes).

    python -m minillm.kernels.aot                  # every target; exits 1 if a launch does not fit
    python -m minillm.kernels.aot --cc 75 --json   # one target, machine-readable

Triton's interpreter must be off (TRITON_INTERPRET unset): it replaces the kernels this compiles.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import sys
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from unittest import mock

import torch

from minillm.kernels.targets import TARGETS, GPUSpec, aot_target


@dataclass(frozen=True)
class Launch:
    kernel: str
    signature: tuple[tuple[str, str], ...]  # (argument, Triton type or "constexpr")
    constexprs: tuple[tuple[str, object], ...]
    options: tuple[tuple[str, int], ...]  # num_warps, num_stages where the launcher sets them
    aligned: tuple[str, ...] = ()  # arguments compiled as multiples of 16 (pointers: 16-byte aligned)


@dataclass
class Compiled:
    kernel: str
    target: str
    capability: int
    config: str  # the launch's constexprs and options, readable
    shared_bytes: int
    max_shared_bytes: int
    registers: int | None
    spilled_bytes: int | None

    @property
    def fits(self) -> bool:
        return self.shared_bytes <= self.max_shared_bytes


@contextlib.contextmanager
def record_launches() -> Iterator[list[tuple]]:
    """Kernel launches are recorded as (JITFunction, args, kwargs) instead of run."""
    from triton.runtime.jit import JITFunction

    records: list[tuple] = []

    def record(self, *args, grid, warmup=False, **kwargs):
        records.append((self, args, kwargs))

    with mock.patch.object(JITFunction, "run", record):
        yield records


def launch_of(fn, args: tuple, kwargs: dict) -> Launch:
    """The launch as Triton's JIT compiles it on a GPU, specialized by Triton's own binder: an integer
    argument of 1 and a None become constants, and a pointer aligned to 16 bytes or an integer that
    is a multiple of 16 is compiled as one. The last matters: only then can a load of contiguous
    elements be vectorized, which changes the code, its registers and its shared memory."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend
    from triton.runtime.jit import create_function_from_signature

    kwargs = dict(kwargs)
    options = tuple((k, kwargs.pop(k)) for k in ("num_warps", "num_stages") if k in kwargs)
    # The specialization is the same for every NVIDIA target.
    binder = create_function_from_signature(fn.signature, fn.params, make_backend(GPUTarget("cuda", 80, 32)))
    _, specialization, _ = binder(*args, **kwargs)
    signature, constexprs, aligned = [], [], []
    for param, (kind, value) in zip(fn.params, specialization):
        signature.append((param.name, kind))
        if kind == "constexpr":
            constexprs.append((param.name, value))
        elif value == "D":
            aligned.append(param.name)
    return Launch(fn.__name__, tuple(signature), tuple(constexprs), options, tuple(aligned))


def engine_launches(target: GPUSpec, everything: bool) -> dict[Launch, object]:
    """The distinct launches the engine makes on `target` -> their JITFunctions. everything: every
    dtype the target has, head dims 64, 80 and 128, blocks of 16 and 32, the int8 KV cache, the
    quantized matmuls at 1 row, a few rows (with one slice of the inputs and several) and a
    prefill's many, and the layer kernels at the widest rows they meet (RMSNorm over 8192 channels,
    SiLU-and-mul over 28672, rotary embedding of 64 query heads, alone and fused with the KV store,
    with and without Qwen3's q/k norm, into either pool: Llama-70B's shapes). Otherwise only the
    launches that bound shared memory or registers: the kernels that stage tiles (prefill, decode,
    the matmuls, the one-row ones in registers) at head dim 128 in fp16 (bf16 takes the same tiles)
    and fp32, a smaller head dim padding to at most 128; and the layer kernels at the same widths in
    fp32 (their reductions and layout changes are staged in shared memory, at most 4 bytes a value),
    the fused store in its plainest form and its fullest (the q/k norm and the int8 pool)."""
    from minillm.kernels.activation import silu_and_mul
    from minillm.kernels.paged_decode import paged_decode_attention
    from minillm.kernels.paged_prefill import paged_prefill_attention
    from minillm.kernels.quant_matmul import int4_matmul, int8_matmul
    from minillm.kernels.random_inputs import paged_batch
    from minillm.kernels.rms_norm import fused_add_rms_norm, rms_norm
    from minillm.kernels.rotary import rotary_embedding
    from minillm.kernels.rotary_store import fused_rotary_store_kvcache
    from minillm.kernels.store_kv import store_kvcache
    from minillm.quant.int4 import quantize_int4
    from minillm.quant.int8 import quantize_int8

    dtypes = [torch.float16, torch.float32] + ([torch.bfloat16] if everything and target.capability >= 80 else [])
    attention = [(dtype, 128, 16, False) for dtype in dtypes]
    if everything:
        attention += [(torch.float16, 64, 16, False), (torch.float16, 80, 16, False),
                      (torch.float16, 128, 32, False), (torch.float16, 128, 16, True)]
    with aot_target(target), record_launches() as records:
        for dtype, head_dim, block_size, int8_kv in attention:
            k_cache, v_cache, tables, lens = paged_batch([100, 30], 2, head_dim, block_size, dtype, 0, "cpu")
            scales = {}
            if int8_kv:
                k_cache, v_cache = k_cache.to(torch.int8), v_cache.to(torch.int8)
                scales = {name: torch.ones(k_cache.shape[:-1]) for name in ("k_scales", "v_scales")}
            q = torch.randn(130, 8, head_dim).to(dtype)
            cu = torch.tensor([0, 100, 130], dtype=torch.int32)
            paged_prefill_attention(q, k_cache, v_cache, cu, lens, tables, 0.1, max_query_len=100, **scales)
            # Decode and verification rows (a CUDA graph of a speculative step): smaller tiles.
            paged_prefill_attention(q[:10], k_cache, v_cache, cu // 20, lens, tables, 0.1, max_query_len=5, **scales)
            paged_decode_attention(q[:2], k_cache, v_cache, tables, lens, 0.1, max_seq_len=4096, **scales)
            store_kvcache(q[:3, :2], q[:3, :2], k_cache, v_cache, torch.tensor([1, 2, 3], dtype=torch.int32),
                          **scales)
        for dtype in dtypes:
            weight = torch.randn(4096, 4096).to(dtype)
            int8_args, int4_args = quantize_int8(weight), (*quantize_int4(weight, 128), 128)
            for rows in (1, 4, 64):
                x = torch.randn(rows, 4096).to(dtype)
                int8_matmul(x, *int8_args)
                int4_matmul(x, *int4_args)
                if everything and rows < 64:  # one slice of the inputs, as a layer wide enough to fill
                    # the GPU takes: the same tiles as several slices, only the last store differs
                    int8_matmul(x, *int8_args, split_k=1)
                    int4_matmul(x, *int4_args, split_k=1)
        for dtype in dtypes if everything else [torch.float32]:
            x = torch.randn(3, 8192).to(dtype)
            rms_norm(x, x[0], 1e-6)
            fused_add_rms_norm(x, torch.randn(3, 8192).to(dtype), x[0], 1e-6)
            silu_and_mul(torch.randn(3, 2 * 28672).to(dtype))
            qkv = torch.randn(3, 80, 128).to(dtype)
            q, k, v, table = qkv[:, :64], qkv[:, 64:72], qkv[:, 72:], torch.randn(16, 128).to(dtype)
            rotary_embedding(torch.arange(3), q, k, table)
            for int8_kv, qk_norm in [(False, False), (True, True)] + ([(True, False), (False, True)] if everything
                                                                     else []):
                pool = torch.zeros(4, 16, 8, 128, dtype=torch.int8 if int8_kv else dtype)
                scales = {name: torch.ones(4, 16, 8) for name in ("k_scales", "v_scales")} if int8_kv else {}
                norms = dict(q_norm_weight=table[0], k_norm_weight=table[0], eps=1e-6) if qk_norm else {}
                fused_rotary_store_kvcache(torch.arange(3), q, k, v, table, pool, pool.clone(),
                                           torch.tensor([1, 2, -1], dtype=torch.int32), **norms, **scales)
    launches = {launch_of(fn, args, kwargs): fn for fn, args, kwargs in records}
    if everything:
        return launches
    return {launch: fn for launch, fn in launches.items() if launch.kernel in TILED_KERNELS + LAYER_KERNELS}


# The kernels whose tiles live in shared memory, and the single-row gemv, whose tiles live in
# registers (checked for spills); the others (KV store, the split-KV reduction) use a few hundred
# bytes of shared memory at most.
TILED_KERNELS = ("_ragged_attention_kernel", "_decode_partition_kernel", "_gemv_kernel", "_gemm_kernel",
                 "_gemv_row_kernel")
# Every decoder layer runs these, on every GPU.
LAYER_KERNELS = ("_rms_norm_kernel", "_fused_add_rms_norm_kernel", "_silu_and_mul_kernel", "_rotary_kernel",
                 "_fused_rotary_store_kvcache_kernel")


def compiled_kernel(fn, launch: Launch, target: GPUSpec, log: io.StringIO | None = None):
    """Triton's compiled kernel of the launch for the target (PTX, cubin); log: ptxas's report."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.knobs import nvidia

    index = {name: i for i, name in enumerate(fn.arg_names)}
    source = ASTSource(fn, dict(launch.signature), {(index[k],): v for k, v in launch.constexprs},
                       {(index[k],): [["tt.divisibility", 16]] for k in launch.aligned})
    # Triton runs ptxas with -v; its report (registers, spills) is printed when asked for.
    with mock.patch.object(nvidia, "dump_ptxas_log", log is not None), contextlib.redirect_stdout(log or io.StringIO()):
        return triton.compile(source, target=GPUTarget("cuda", target.capability, 32), options=dict(launch.options))


def compile_launch(fn, launch: Launch, target: GPUSpec) -> Compiled:
    log = io.StringIO()
    kernel = compiled_kernel(fn, launch, target, log)
    registers = re.search(r"Used (\d+) registers", log.getvalue())
    spills = [int(n) for n in re.findall(r"(\d+) bytes spill stores", log.getvalue())]
    config = ", ".join(f"{k}={v}" for k, v in launch.constexprs + launch.options
                       if k.isupper() or k.startswith("num_"))
    types = sorted({t for _, t in launch.signature if t.startswith("*f") or t.startswith("*b")})
    return Compiled(launch.kernel, target.name, target.capability, f"{'/'.join(types)} {config}",
                    kernel.metadata.shared, target.max_shared_bytes,
                    int(registers.group(1)) if registers else None, max(spills) if spills else None)


def check(capabilities: list[int], everything: int | None = 80) -> list[Compiled]:
    """Compile the engine's launches for each target: all of them for the `everything` target, the
    shared-memory-bounding ones for the rest."""
    results = []
    for capability in capabilities:
        target = TARGETS[capability]
        for launch, fn in engine_launches(target, capability == everything).items():
            results.append(compile_launch(fn, launch, target))
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cc", type=int, nargs="+", default=sorted(TARGETS), choices=sorted(TARGETS))
    parser.add_argument("--everything", type=int, default=80, choices=sorted(TARGETS),
                        help="the target for which every launch is compiled (the others: the bounding ones)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") == "1":
        sys.exit("minillm.kernels.aot compiles for GPUs: unset TRITON_INTERPRET")
    results = check(args.cc, args.everything)
    if args.json:
        print(json.dumps([asdict(r) | {"fits": r.fits} for r in results]))
    else:
        for r in results:
            usage = "cached" if r.registers is None else f"{r.registers} registers, {r.spilled_bytes or 0} spilled"
            print(f"{r.target:<9} {r.kernel:<26} {r.shared_bytes:>7} / {r.max_shared_bytes:<7} shared bytes  "
                  f"{usage:<26} {'ok' if r.fits else 'DOES NOT FIT'}  {r.config}")
    sys.exit(0 if all(r.fits for r in results) else 1)


if __name__ == "__main__":
    main()
