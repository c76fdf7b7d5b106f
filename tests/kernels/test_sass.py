"""The instructions the quantized matmuls' inner loops issue per weight byte, read from the machine
code compiled for an H100 (`minillm.kernels.sass`), here on a CPU. At batch 1 an H100 can issue
about 14 instructions for each byte its memory delivers; a loop that needs more is bound by
instructions, not memory. Runs in a subprocess: the interpreter conftest switches on replaces the
kernels this compiles."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("triton")

from minillm.kernels.sass import hot_loop, nvdisasm, tiles_in_flight  # noqa: E402


@pytest.fixture(scope="module")
def costs() -> dict:
    if not nvdisasm().is_file():
        pytest.skip("this triton ships no nvdisasm")
    script = textwrap.dedent("""
        import json
        import torch
        from minillm.kernels.sass import prefill_attention_loop, prefill_tiles_in_flight, quant_matmul_costs
        from minillm.kernels.targets import TARGETS

        costs = {f"{method} {rows}": [cost.per_byte, dict(cost.mix), cost.registers]
                 for method, rows, cost in quant_matmul_costs(TARGETS[90])}
        (_, _, bf16), = quant_matmul_costs(TARGETS[90], (1,), torch.bfloat16, ("int4",))
        costs["int4 1 bf16"] = [bf16.per_byte, dict(bf16.mix), bf16.registers]
        costs["attention"] = dict(prefill_attention_loop(TARGETS[90])[1])
        costs["attention tiles in flight"] = [prefill_tiles_in_flight(TARGETS[90], stages) for stages in (None, 5)]
        print(json.dumps(costs))
    """)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_the_one_row_int4_loop_issues_fast_enough_to_read_at_full_bandwidth(costs):
    # 13.8 instructions a byte before each thread kept its own sums over 8 levels a word, 9.6 with
    # them in fp32, 7.0 in the half2 steps of fp16 inputs with 8 barriers a tile (the inputs moved
    # between threads, and their sums taken apart); with the zero point in the step and the inputs
    # read in the tile's own layout (quant_half2.py), 6.7 (5.0 TB/s at most) and 2 barriers: the
    # rows' scales and zero points, read one a thread, handed to the threads that use them. In 128
    # registers, an SM holds 4 programs of 4 warps, each with a tile's loads in flight.
    per_byte, mix, registers = costs["int4 1"]
    assert per_byte < 7 and mix.get("HFMA2", 0) >= 80 and mix.get("BAR", 0) <= 2 and registers <= 128, mix
    per_byte, mix, registers = costs["int4 1 bf16"]  # 7.2: three shifts where fp16 takes one
    assert per_byte < 7.5 and mix.get("HFMA2", 0) >= 80 and mix.get("BAR", 0) <= 2 and registers <= 128, mix


def test_the_tensor_core_int4_loop_reads_words_too(costs):
    # 14.7 a byte when it unpacked bytes into interleaved fp16 tiles: 2 to 16 rows (a batch, a
    # speculative verification) were capped below the copy bandwidth.
    per_byte, mix, _ = costs["int4 4"]
    assert per_byte < 9.5 and "HMMA" in mix, mix


def test_the_one_row_int8_loop_is_lean(costs):
    per_byte, mix, _ = costs["int8 1"]
    assert per_byte < 7, mix


def test_the_attention_loop_runs_hoppers_matrix_multiplies_among_few_other_instructions(costs):
    # Each 64 x 64 tile of scores: two warpgroup matrix multiplies (QK^T, then PV), 12 instructions
    # on 4 warps, among the softmax's. The scale folded into the exponent's multiply-add took the
    # loop from 471 instructions to 441.
    mix = costs["attention"]
    assert mix.get("HGMMA") == 12, mix
    assert sum(mix.values()) < 460, mix


def test_the_attention_loop_copies_k_and_v_a_tile_ahead_and_two_from_five_stages(costs):
    # Triton's software pipeline turns the paged gather into asynchronous copies; the block table's
    # entries, which the K/V addresses need, take stages of their own, so that the launcher's 2
    # stages keep one tile in flight and a second takes 5 (BENCHMARKS.md). Loading the entries a
    # tile ahead by hand left nothing asynchronous at all (0).
    assert costs["attention tiles in flight"] == [1, 2]


def test_the_hot_loop_is_the_longest_body_a_branch_closes():
    sass = textwrap.dedent("""
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        .L_x_0:
        /*0010*/                   IADD3 R2, R2, 0x1, RZ ;
        /*0020*/               @P0 BRA `(.L_x_0) ;
        .L_x_1:
        /*0030*/                   FFMA R3, R4, R5, R3 ;
        /*0040*/                   LOP3.LUT R6, R6, 0xf, RZ, 0xc0, !PT ;
        /*0050*/              @!P1 BRA `(.L_x_1) ;
        /*0060*/                   BRA `(.L_x_2) ;
        .L_x_2:
        /*0070*/                   EXIT ;
    """)
    assert hot_loop(sass) == ["FFMA", "LOP3", "BRA"]


def test_tiles_in_flight_reads_the_first_loop_with_a_matrix_multiply_of_its_own():
    def loop(*body: str, outer: bool = False) -> str:
        lines = "\n".join(f"  {line}" for line in "\n".join(body).splitlines())
        # A loop that carries no value prints no scf.yield; an scf.if's region closes with one.
        end = "" if outer else "\n  scf.yield %a"
        return f"%r = scf.for %i = %c0 to %n step %c64 iter_args(%a = %x) {{\n{lines}{end}\n}}"

    search = loop("%m = tt.load %p : !tt.ptr<i32>")  # the binary search: no dot, not counted
    copies = [op for i in range(3) for op in (f"%c{i} = ttg.async_copy_global_to_local %p{i}",
                                              f"%g{i} = ttg.async_commit_group tokens %c{i}")]
    two_ahead = loop("%w = ttg.async_wait %t0, %t1, %t2 {num = 3 : i32}", "%s = ttng.warp_group_dot %q, %k, %z",
                     "%y = scf.if %b -> (i32) {", "  scf.yield %u", "} else {", "  scf.yield %v", "}", *copies)
    one_ahead = loop("%w = ttg.async_wait %t0, %t1, %t2 {num = 0 : i32}", "%s = tt.dot %q, %k, %z", *copies)
    assert tiles_in_flight("\n".join([search, two_ahead, one_ahead])) == 2
    assert tiles_in_flight("\n".join([search, one_ahead, two_ahead])) == 1
    assert tiles_in_flight("\n".join([search, loop("%k = tt.load %p", "%s = tt.dot %q, %k, %z")])) == 0  # not async
    # A persistent kernel: the outer loop's prologue commits copies, the inner loop with the dot
    # (two ahead) is the one read, whatever the outer loop around it holds.
    persistent = loop(*copies, *copies, two_ahead, "tt.store %o, %s", outer=True)
    assert tiles_in_flight(persistent) == 2
