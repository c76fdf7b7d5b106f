"""The `minillm` command: generate, quantize, env, bench, eval."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from minillm.quant import INT4_GROUP_SIZES, QUANTIZATION_METHODS


def _generate(args) -> None:
    from minillm import LLM, SamplingParams

    llm = LLM(args.model, device=args.device, dtype=args.dtype)
    params = SamplingParams(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                            max_tokens=args.max_tokens, seed=args.seed)
    if args.stream:
        print(args.prompt, end="", flush=True)
        for piece in llm.stream(args.prompt, params):
            print(piece, end="", flush=True)
        print()
    else:
        print(args.prompt + llm.generate([args.prompt], params, use_tqdm=False)[0].outputs[0].text)


def _quantize(args) -> None:
    from minillm import LLM
    from minillm.config import ModelConfig
    from minillm.loader import resolve_model_path
    from minillm.quant.checkpoint import save_quantized

    # "auto" keeps the checkpoint's dtype (on a CPU the engine's auto would be float32).
    dtype = args.dtype
    if dtype == "auto":
        dtype = ModelConfig.from_dir(resolve_model_path(args.model)).checkpoint_dtype.removeprefix("torch.")
    llm = LLM(args.model, device=args.device, dtype=dtype, quantization=args.quantization,
              quant_group_size=args.group_size, skip_tokenizer_init=True)
    print(f"wrote {save_quantized(llm, args.output)}")


def _env(args) -> None:
    from minillm.env import collect_env, format_env

    info = collect_env()
    print(json.dumps(info, indent=2) if args.json else format_env(info))


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
    config = _bench_config(args)
    write_json(args.out, "paged", config, memory_rows + prefix_rows, {"memory": memory, "prefix_cache": prefix})
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
    from minillm.bench.attention import DECODE_COLUMNS, PREFILL_COLUMNS, bench_attention
    from minillm.bench.report import format_table, write_json

    decode, prefill, summary = bench_attention(batch=args.batch)
    print(format_table(decode, DECODE_COLUMNS))
    print(format_table(prefill, PREFILL_COLUMNS))
    print(json.dumps(summary))
    write_json(args.out, "attention", {"batch": args.batch}, decode + prefill, summary)
    print(f"wrote {args.out}")


def _bench_decode(args) -> None:
    from minillm.bench.decode import DECODE_COLUMNS, PREFILL_COLUMNS, bench_decode
    from minillm.bench.report import format_table, write_json

    decode, prefill, summary = bench_decode(args.model, tuple(args.batches), args.context, args.steps,
                                            tuple(args.prefill_lens), device=args.device, dtype=args.dtype)
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


def _eval_perplexity(args) -> None:
    from minillm import LLM
    from minillm.eval.heldout import eval_token_ids
    from minillm.eval.perplexity import perplexity

    if args.text is None and args.model not in ("tiny", "tiny-draft"):
        raise ValueError("--text FILE is needed for models other than tiny / tiny-draft")
    if args.quantization is None:
        llm = LLM(args.model, device=args.device, dtype=args.dtype)
        result = perplexity(llm, eval_token_ids(llm.get_tokenizer(), args.text), window=args.window)
        print(json.dumps({"model": args.model, "text": args.text or "held-out stdlib modules", **result}, indent=2))
        return
    from minillm.bench.report import format_table
    from minillm.eval.quantization import compare_quantization
    from minillm.loader import load_tokenizer, resolve_model_path

    token_ids = eval_token_ids(load_tokenizer(resolve_model_path(args.model)), args.text)
    methods = [(args.quantization, args.group_size)]
    rows = compare_quantization(args.model, token_ids, methods, window=args.window, device=args.device,
                                dtype=args.dtype)
    print(format_table(rows, QUANT_COLUMNS))
    print(json.dumps(rows, indent=2))


QUANT_COLUMNS = [("quantization", "quantization"), ("group_size", "group"), ("perplexity", "perplexity"),
                 ("perplexity_change", "change"), ("greedy_agreement", "greedy agreement"),
                 ("weight_bytes", "linear weight bytes"), ("bytes_vs_fp16", "bytes vs fp16")]


def _eval_acceptance(args) -> None:
    from minillm import LLM
    from minillm.eval.acceptance import greedy_acceptance, sample_prompts
    from minillm.eval.heldout import eval_token_ids

    target = LLM(args.model, device=args.device, dtype=args.dtype)
    draft = LLM(args.draft, device=args.device, dtype=args.dtype)
    prompts = sample_prompts(eval_token_ids(target.get_tokenizer(), args.text), args.num_prompts,
                             args.prompt_len, seed=args.seed)
    result = greedy_acceptance(target, draft, prompts, num_tokens=args.num_tokens, k=args.k)
    print(json.dumps({"target": args.model, "draft": args.draft, **result}, indent=2))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="minillm", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    def model_args(p, model="tiny"):
        p.add_argument("--model", default=model, help="'tiny', 'tiny-draft', a local HF folder or a Hub id")
        p.add_argument("--device", default=None, help="cuda, mps or cpu (default: the best available)")
        p.add_argument("--dtype", default="auto")

    def text_arg(p):
        p.add_argument("--text", default=None, help="a text file (default for tiny: held-out stdlib modules)")

    def group_size_arg(p):
        p.add_argument("--group-size", type=int, default=128, help="int4 group size: 32, 64 or 128")

    gen = sub.add_parser("generate", help="complete a prompt")
    gen.add_argument("prompt")
    model_args(gen)
    gen.add_argument("--max-tokens", type=int, default=64)
    gen.add_argument("--temperature", type=float, default=0.8)
    gen.add_argument("--top-p", type=float, default=0.95)
    gen.add_argument("--top-k", type=int, default=0)
    gen.add_argument("--seed", type=int, default=0)
    gen.add_argument("--stream", action="store_true", help="print text as it is generated")
    gen.set_defaults(func=_generate)

    quant = sub.add_parser("quantize", help="save a model quantized (safetensors), for LLM(folder) to load")
    model_args(quant)
    quant.add_argument("--quantization", choices=QUANTIZATION_METHODS, required=True)
    group_size_arg(quant)
    quant.add_argument("--output", type=Path, required=True, help="a new folder")
    quant.set_defaults(func=_quantize)

    env = sub.add_parser("env", help="print the environment (paste it into bug reports)")
    env.add_argument("--json", action="store_true")
    env.set_defaults(func=_env)

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
    kv.add_argument("--lengths", type=int, nargs="+", default=[64, 128, 256, 512, 1024])
    kv.add_argument("--decode-tokens", type=int, default=32)
    paged = bench_command("paged", "paged against contiguous KV memory, and prefix caching", _bench_paged)
    paged.add_argument("--num-requests", type=int, default=48)
    paged.add_argument("--max-tokens", type=int, default=1024, help="the cap each request sets")
    paged.add_argument("--block-size", type=int, default=16)
    paged.add_argument("--budget-blocks", type=int, default=256, help="the fixed KV budget, in blocks")
    paged.add_argument("--prefix-requests", type=int, default=32)
    paged.add_argument("--prefix-len", type=int, default=256)
    paged.add_argument("--seed", type=int, default=0)
    tput = bench_command("throughput", "continuous against static batching and transformers generate",
                         _bench_throughput)
    tput.add_argument("--num-requests", type=int, default=64)
    tput.add_argument("--batch-size", type=int, default=16, help="requests served at once (max_num_seqs)")
    tput.add_argument("--max-prompt", type=int, default=512)
    tput.add_argument("--max-output", type=int, default=512)
    tput.add_argument("--seed", type=int, default=0)
    attn = bench_command("attention", "Triton attention kernels against memory bandwidth and SDPA (CUDA)",
                         _bench_attention, model=False)
    attn.add_argument("--batch", type=int, default=8)
    dec = bench_command("decode", "the roofline of a step: decode at rising batch sizes (eager and CUDA graphs) "
                        "and prefill, against the measured copy bandwidth and matmul peak", _bench_decode)
    dec.add_argument("--batches", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64, 128, 256])
    dec.add_argument("--context", type=int, default=512, help="tokens already in each sequence's cache")
    dec.add_argument("--steps", type=int, default=10, help="decode steps timed per batch size")
    dec.add_argument("--prefill-lens", type=int, nargs="*", default=[128, 512, 2048, 8192])
    quant_bench = bench_command("quant", "weight bytes, perplexity and tokens/s of each quantization scheme, the "
                                "int8 KV cache, and (CUDA) the matmul kernels against fp16", _bench_quant)
    text_arg(quant_bench)
    quant_bench.add_argument("--group-sizes", type=int, nargs="+", default=list(INT4_GROUP_SIZES))
    quant_bench.add_argument("--window", type=int, default=512)
    quant_bench.add_argument("--max-eval-tokens", type=int, default=None, help="cut the held-out text")
    quant_bench.add_argument("--num-prompts", type=int, default=32)
    quant_bench.add_argument("--num-tokens", type=int, default=32)

    ev = sub.add_parser("eval", help="model quality").add_subparsers(dest="evaluation", required=True)
    ppl = ev.add_parser("perplexity", help="perplexity on held-out text")
    model_args(ppl)
    text_arg(ppl)
    ppl.add_argument("--window", type=int, default=512)
    ppl.add_argument("--quantization", choices=QUANTIZATION_METHODS, default=None,
                     help="also evaluate the model quantized, against itself unquantized")
    group_size_arg(ppl)
    ppl.set_defaults(func=_eval_perplexity)
    acc = ev.add_parser("acceptance", help="greedy acceptance rate of a draft model")
    model_args(acc)
    acc.add_argument("--draft", default="tiny-draft")
    acc.add_argument("-k", type=int, default=4, help="draft tokens proposed per target call")
    acc.add_argument("--text", default=None)
    acc.add_argument("--num-prompts", type=int, default=32)
    acc.add_argument("--prompt-len", type=int, default=64)
    acc.add_argument("--num-tokens", type=int, default=64)
    acc.add_argument("--seed", type=int, default=0)
    acc.set_defaults(func=_eval_acceptance)
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    try:
        args.func(args)
    except ValueError as e:  # bad input: a clear message, not a traceback
        print(f"minillm: error: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
