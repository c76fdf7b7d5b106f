"""`minillm serve`'s flags: the server's own, and every engine argument under vLLM's flag name."""

from __future__ import annotations

import argparse
import json

from minillm.utils.arg_types import int_in

# A request body past this is refused before it is read: parsing and tokenizing a body holds the
# event loop, which every other client waits on, for a time that grows with its size.
MAX_BODY_BYTES = 16 << 20

# (engine argument, type, help); the flag is the name with dashes, and None leaves the engine's default.
ENGINE_ARGS: tuple[tuple[str, type, str], ...] = (
    ("device", str, "cuda, mps or cpu (default: the best available)"),
    ("dtype", str, "auto, float32, float16 or bfloat16"),
    ("max_model_len", int, "context length (default: the model's)"),
    ("max_num_seqs", int, "sequences running at once"),
    ("max_num_batched_tokens", int, "tokens per step; longer prompts are prefilled in chunks"),
    ("scheduling_policy", str, "who joins each step, and its token budget: fcfs (first come, first served, "
                               "up to max_num_batched_tokens; a policy object goes in through the Python API)"),
    ("block_size", int, "tokens per KV block"),
    ("num_kv_blocks", int, "KV blocks (default: what --gpu-memory-utilization leaves free)"),
    ("gpu_memory_utilization", float, "fraction of device memory for weights and KV cache"),
    ("kv_cache_dtype", str, "auto or int8"),
    ("attention_backend", str, "auto, torch or triton"),
    ("cudagraph_mode", str, "which steps replay CUDA graphs on a GPU: FULL (every step shape), FULL_DECODE_ONLY "
                            "or NONE"),
    ("quantization", str, "int8 or int4 weight-only"),
    ("quant_group_size", int, "int4 group size: 32, 64 or 128"),
    ("seed", int, "the sampler's seed for requests without their own"),
)


def add_serve_args(p: argparse.ArgumentParser, speculative_args) -> None:
    """speculative_args: the CLI's own --speculative-* flags, shared with `minillm generate`."""
    p.add_argument("model", help="'tiny', a local Hugging Face folder or a Hub id")
    p.add_argument("--host", default="127.0.0.1", help="0.0.0.0 exposes the server to the network")
    p.add_argument("--port", type=int_in(0, 65535), default=8000, help="0: any free port")
    p.add_argument("--api-key", default=None, help="required as 'Authorization: Bearer KEY' on /v1")
    p.add_argument("--served-model-name", default=None, help="the name clients use (default: MODEL)")
    p.add_argument("--chat-template", default=None, help="a Jinja file replacing the tokenizer's template")
    p.add_argument("--max-body-bytes", type=int_in(1), default=MAX_BODY_BYTES,
                   help="the largest request body taken (default 16 MiB); larger ones get a 413")
    # CORS, under vLLM's flags and with its defaults: which web pages may call the server from a browser.
    p.add_argument("--allowed-origins", type=_string_list, default=["*"], help='JSON list, e.g. \'["https://a.b"]\'')
    p.add_argument("--allowed-methods", type=_string_list, default=["*"], help="JSON list of HTTP methods")
    p.add_argument("--allowed-headers", type=_string_list, default=["*"], help="JSON list of request headers")
    p.add_argument("--allow-credentials", action="store_true", help="let pages send cookies and credentials")
    for name, kind, text in ENGINE_ARGS:
        p.add_argument("--" + name.replace("_", "-"), type=kind, default=None, help=text)
    p.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=None)
    p.add_argument("--enforce-eager", action="store_true", default=None, help="no CUDA graphs")
    p.add_argument("--async-scheduling", action="store_true", default=None,
                   help="queue each step before reading the one before's tokens")
    speculative_args(p)


def _string_list(text: str) -> list[str]:
    """A JSON list of strings, as vLLM takes its CORS flags."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"must be a JSON list of strings, e.g. '[\"*\"]': {e}") from e
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise argparse.ArgumentTypeError(f"must be a JSON list of strings, got {text!r}")
    return value


def engine_kwargs(args: argparse.Namespace) -> dict:
    """The engine arguments given on the command line; the rest keep the engine's defaults."""
    names = [name for name, _, _ in ENGINE_ARGS] + ["enable_prefix_caching", "enforce_eager", "async_scheduling"]
    return {name: getattr(args, name) for name in names if getattr(args, name) is not None}
