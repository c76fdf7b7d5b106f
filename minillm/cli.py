"""The `minillm` command: generate, serve, quantize, env, bench, eval, course (`minillm COMMAND --help` for each)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from minillm.bench.cli import add_bench_commands
from minillm.entrypoints.cli_args import add_serve_args
from minillm.quant import QUANTIZATION_METHODS
from minillm.utils.arg_types import int_in, json_object
from minillm.version import __version__


def _generate(args) -> None:
    from minillm import LLM, SamplingParams

    # Checked before the model loads, so that a bad value is refused at once.
    params = SamplingParams(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                            max_tokens=args.max_tokens, seed=args.seed)
    llm = LLM(args.model, device=args.device, dtype=args.dtype, speculative_config=speculative_config(args))
    if args.stream:
        print(args.prompt, end="", flush=True)
        for piece in llm.stream(args.prompt, params):
            print(piece, end="", flush=True)
        print()
    else:
        print(args.prompt + llm.generate([args.prompt], params, use_tqdm=False)[0].outputs[0].text)


def speculative_config(args) -> dict | None:
    """vLLM's flags: --speculative-config JSON, or its parts, --speculative-model / --speculative-method
    with --num-speculative-tokens (the engine says what is missing or wrong)."""
    if args.speculative_config is not None:
        return args.speculative_config
    parts = (("model", args.speculative_model), ("method", args.speculative_method),
             ("num_speculative_tokens", args.num_speculative_tokens))
    config = {key: value for key, value in parts if value is not None}
    return config or None


def speculative_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--speculative-model", default=None, help="a draft model, e.g. tiny-draft")
    p.add_argument("--speculative-method", default=None, help="ngram (prompt lookup) or draft_model")
    p.add_argument("--num-speculative-tokens", type=int, default=None, help="k, draft tokens per step")
    p.add_argument("--speculative-config", type=json_object, default=None,
                   help="all of it as JSON, as vLLM takes it")


def _serve(args) -> None:
    from minillm.entrypoints.launcher import run_server

    sys.exit(run_server(args, speculative_config(args)))


def _quantize(args) -> None:
    from minillm import LLM
    from minillm.models.loader import resolve_model_path
    from minillm.models.quant_checkpoint import check_output_dir, save_quantized
    from minillm.models.registry import read_model_config

    check_output_dir(args.output)  # before the model loads
    # "auto" keeps the checkpoint's dtype (on a CPU the engine's auto would be float32).
    dtype = args.dtype
    if dtype == "auto":
        dtype = read_model_config(resolve_model_path(args.model)).checkpoint_dtype.removeprefix("torch.")
    llm = LLM(args.model, device=args.device, dtype=dtype, quantization=args.quantization,
              quant_group_size=args.group_size, skip_tokenizer_init=True)
    print(f"wrote {save_quantized(llm.llm_engine.model, llm.llm_engine.model_path, args.output)}")


def _env(args) -> None:
    from minillm.utils.env import collect_env, format_env

    info = collect_env()
    print(json.dumps(info, indent=2) if args.json else format_env(info))


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
    from minillm.models.loader import load_tokenizer, resolve_model_path

    token_ids = eval_token_ids(load_tokenizer(resolve_model_path(args.model)), args.text)
    methods = [(args.quantization, args.group_size)]
    rows = compare_quantization(args.model, token_ids, methods, window=args.window, device=args.device,
                                dtype=args.dtype)
    print(format_table(rows, QUANT_COLUMNS))
    print(json.dumps(rows, indent=2))


def _course(args) -> None:
    from minillm.course.sync import release, sync

    write_files = not args.dry_run
    if args.course_command == "release":
        changed = release(args.root, args.url, args.tag, write_files=write_files)
    else:
        changed = sync(args.root, write_files=write_files)
    for path in changed:
        print(f"{'updated' if write_files else 'would update'} {path}")
    if not changed:
        print("nothing to change")


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
    gen.add_argument("--max-tokens", type=int_in(1), default=64)
    gen.add_argument("--temperature", type=float, default=0.8)
    gen.add_argument("--top-p", type=float, default=0.95)
    gen.add_argument("--top-k", type=int, default=0)
    gen.add_argument("--seed", type=int, default=0)
    gen.add_argument("--stream", action="store_true", help="print text as it is generated")
    speculative_args(gen)
    gen.set_defaults(func=_generate)

    serve = sub.add_parser("serve", help="an OpenAI-compatible HTTP server, as `vllm serve`")
    add_serve_args(serve, speculative_args)
    serve.set_defaults(func=_serve)

    quant = sub.add_parser("quantize", help="save a model quantized (safetensors), for LLM(folder) to load")
    model_args(quant)
    quant.add_argument("--quantization", choices=QUANTIZATION_METHODS, required=True)
    group_size_arg(quant)
    quant.add_argument("--output", type=Path, required=True, help="a new folder")
    quant.set_defaults(func=_quantize)

    env = sub.add_parser("env", help="print the environment (paste it into bug reports)")
    env.add_argument("--json", action="store_true")
    env.set_defaults(func=_env)

    add_bench_commands(sub, model_args, text_arg)

    ev = sub.add_parser("eval", help="model quality").add_subparsers(dest="evaluation", required=True)
    ppl = ev.add_parser("perplexity", help="perplexity on held-out text")
    model_args(ppl)
    text_arg(ppl)
    ppl.add_argument("--window", type=int_in(1), default=512)
    ppl.add_argument("--quantization", choices=QUANTIZATION_METHODS, default=None,
                     help="also evaluate the model quantized, against itself unquantized")
    group_size_arg(ppl)
    ppl.set_defaults(func=_eval_perplexity)
    acc = ev.add_parser("acceptance", help="greedy acceptance rate of a draft model")
    model_args(acc)
    acc.add_argument("--draft", default="tiny-draft")
    acc.add_argument("-k", type=int_in(1), default=4, help="draft tokens proposed per target call")
    acc.add_argument("--text", default=None)
    acc.add_argument("--num-prompts", type=int_in(1), default=32)
    acc.add_argument("--prompt-len", type=int_in(1), default=64)
    acc.add_argument("--num-tokens", type=int_in(1), default=64)
    acc.add_argument("--seed", type=int, default=0)
    acc.set_defaults(func=_eval_acceptance)

    course = sub.add_parser("course", help="the course's setup cells, badges and links, from minillm/course/release.py")
    actions = course.add_subparsers(dest="course_command", required=True)
    actions.add_parser("sync", help="rewrite every setup cell, badge and course link from minillm/course/release.py")
    rel = actions.add_parser("release", help="point the course at another repository and tag (a fork), then sync")
    rel.add_argument("url", help="the repository learners install from, https://github.com/OWNER/NAME")
    rel.add_argument("tag", help=f"its release tag, naming minillm's version (e.g. v{__version__}-spring)")
    for action in actions.choices.values():
        action.add_argument("--root", type=Path, default=Path("."), help="the course repository (default: .)")
        action.add_argument("--dry-run", action="store_true", help="name the files it would change, change none")
        action.set_defaults(func=_course)
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
