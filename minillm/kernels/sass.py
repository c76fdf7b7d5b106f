"""What a quantized matmul's inner loop issues per weight byte, read from the machine code compiled
for a GPU, on a machine with no GPU.

At batch 1 a matmul reads each weight byte once and does a few operations with it, so it should be
bound by memory. It is bound by instructions instead when its loop issues too many of them per byte:
each of an SM's 4 schedulers issues at most one warp instruction (32 lanes) a clock, so an H100 (132
SMs at 1.98 GHz) issues about 33 T lane-instructions a second, and reading its 2.4 TB/s of copy
bandwidth leaves about 14 instructions a byte at best; in practice, with loads waiting, fewer.

Each launch is compiled as `aot.py` does (for the GPU's architecture, specialized as Triton's JIT
specializes it), disassembled with the `nvdisasm` that ships with Triton, and its hot loop found:
the longest body that a backward branch closes. Per loop iteration one thread handles
BLOCK_N x BLOCK_K weights / (32 x warps), so the instructions in the body over the bytes a thread
reads in one iteration is what a byte costs. Beside it: the registers a thread takes (`cuobjdump`;
an SM's 64 K registers bound how many warps it holds to wait on memory) and the loop's barriers
(`BAR`: where all of a program's warps wait for each other, mostly to pass values between
threads through shared memory).

    python -m minillm.kernels.sass        # the int4 and int8 matmuls at 1 and 4 rows (the one-row
                                          # int4 loop also in fp32 and with bf16 inputs), and the
                                          # ragged attention kernel's loop and how many tiles of
                                          # K and V its pipeline keeps in flight, on an H100

Triton's interpreter must be off (TRITON_INTERPRET unset), as for `aot.py`.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from minillm.kernels.aot import Launch, compiled_kernel, launch_of, record_launches
from minillm.kernels.targets import TARGETS, GPUSpec, aot_target

if TYPE_CHECKING:
    from triton.runtime.jit import JITFunction

ISSUE_PER_CLOCK = 4 * 32  # lane-instructions an SM issues a clock: 4 schedulers, one warp instruction each
_INSTRUCTION = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[T\d]+\s+)?([A-Z][A-Z0-9_]*)")
_LABEL = re.compile(r"^\s*(\.L_x_\d+):")
_BRANCH = re.compile(r"\bBRA\b.*?(\.L_x_\d+)")


@dataclass
class LoopCost:
    kernel: str
    config: str
    instructions: int  # in the hot loop's body, per thread and iteration
    bytes_per_iteration: float  # weight bytes one thread reads in an iteration
    mix: Counter  # instructions by opcode
    registers: int  # a thread's

    @property
    def per_byte(self) -> float:
        return self.instructions / self.bytes_per_iteration

    def issue_ceiling(self, target: GPUSpec) -> float:
        """Bytes a second the GPU could read if it issued one instruction every clock of every
        scheduler and nothing else limited it (bytes/s)."""
        return target.num_sms * target.clock_ghz * 1e9 * ISSUE_PER_CLOCK / self.per_byte


def nvidia_tool(name: str) -> Path:
    """A binary that ships with Triton's NVIDIA backend (nvdisasm, cuobjdump)."""
    import triton

    return Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / name


def nvdisasm() -> Path:
    return nvidia_tool("nvdisasm")


def loop_bodies(sass: str) -> list[list[str]]:
    """The opcodes of each loop body in a disassembly, in the code's order: from a label to the
    branch back to it."""
    lines = sass.splitlines()
    labels = {m.group(1): i for i, line in enumerate(lines) if (m := _LABEL.match(line))}
    bodies = []
    for i, line in enumerate(lines):
        m = _BRANCH.search(line)
        if m and labels.get(m.group(1), i) < i:
            bodies.append([op.group(1) for op in map(_INSTRUCTION.search, lines[labels[m.group(1)]:i + 1]) if op])
    return bodies


def hot_loop(sass: str) -> list[str]:
    """The instructions of the longest loop body in a disassembly."""
    return max(loop_bodies(sass), key=len, default=[])


def machine_code(fn, launch, target: GPUSpec) -> tuple[str, int]:
    """The launch's machine code for the target, as text, and the registers a thread takes (which
    bound how many warps an SM holds)."""
    kernel = compiled_kernel(fn, launch, target)
    with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
        cubin.write(kernel.asm["cubin"])
        cubin.flush()
        text = subprocess.run([str(nvdisasm()), "-c", cubin.name], capture_output=True, text=True, check=True).stdout
        usage = subprocess.run([str(nvidia_tool("cuobjdump")), "--dump-resource-usage", cubin.name],
                               capture_output=True, text=True, check=True).stdout
    return text, int(re.search(r"REG:(\d+)", usage).group(1))


def loop_cost(fn, args: tuple, kwargs: dict, target: GPUSpec, weight_bits: int) -> LoopCost:
    """The hot loop of a recorded launch; kwargs may override its constexprs (HALF2=False)."""
    launch = launch_of(fn, args, kwargs)
    text, registers = machine_code(fn, launch, target)
    body = hot_loop(text)
    constexprs, options = dict(launch.constexprs), dict(launch.options)
    threads = 32 * options.get("num_warps", 4)
    config = ", ".join(f"{k}={v}" for k, v in {**constexprs, **options}.items() if k.startswith(("BLOCK", "num_w")))
    return LoopCost(fn.__name__, config, len(body),
                    constexprs["BLOCK_N"] * constexprs["BLOCK_K"] * weight_bits / 8 / threads, Counter(body), registers)


def quant_matmul_costs(target: GPUSpec, rows: tuple[int, ...] = (1, 4), dtype: torch.dtype = torch.float16,
                       methods: tuple[str, ...] = ("int4", "int8"),
                       overrides: dict | None = None) -> list[tuple[str, int, LoopCost]]:
    """(method, rows, cost) of the int4 (groups of 128) and int8 decode matmuls of a 4096 x 4096
    layer in `dtype` on `target`; overrides: constexprs forced on the launches (HALF2=False: the
    one-row int4 kernel's fp32 products)."""
    from minillm.kernels.quant_matmul import int4_matmul, int8_matmul
    from minillm.quant.int4 import quantize_int4
    from minillm.quant.int8 import quantize_int8

    weight = torch.randn(4096, 4096).to(dtype)
    matmuls = {"int4": (lambda x: int4_matmul(x, *quantize_int4(weight, 128), 128), 4),
               "int8": (lambda x: int8_matmul(x, *quantize_int8(weight)), 8)}
    costs = []
    for method in methods:
        matmul, bits = matmuls[method]
        for n in rows:
            with aot_target(target), record_launches() as records:
                matmul(torch.randn(n, 4096).to(dtype))
            fn, args, kwargs = records[0]
            costs.append((method, n, loop_cost(fn, args, {**kwargs, **(overrides or {})}, target, bits)))
    return costs


def loop_bodies_ir(ttgir: str) -> list[str]:
    """The `scf.for` loops of Triton's IR in the order they open, each as its own operations: the
    lines of the regions nested in it (`scf.if`, a reduction's combiner) count as its own, those of
    a loop nested in it as that loop's."""
    bodies: list[list[str]] = []
    frames: list[int | None] = []  # per open region: the loop's index in bodies, None for other regions
    for line in ttgir.splitlines():
        text = line.strip()
        if text.startswith("}") and frames:
            frames.pop()
        if text.endswith("{"):
            opens_loop = "scf.for " in text
            if opens_loop:
                bodies.append([])
            frames.append(len(bodies) - 1 if opens_loop else None)
        elif not text.startswith("}"):
            loop = next((index for index in reversed(frames) if index is not None), None)
            if loop is not None:
                bodies[loop].append(text)
    return ["\n".join(body) for body in bodies]


def tiles_in_flight(ttgir: str) -> int:
    """How many tiles ahead the first loop with a matrix multiply of its own copies its operands in,
    read from Triton's IR after software pipelining: the loop waits at its top for the oldest copies,
    leaving `num` groups pending, and commits a group for each copy it issues (K, V, and the block
    table's entries where those are copied too), so the copies it waits for were issued at least
    1 + pending // groups iterations before. 0: the loop's loads are not asynchronous (so on every
    GPU before sm_80, where Triton issues no asynchronous copies)."""
    for body in loop_bodies_ir(ttgir):
        if not re.search(r"\b(tt\.dot|ttng\.warp_group_dot) ", body):
            continue
        wait = re.search(r"ttg\.async_wait .*?\{num = (\d+)", body)
        groups = body.count("ttg.async_commit_group")
        return 1 + int(wait.group(1)) // groups if wait and groups else 0
    return 0


def _prefill_launch(target: GPUSpec, stages: int | None) -> tuple[JITFunction, Launch]:
    """(kernel, launch) of the ragged attention kernel for one 2,048-token fp16 prompt (32 query heads
    over 8 KV heads, head dim 128) on the target; stages: Triton's pipeline stages, where not the
    launcher's."""
    from minillm.kernels.paged_prefill import paged_prefill_attention
    from minillm.kernels.random_inputs import paged_batch

    k_cache, v_cache, tables, lens = paged_batch([2048], 8, 128, 16, torch.float16, 0, "cpu")
    with aot_target(target), record_launches() as records:
        paged_prefill_attention(torch.randn(2048, 32, 128).half(), k_cache, v_cache,
                                torch.tensor([0, 2048], dtype=torch.int32), lens, tables, 0.1, max_query_len=2048)
    fn, args, kwargs = records[0]
    return fn, launch_of(fn, args, {**kwargs, **({"num_stages": stages} if stages else {})})


def prefill_tiles_in_flight(target: GPUSpec, stages: int | None = None) -> int:
    """How many tiles ahead the ragged attention kernel's loop copies K and V (`tiles_in_flight`),
    compiled for the target; needs Triton's compiler only, not nvdisasm."""
    fn, launch = _prefill_launch(target, stages)
    return tiles_in_flight(compiled_kernel(fn, launch, target).asm["ttgir"])


def prefill_attention_loop(target: GPUSpec) -> tuple[str, Counter]:
    """(config, instructions by opcode) of the ragged attention kernel's loop over the tiles of keys
    below the diagonal (the launch of `_prefill_launch`, at the launcher's stages)."""
    fn, launch = _prefill_launch(target, None)
    # The first loop with matrix multiplies (the binary search for the program's sequence is a loop
    # too): the keys below the diagonal; the diagonal's loop, with its masks, comes after it. Where
    # the compiler took no tensor cores (a T4's tiles), the longest loop.
    bodies = loop_bodies(machine_code(fn, launch, target)[0])
    unmasked = next((body for body in bodies if any("MMA" in op for op in body)), max(bodies, key=len))
    constexprs, options = dict(launch.constexprs), dict(launch.options)
    config = (f"BLOCK_M={constexprs['BLOCK_M']}, BLOCK_N={constexprs['BLOCK_N']}, num_warps={options['num_warps']}, "
              f"num_stages={options['num_stages']}")
    return config, Counter(unmasked)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cc", type=int, default=90, choices=sorted(TARGETS))
    args = parser.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") == "1":
        sys.exit("minillm.kernels.sass compiles for GPUs: unset TRITON_INTERPRET")
    target = TARGETS[args.cc]
    print(f"{target.name}: {target.num_sms} SMs at {target.clock_ghz} GHz; 4096 x 4096 fp16 layer, int4 in groups "
          "of 128")
    print(f"{'method':<9} {'rows':>4}  {'kernel':<17} {'loop':>6} {'bytes':>6} {'per byte':>8} {'ceiling':>10} "
          f"{'regs':>5} {'bars':>5}  most issued")
    # The one-row int4 kernel's fp32 products, which packed arithmetic replaced, and its bf16 inputs.
    variants = [("", quant_matmul_costs(target)),
                (" fp32", quant_matmul_costs(target, (1,), methods=("int4",), overrides={"HALF2": False}))]
    if target.capability >= 80:
        variants.append((" bf16", quant_matmul_costs(target, (1,), torch.bfloat16, ("int4",))))
    for label, costs in variants:
        for method, rows, cost in costs:
            mix = ", ".join(f"{op} {n}" for op, n in cost.mix.most_common(6))
            print(f"{method + label:<9} {rows:>4}  {cost.kernel:<17} {cost.instructions:>6} "
                  f"{cost.bytes_per_iteration:>6.0f} {cost.per_byte:>8.2f} {cost.issue_ceiling(target) / 1e12:>7.2f} "
                  f"TB/s {cost.registers:>5} {cost.mix['BAR']:>5}  {mix}  ({cost.config})")
    config, mix = prefill_attention_loop(target)
    mma = sum(n for op, n in mix.items() if "MMA" in op)
    print(f"\nragged attention, a 2,048-token prompt, head dim 128 ({config}): {mix.total()} instructions a tile of "
          f"keys, {mma} of them matrix multiplies; {', '.join(f'{op} {n}' for op, n in mix.most_common(8))}")
    # The gather through the block table takes pipeline stages of its own (BENCHMARKS.md).
    if target.capability < 80:
        print("K and V are loaded, not copied ahead: Triton issues no asynchronous copies before sm_80")
    else:
        print(f"K and V copied {prefill_tiles_in_flight(target)} tile(s) ahead; with 5 stages, "
              f"{prefill_tiles_in_flight(target, 5)}")


if __name__ == "__main__":
    main()
