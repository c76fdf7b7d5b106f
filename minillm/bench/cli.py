"""`minillm bench ...`: each benchmark's arguments, and how its results are printed and written."""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
from collections.abc import Callable
from pathlib import Path

from minillm.bench.attention import parse_tiling
from minillm.bench.shapes import SHAPES
from minillm.quant import INT4_GROUP_SIZES, QUANTIZATION_METHODS
from minillm.utils.arg_types import int_in, json_object, parsed_by

tiling = parsed_by(parse_tiling)


def _bench_kv_cache(args) -> None:
    from minillm.bench.kv_cache import COLUMNS, bench_kv_cache
    from minillm.bench.report import format_table, write_json

    rows, summary = bench_kv_cache(args.model, tuple(args.lengths), args.decode_tokens,
                                   device=args.device, dtype=args.dtype)
    print(format_table(rows, COLUMNS))
    print(json.dumps(summary))
    config = {"model": args.model, "lengths": args.lengths, "decode_tokens": args.decode_tokens,
              "device": args.device, "dtype": args.dtype}
    write_json(args.out, "kv-cache", config, rows, summary)
    print(f"wrote {args.out}")


def _bench_kernels(args) -> None:
    from minillm.bench.kernels import COLUMNS, bench_kernels
    from minillm.bench.report import format_table, write_json

    rows, summary = bench_kernels(tuple(args.models), tuple(args.kernels), args.batch, args.steps,
                                  device=args.device, dtype=args.dtype)
    print(format_table(rows, COLUMNS))
    for row in rows:
        print(f"the last layer of {row['model']} ({row['kernel']}): " + ", ".join(f"{op} {n}" for op, n in
                                                                                       row["layer_ops"].items()))
    write_json(args.out, "kernels", _bench_config(args), rows, summary)
    print(f"wrote {args.out}")


def _bench_config(args) -> dict:
    """The benchmark's arguments as they go into its JSON: what was measured, not where it went."""
    return {k: v for k, v in vars(args).items() if k not in ("func", "out", "command", "benchmark")}


def _bench_paged(args) -> None:
    from minillm.bench.paged import MEMORY_COLUMNS, PREFIX_COLUMNS, bench_memory, bench_prefix_cache
    from minillm.bench.report import format_table, write_json

    engine_args = {"device": args.device, "dtype": args.dtype}
    memory_rows, memory = bench_memory(args.model, args.num_requests, args.max_tokens, args.budget_blocks,
                                       args.block_size, args.seed, **engine_args)
    print(format_table(memory_rows, MEMORY_COLUMNS))
    print(json.dumps(memory))
    prefix_rows, prefix = bench_prefix_cache(args.model, args.prefix_requests, args.prefix_len, 16, args.seed,
                                             **engine_args)
    print(format_table(prefix_rows, PREFIX_COLUMNS))
    print(json.dumps(prefix))
    burst_rows, burst = bench_prefix_cache(args.model, args.prefix_requests, args.prefix_len, 16, args.seed,
                                           together=True, **engine_args)
    print(format_table(burst_rows, PREFIX_COLUMNS))
    print(json.dumps(burst))
    config = _bench_config(args)
    write_json(args.out, "paged", config, memory_rows + prefix_rows + burst_rows,
               {"memory": memory, "prefix_cache": prefix, "prefix_cache_burst": burst})
    print(f"wrote {args.out}")


def _bench_throughput(args) -> None:
    from minillm.bench.report import format_table, write_json
    from minillm.bench.throughput import COLUMNS, bench_throughput

    rows, summary = bench_throughput(args.model, args.num_requests, args.batch_size, args.max_prompt,
                                     args.max_output, args.seed, device=args.device, dtype=args.dtype)
    print(format_table(rows, COLUMNS))
    print(json.dumps(summary))
    config = _bench_config(args)
    write_json(args.out, "throughput", config, rows, summary)
    print(f"wrote {args.out}")


def _bench_attention(args) -> None:
    from minillm.bench.attention import DECODE_COLUMNS, PREFILL_COLUMNS, TILING_COLUMNS, bench_attention
    from minillm.bench.report import format_table, write_json

    decode, prefill, summary = bench_attention(batch=args.batch, tilings=tuple(args.tilings))
    print(format_table(decode, DECODE_COLUMNS))
    print(format_table(prefill, PREFILL_COLUMNS))
    if summary["tilings"]:
        print(format_table(summary["tilings"], TILING_COLUMNS))
    print(json.dumps(summary))
    write_json(args.out, "attention", {"batch": args.batch}, decode + prefill, summary)
    print(f"wrote {args.out}")


def _bench_decode(args) -> None:
    from minillm.bench.decode import DECODE_COLUMNS, PREFILL_COLUMNS, bench_decode
    from minillm.bench.random_llama import write_llama_config
    from minillm.bench.report import format_table, write_json

    with tempfile.TemporaryDirectory(prefix="minillm-shape-") as folder:
        # A shape: its config alone on disk, the weights made at random on the device.
        model = args.model if args.shape is None else str(write_llama_config(folder, **SHAPES[args.shape]))
        decode, prefill, summary = bench_decode(model, tuple(args.batches), args.context, args.steps,
                                                tuple(args.prefill_lens), device=args.device, dtype=args.dtype,
                                                modes=tuple(args.modes), quantization=args.quantization,
                                                load_format="auto" if args.shape is None else "dummy")
    print(format_table(decode, DECODE_COLUMNS))
    if prefill:
        print(format_table(prefill, PREFILL_COLUMNS))
    print(json.dumps(summary))
    write_json(args.out, "decode", _bench_config(args), decode + prefill, summary)
    print(f"wrote {args.out}")


def _bench_quant(args) -> None:
    from minillm.bench.quant import KV_COLUMNS, WEIGHT_COLUMNS, bench_quant
    from minillm.bench.report import format_table, write_json

    weights, kv, matmuls, summary = bench_quant(
        args.model, args.text, tuple(args.group_sizes), window=args.window, num_prompts=args.num_prompts,
        num_tokens=args.num_tokens, max_eval_tokens=args.max_eval_tokens, device=args.device, dtype=args.dtype)
    print(format_table(weights, WEIGHT_COLUMNS))
    print(format_table(kv, KV_COLUMNS))
    if matmuls:
        from minillm.bench.quant_matmul import COLUMNS

        print(format_table(matmuls, COLUMNS))
    else:
        print("(no CUDA device: the matmul kernels are timed only on a GPU)")
    print(json.dumps(summary))
    write_json(args.out, "quant", _bench_config(args), weights + kv + matmuls, summary)
    print(f"wrote {args.out}")


def _bench_step(args) -> None:
    from minillm.bench.report import format_table, write_json
    from minillm.bench.step import CAPTION, COLUMNS, bench_step

    rows, summary = bench_step(args.model, args.batch_sizes, args.steps, args.device, args.dtype, args.baseline,
                               args.speculative_config, args.async_scheduling)
    print(CAPTION)
    print(format_table(rows, COLUMNS))
    print(json.dumps(summary))
    write_json(args.out, "step", _bench_config(args), rows, summary)
    print(f"wrote {args.out}")


def _bench_spec(args) -> None:
    from minillm.bench.report import format_table, write_json
    from minillm.bench.spec import COLUMNS, bench_spec

    rows, summary = bench_spec(args.model, args.draft, args.ks, args.batch_sizes, args.temperatures,
                               args.num_tokens, args.methods, args.device, args.dtype)
    print(format_table(rows, COLUMNS))
    print(json.dumps(summary))
    write_json(args.out, "spec", _bench_config(args), rows, summary)
    print(f"wrote {args.out}")


def _bench_serve(args) -> None:
    from minillm.bench.report import format_table, write_json
    from minillm.bench.serve import COLUMNS, bench_serve
    from minillm.bench.serve_workload import rate_label

    limits = {"max_num_seqs": args.max_num_seqs, "max_num_batched_tokens": args.max_num_batched_tokens}
    engine_args = {"device": args.device, "dtype": args.dtype, **{k: v for k, v in limits.items() if v is not None}}
    slo = dict(args.goodput or []) or None
    rows, summary = asyncio.run(bench_serve(
        args.model, base_url=args.base_url, api_key=args.api_key, num_prompts=args.num_prompts,
        input_len=args.input_len, output_len=args.output_len, request_rates=args.request_rate,
        max_concurrency=args.max_concurrency, slo=slo, seed=args.seed, **engine_args))
    print(format_table(rows, COLUMNS))
    print(json.dumps(summary))
    # The key stays out of the JSON; infinity is not JSON.
    config = {k: v for k, v in _bench_config(args).items() if k != "api_key"}
    config.update(request_rate=[rate_label(r) for r in args.request_rate], goodput=slo)
    write_json(args.out, "serve", config, rows, summary)
    print(f"wrote {args.out}")


def add_bench_commands(sub: argparse._SubParsersAction, model_args: Callable[[argparse.ArgumentParser], None],
                       text_arg: Callable[[argparse.ArgumentParser], None]) -> None:
    """`minillm bench NAME ...`; model_args and text_arg add the arguments shared with other commands."""
    bench = sub.add_parser("bench", help="benchmarks").add_subparsers(dest="benchmark", required=True)

    def bench_command(name, help, func, *, model=True):
        """A benchmark's subcommand: the model arguments (unless it makes its own inputs), and --out."""
        p = bench.add_parser(name, help=help)
        if model:
            model_args(p)
        p.add_argument("--out", type=Path, default=Path(f"bench-results/{name}.json"))
        p.set_defaults(func=func)
        return p

    kv = bench_command("kv-cache", "decode tokens/s with and without the KV cache", _bench_kv_cache)
    kv.add_argument("--lengths", type=int_in(1), nargs="+", default=[64, 128, 256, 512, 1024])
    kv.add_argument("--decode-tokens", type=int_in(1), default=32)
    paged = bench_command("paged", "paged against contiguous KV memory, and prefix caching", _bench_paged)
    paged.add_argument("--num-requests", type=int_in(1), default=48)
    paged.add_argument("--max-tokens", type=int_in(1), default=1024, help="the cap each request sets")
    paged.add_argument("--block-size", type=int_in(1), default=16)
    paged.add_argument("--budget-blocks", type=int_in(1), default=256, help="the fixed KV budget, in blocks")
    paged.add_argument("--prefix-requests", type=int_in(1), default=32)
    paged.add_argument("--prefix-len", type=int_in(1), default=256)
    paged.add_argument("--seed", type=int, default=0)
    tput = bench_command("throughput", "continuous against static batching and transformers generate",
                         _bench_throughput)
    tput.add_argument("--num-requests", type=int_in(1), default=64)
    tput.add_argument("--batch-size", type=int_in(1), default=16, help="requests served at once (max_num_seqs)")
    tput.add_argument("--max-prompt", type=int_in(1), default=512)
    tput.add_argument("--max-output", type=int_in(1), default=512)
    tput.add_argument("--seed", type=int, default=0)
    attn = bench_command("attention", "Triton attention kernels against memory bandwidth and SDPA (CUDA)",
                         _bench_attention, model=False)
    attn.add_argument("--batch", type=int_in(1), default=8)
    attn.add_argument("--tilings", type=tiling, nargs="*", default=[], metavar="MxNxW[xS]",
                      help="also time the ragged prefill kernel at these BLOCK_M x BLOCK_N x warps (e.g. 64x32x8), "
                           "and pipeline stages where a fourth field gives them")
    dec = bench_command("decode", "the roofline of a step: decode at rising batch sizes (eager and CUDA graphs) "
                        "and prefill, against the measured copy bandwidth and matmul peak", _bench_decode)
    dec.add_argument("--batches", type=int_in(1), nargs="+", default=[1, 2, 4, 8, 16, 32, 64, 128, 256])
    dec.add_argument("--context", type=int_in(1), default=512, help="tokens already in each sequence's cache")
    dec.add_argument("--steps", type=int_in(1), default=10, help="decode steps timed per batch size")
    dec.add_argument("--prefill-lens", type=int_in(1), nargs="*", default=[128, 512, 2048, 8192])
    dec.add_argument("--modes", nargs="+", default=["eager", "graphs", "async"], choices=["eager", "graphs", "async"])
    dec.add_argument("--quantization", default=None, choices=list(QUANTIZATION_METHODS),
                     help="the decoder's linear layers quantized while loading (int4 in groups of 128)")
    dec.add_argument("--shape", default=None, choices=list(SHAPES),
                     help="instead of --model: a Llama of this shape with random weights made on the device "
                          "(load_format='dummy'; nothing written but its config)")
    quant_bench = bench_command("quant", "weight bytes, perplexity and tokens/s of each quantization scheme, the "
                                "int8 KV cache, and (CUDA) the matmul kernels against fp16", _bench_quant)
    text_arg(quant_bench)
    quant_bench.add_argument("--group-sizes", type=int_in(1), nargs="+", default=list(INT4_GROUP_SIZES))
    quant_bench.add_argument("--window", type=int_in(1), default=512)
    quant_bench.add_argument("--max-eval-tokens", type=int_in(1), default=None, help="cut the held-out text")
    quant_bench.add_argument("--num-prompts", type=int_in(1), default=32)
    quant_bench.add_argument("--num-tokens", type=int_in(1), default=32)
    kern = bench_command("kernels", "kernel launches per decoder layer per decode step (the dispatcher's count; "
                         "on CUDA the profiler's too)", _bench_kernels, model=False)
    kern.add_argument("--models", nargs="+", default=["tiny"])
    kern.add_argument("--kernels", nargs="+", default=["auto"], choices=["auto", "torch", "triton"])
    kern.add_argument("--batch", type=int_in(1), default=1)
    kern.add_argument("--steps", type=int_in(1), default=3, help="decode steps counted")
    kern.add_argument("--device", default=None)
    kern.add_argument("--dtype", default="auto")
    step = bench_command("step", "host time of a decode step by phase (schedule, prepare, execute, sample, "
                         "update), here and at another git revision", _bench_step)
    step.add_argument("--batch-sizes", type=int_in(1), nargs="+", default=[1, 16, 64])
    spec = bench_command("spec", "plain against speculative decoding: tokens per call, cost model, speedup",
                         _bench_spec)
    spec.add_argument("--draft", default="tiny-draft", help="the draft model of the draft_model method")
    spec.add_argument("--methods", nargs="+", default=None, choices=["draft_model", "ngram", "draft=target"],
                      help="default: all three")
    spec.add_argument("--ks", type=int_in(1), nargs="+", default=[1, 2, 3, 4, 5, 6, 7, 8])
    spec.add_argument("--batch-sizes", type=int_in(1), nargs="+", default=[1, 4, 16, 64])
    spec.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 0.8])
    spec.add_argument("--num-tokens", type=int_in(1), default=128, help="generated per request")
    step.add_argument("--steps", type=int_in(1), default=50, help="decode steps timed per batch size")
    step.add_argument("--baseline", metavar="REV", default=None,
                      help="also measure this git revision's engine (a worktree, or a folder of its tree), and compare")
    step.add_argument("--speculative-config", type=json_object, default=None, metavar="JSON",
                      help='every step speculates, e.g. \'{"model": "tiny-draft", "num_speculative_tokens": 4}\': '
                           "its phases are then propose, prepare, execute and verify")
    step.add_argument("--async-scheduling", action="store_true", help="queue each step before the last is read")
    _add_serve(bench_command("serve", "an OpenAI-compatible server under load over HTTP, streaming: TTFT, TPOT, "
                             "ITL, throughput and goodput at each request rate", _bench_serve))


def _add_serve(p: argparse.ArgumentParser) -> None:
    from minillm.bench.serve_workload import parse_range, parse_rates, parse_slo

    p.add_argument("--base-url", default=None,
                   help="a running server, http://host:port (default: start one here with the model arguments)")
    p.add_argument("--api-key", default=None, help="the server's key, if it has one")
    p.add_argument("--num-prompts", type=int_in(1), default=64, help="requests sent at each rate")
    p.add_argument("--input-len", type=parsed_by(parse_range), default="16:128",
                   help="prompt tokens, N or LOW:HIGH (drawn uniformly)")
    p.add_argument("--output-len", type=parsed_by(parse_range), default="16:64",
                   help="generated tokens, N or LOW:HIGH (drawn uniformly; end-of-text is ignored)")
    p.add_argument("--request-rate", type=parsed_by(parse_rates), default="inf",
                   help="requests/s with Poisson arrivals, inf for all at once; a list like 1,2,4,inf is a sweep")
    p.add_argument("--max-concurrency", type=int_in(1), default=None, help="at most this many requests in flight")
    p.add_argument("--goodput", type=parsed_by(parse_slo), nargs="+", default=None, metavar="METRIC:MS",
                   help="an SLO, e.g. ttft:500 tpot:100 (ttft, tpot, e2el in ms): goodput counts the requests "
                   "that meet all of it (default: no SLO, no goodput)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-num-seqs", type=int_in(1), default=None, help="of the server started here")
    p.add_argument("--max-num-batched-tokens", type=int_in(1), default=None, help="of the server started here")
