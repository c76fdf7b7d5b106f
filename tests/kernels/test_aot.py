"""Every kernel launch the engine makes, compiled ahead of time for a T4, an A100, an RTX 3090, an
L4 and an H100 (`minillm.kernels.aot`), here on a CPU: shared memory within each GPU's limit per
block, where Triton's interpreter would have let anything through. Runs in subprocesses, because
the interpreter that conftest switches on replaces the kernels this compiles."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("triton")

ENV = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}


def python(*args: str, **env: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**ENV, **env})


def finish(process: subprocess.Popen, timeout: int = 600) -> str:
    out, err = process.communicate(timeout=timeout)
    assert process.returncode in (0, 1), err[-3000:]
    return out


@pytest.fixture(scope="module")
def compiled(tmp_path_factory) -> list[dict]:
    # Two processes, one per core: the A100 gets every launch, the others the bounding ones. A cache
    # of their own, so that every launch is compiled and reports its registers.
    cache = str(tmp_path_factory.mktemp("triton-cache"))
    runs = [python("-m", "minillm.kernels.aot", "--json", "--cc", *ccs, TRITON_CACHE_DIR=cache)
            for ccs in (("75", "86", "89"), ("80", "90"))]
    return [row for run in runs for row in json.loads(finish(run))]


def test_every_launch_fits_every_gpu(compiled):
    misfits = [f"{r['target']} {r['kernel']} {r['config']}: {r['shared_bytes']} > {r['max_shared_bytes']}"
               for r in compiled if not r["fits"]]
    assert not misfits, "\n".join(misfits)
    for target in ("T4", "A100", "RTX 3090", "L4", "H100"):
        kernels = {r["kernel"] for r in compiled if r["target"] == target}
        assert {"_ragged_attention_kernel", "_decode_partition_kernel", "_gemv_kernel", "_gemm_kernel",
                "_rms_norm_kernel", "_fused_add_rms_norm_kernel", "_silu_and_mul_kernel", "_rotary_kernel",
                "_fused_rotary_store_kvcache_kernel"} <= kernels, target
        # The fused store into an fp32 pool and, with Qwen3's q/k norm, into an int8 one.
        assert sum(r["kernel"] == "_fused_rotary_store_kvcache_kernel" for r in compiled if r["target"] == target) >= 2
    a100 = {r["kernel"] for r in compiled if r["target"] == "A100"}
    assert {"_merge_partitions_kernel", "_store_kvcache_kernel", "_gemv_row_kernel"} <= a100
    assert any("*bf16" in r["config"] for r in compiled if r["target"] == "A100")
    assert not any("*bf16" in r["config"] for r in compiled if r["target"] == "T4")  # no bf16 before cc 8.0
    # The decode matmuls with one input slice and with several (split-K, reduced in the same launch).
    gemv = {(r["target"], r["kernel"], "SPLIT=True" in r["config"]) for r in compiled if "gemv" in r["kernel"]}
    kernels = ("_gemv_kernel", "_gemv_row_kernel")
    assert {("A100", kernel, split) for kernel in kernels for split in (False, True)} <= gemv


def test_no_16_bit_launch_spills_registers(compiled):
    """ptxas's report, for the code a GPU runs (Triton's specialization of aligned arguments, which
    vectorizes the loads): no fp16 or bf16 launch on any of the five GPUs spills registers to local
    memory. The launchers' tiles per architecture keep it so: on an RTX 3090 or an L4, for one, the
    ragged attention kernel's 32 x 32 tiles spill on 8 warps and not on 4. (The fp32 launches, for
    exactness checks, may spill.)"""
    rows = [r for r in compiled if "*fp32" != r["config"].split()[0]]
    assert {r["target"] for r in rows} == {"T4", "A100", "RTX 3090", "L4", "H100"}
    assert {"_ragged_attention_kernel", "_decode_partition_kernel", "_gemv_kernel", "_gemm_kernel",
            "_gemv_row_kernel"} <= {r["kernel"] for r in rows}
    assert all(r["registers"] is not None for r in rows)  # compiled here, not read from a cache
    spills = [f"{r['target']} {r['kernel']} {r['config']}: {r['spilled_bytes']} bytes" for r in rows
              if r["spilled_bytes"]]
    assert not spills, "\n".join(spills)


def test_the_launchers_shrink_tiles_where_a_gpu_has_less_shared_memory(compiled):
    def decode_fp32(target: str) -> str:
        (row,) = [r for r in compiled if r["target"] == target and r["kernel"] == "_decode_partition_kernel"
                  and r["config"].startswith("*fp32 ")]
        return row["config"]

    # fp32 K and V tiles of 64 tokens at head dim 128 need 72 KiB: more than a T4's 64 KiB per block.
    assert "TILE_N=32" in decode_fp32("T4") and "TILE_N=64" in decode_fp32("H100")


def test_a_tile_too_large_for_a_t4_is_caught():
    script = textwrap.dedent("""
        import json
        from minillm.kernels import aot, paged_decode
        from minillm.kernels.targets import TARGETS

        paged_decode.decode_tile = lambda *args: 128  # twice what the launcher picks for fp16 on a T4
        t4 = TARGETS[75]
        (launch, fn), = [(launch, fn) for launch, fn in aot.engine_launches(t4, everything=False).items()
                         if launch.kernel == "_decode_partition_kernel" and ("q_ptr", "*fp16") in launch.signature]
        result = aot.compile_launch(fn, launch, t4)
        print(json.dumps([result.shared_bytes, result.fits]))
    """)
    shared, fits = json.loads(finish(python("-c", script)).strip().splitlines()[-1])
    assert shared > 64 << 10 and not fits


def test_the_interpreter_is_refused():
    result = subprocess.run([sys.executable, "-m", "minillm.kernels.aot", "--cc", "75"], capture_output=True,
                            text=True, env={**ENV, "TRITON_INTERPRET": "1"}, timeout=120)
    assert result.returncode != 0 and "unset TRITON_INTERPRET" in result.stderr
