"""`minillm bench decode`: the roofline of an engine step.

The device's two roofs are measured first, in the same run: copy bandwidth (bytes a step can move
per second) and matmul throughput (flops it can do per second); their ratio is the ridge point, the
arithmetic intensity (flops per byte moved) at which a step stops waiting on memory.

A decode step reads every weight once, whatever the batch, plus each sequence's own K and V, and
does two flops per weight per sequence: at batch 1 its intensity is about 1 flop per byte, far
below any GPU's ridge (hundreds), so it is bound by bandwidth, and adding sequences is nearly free
until their weights' flops catch up. Prefill does the same for every prompt token at once and is
bound by compute. The table gives, per step: time, tokens/s, bytes moved over time as GB/s and as
a share of the copy bandwidth, TFLOP/s, the step's intensity and which roof bounds it. Decode runs
both eagerly and replaying CUDA graphs (on a GPU), where the gap is the CPU's launch overhead, and
replaying them with async scheduling, where each step is queued before the one before is read
(engine/async_step.py), so that the host's work between steps overlaps the device's: those steps
are timed back to back, the others each from an idle device. The summary has the graphs' capture
time and memory. `--shape llama-2-7b` decodes a model of that shape
whose random weights are made on the device (load_format="dummy"): a 7B model in a short GPU run.
"""

from __future__ import annotations

import gc

import torch

from minillm.bench.engine_steps import (
    MIXED_REPEATS,
    decode_len,
    decode_step_seconds,
    mixed_step_seconds,
    prefill_seconds,
)
from minillm.bench.timing import copy_bandwidth, graph_time, matmul_flops, num_copies, read_bandwidth, wall_time
from minillm.config.engine import SchedulerConfig
from minillm.config.model import ModelConfig
from minillm.kv.pool import kv_bytes_per_token
from minillm.llm import LLM

DECODE_COLUMNS = [("mode", "mode"), ("batch", "batch"), ("step_ms", "step ms"), ("tokens_per_s", "tokens/s"),
                  ("GB_per_step", "GB moved"), ("GB_s", "GB/s"), ("of_copy_bw", "of copy bw"),
                  ("TFLOP_s", "TFLOP/s"), ("intensity", "flop/byte"), ("bound", "bound by"),
                  ("replay_ms", "replay ms"), ("replay_of_copy_bw", "replay of copy bw")]
# The mixed step: one prompt prefilled beside many decodes, as continuous batching admits requests.
MIXED_CHUNK, MIXED_DECODES = 512, 63
MODES = ("eager", "graphs", "async")
PREFILL_COLUMNS = [("mode", "mode"), ("tokens", "prompt tokens"), ("ms", "ms (time to first token)"),
                   ("TFLOP_s", "TFLOP/s"), ("of_peak", "of matmul peak"), ("intensity", "flop/byte"),
                   ("bound", "bound by")]


def weight_bytes(model: torch.nn.Module) -> tuple[int, int]:
    """(bytes of weights a decode step reads, weights of the linear layers and the output head, each
    2 flops per token): every linear weight and the head once; of an embedding table not tied to
    the head, only the step's rows (counted as nothing)."""
    embed = model.model.embed_tokens.weight
    total = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    read = total if model.lm_head is None else total - embed.numel() * embed.element_size()
    linear = sum(m.out_features * m.in_features for m in model.modules() if hasattr(m, "in_features"))
    if model.lm_head is None:
        linear += embed.numel()
    return read, linear


def decode_step_bytes(config: ModelConfig, batch: int, context: int, dtype: torch.dtype,
                      kv_cache_dtype: str = "auto") -> int:
    """Bytes a decode step of `batch` sequences, each with `context` tokens in the KV cache, reads
    from memory: every weight it uses once, whatever the batch (the linear layers, norms and biases,
    and the output head; an embedding table only where it is the head: a lookup reads one row per
    token, counted as nothing), plus each sequence's own K and V of every layer (scales included
    for an int8 cache). `weight_bytes` counts the same weights on a loaded model."""
    params = config.parameter_counts()
    read = params["linear"] + params["other"] + (params["head"] or params["embedding"])
    return read * dtype.itemsize + batch * context * kv_bytes_per_token(config, dtype, kv_cache_dtype)


def step_flops(config: ModelConfig, num_tokens: int, context: int) -> int:
    """Floating-point operations of computing `num_tokens` new tokens of one sequence after
    `context` cached ones: a multiply and an add per matmul weight per token (the decoder's linear
    layers and the output head, counted once if tied), plus attention, where the new token at
    position p scores its query against the p + 1 keys up to its own and sums as many values: 4 flops
    per key, per query head (num_attention_heads, not the KV heads) and head dimension, in every
    layer. A decode step of B sequences is B times (1, context); a prefill of n tokens is (n, 0)."""
    params = config.parameter_counts()
    matmul = params["linear"] + (params["head"] or params["embedding"])
    keys = num_tokens * context + num_tokens * (num_tokens + 1) // 2  # sum over the new tokens of p + 1
    per_key = 4 * config.num_attention_heads * config.head_dim * config.num_hidden_layers
    return 2 * matmul * num_tokens + per_key * keys


def linear_rows(in_features: int, out_features: int, batches: tuple[int, ...], dtype: torch.dtype,
                device: torch.device | str, copy_bw: float) -> list[dict]:
    """One matmul of a layer's shape alone (F.linear, no bias) at each batch size: a kernel's own
    point on the roofline, without the rest of a step around it. Bytes: the weight, the inputs and
    the outputs once each. Each timed call runs over enough copies of the weight that none is still
    in a cache from the call before (as in a step, where every layer has its own weights): on CUDA as
    graph replays, on a CPU by the host clock."""
    device = torch.device(device)
    nbytes = in_features * out_features * dtype.itemsize
    # At most 64 copies: a weight so small that it needs more is one that any cache holds anyway.
    weights = [torch.randn(out_features, in_features, dtype=dtype, device=device) / in_features ** 0.5
               for _ in range(min(num_copies(nbytes), 64))]
    rows = []
    for batch in batches:
        x = torch.randn(batch, in_features, dtype=dtype, device=device)
        if device.type == "cuda":
            seconds = graph_time([lambda w=w, x=x: torch.nn.functional.linear(x, w) for w in weights])
        else:
            seconds = wall_time(lambda x=x: [torch.nn.functional.linear(x, w) for w in weights]) / len(weights)
        moved = nbytes + batch * (in_features + out_features) * dtype.itemsize
        flops = 2 * batch * in_features * out_features
        rows.append({"label": f"linear {out_features}×{in_features}, batch {batch}", "short": f"linear {batch}",
                     "batch": batch, "us": seconds * 1e6, "GB_s": moved / seconds / 1e9,
                     "of_copy_bw": moved / seconds / copy_bw, "TFLOP_s": flops / seconds / 1e12,
                     "intensity": flops / moved})
    return rows


def _roofline(row: dict, moved: float, flops: float, seconds: float, ridge: float, copy_bw: float) -> dict:
    row.update(GB_per_step=moved / 1e9, GB_s=moved / seconds / 1e9, of_copy_bw=moved / seconds / copy_bw,
               TFLOP_s=flops / seconds / 1e12, intensity=flops / moved,
               bound="memory" if flops / moved < ridge else "compute")
    return row


def bench_decode(model: str, batches: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256), context: int = 512,
                 steps: int = 10, prefill_lens: tuple[int, ...] = (128, 512, 2048, 8192), device: str | None = None,
                 dtype: str = "auto", modes: tuple[str, ...] = MODES, load_format: str = "auto",
                 quantization: str | None = None) -> tuple[list[dict], list[dict], dict]:
    """Decode at each batch size (contexts of `context` tokens), eagerly and (CUDA) with graphs; on a
    GPU, a step of a 512-token prompt beside 63 decodes, likewise; prefill of one prompt of each
    length, likewise. Random token ids: the shapes are what matter. modes: MODES or one of them
    ("graphs" alone runs eagerly, labelled so, where the engine captures none); load_format "dummy":
    random weights made on the device, for a model folder that holds only its config.json; "async"
    runs decode alone, prefill and the mixed step being what "graphs" measures; quantization: the
    linear layers' weights quantized while loading (the bytes a step reads are then the quantized
    model's)."""
    if not modes or any(mode not in MODES for mode in modes):
        raise ValueError(f"modes must be some of {MODES}, got {modes!r}")
    common = dict(device=device, dtype=dtype, skip_tokenizer_init=True, enable_prefix_caching=False,
                  load_format=load_format, quantization=quantization)
    # The longest sequence: the largest batch's (`decoding`), the mixed step's decodes, or its prompt
    # chunk (the engines take the default tokens per step).
    budget = SchedulerConfig.max_num_batched_tokens
    max_model_len = max(decode_len(max(batches), context, steps, budget),
                        decode_len(MIXED_DECODES, context, MIXED_REPEATS + 2, budget), MIXED_CHUNK + 16)
    blocks_per_seq = -(-max_model_len // 16)
    decode_rows = []
    mixed_ms: dict[str, float] = {}
    capture: dict[str, float] = {}
    for mode in (m for m in MODES if m in modes):
        llm = LLM(model, **common, max_num_seqs=max(batches), num_kv_blocks=max(batches) * blocks_per_seq,
                  max_model_len=max_model_len, enforce_eager=mode == "eager",
                  async_scheduling=mode == "async")
        engine = llm.llm_engine
        dev, config, torch_dtype = engine.device, engine.model_config, engine.dtype
        graphs = engine.model_runner.cuda_graphs
        if mode != "eager" and graphs is None:
            if decode_rows:
                break  # no Triton here: eager is all there is, and it was measured
            mode = "eager"
        elif mode == "graphs":
            capture = {"graph_capture_s": graphs.capture_seconds, "graph_memory_GiB": graphs.memory_bytes / 2**30,
                       "graphs_captured": len(graphs.graphs)}
        if not decode_rows:
            read_bytes, _ = weight_bytes(engine.model)
            kv_token = kv_bytes_per_token(config, torch_dtype)
            roof_bytes = (1 << 30) if dev.type == "cuda" else (256 << 20)
            copy_bw, read_bw = copy_bandwidth(dev, roof_bytes), read_bandwidth(dev, roof_bytes)
            peak = matmul_flops(dev, torch_dtype, 8192 if dev.type == "cuda" else 1024)
            ridge = peak / copy_bw
        for batch in batches:
            runs, replay, length = decode_step_seconds(llm, batch, context, steps)
            seconds = sorted(runs)[len(runs) // 2]
            moved = read_bytes + round(batch * (length + steps // 2)) * kv_token
            flops = batch * step_flops(config, 1, round(length) + steps // 2)
            row = _roofline({"mode": mode, "batch": batch, "step_ms": seconds * 1e3,
                             "step_ms_runs": [t * 1e3 for t in runs],  # for a spread: bench/verdict.py
                             "tokens_per_s": batch / seconds}, moved, flops, seconds, ridge, copy_bw)
            if replay is not None:
                row.update(replay_ms=replay * 1e3, replay_of_copy_bw=moved / replay / copy_bw)
            decode_rows.append(row)
        if dev.type == "cuda" and max(batches) > MIXED_DECODES and mode != "async":  # what graphs change
            mixed_ms[mode] = mixed_step_seconds(llm, MIXED_DECODES, MIXED_CHUNK, context) * 1e3
        del llm, engine, graphs
        gc.collect()
        if dev.type != "cuda":
            break  # CUDA graphs are for CUDA devices

    prefill_rows = []
    for mode in (m for m in MODES if m in modes and m != "async") if prefill_lens else ():
        longest = max(prefill_lens)
        llm = LLM(model, **common, max_num_seqs=1, max_num_batched_tokens=longest, max_model_len=longest + 1,
                  num_kv_blocks=-(-longest // 16) + 1, enforce_eager=mode == "eager")
        if mode == "graphs" and llm.llm_engine.model_runner.cuda_graphs is None:
            if prefill_rows:
                break
            mode = "eager"
        for tokens in prefill_lens:
            seconds = prefill_seconds(llm, tokens)
            moved = read_bytes + tokens * kv_token
            flops = step_flops(config, tokens, 0)
            row = _roofline({"mode": mode, "tokens": tokens, "ms": seconds * 1e3}, moved, flops, seconds, ridge,
                            copy_bw)
            row["of_peak"] = row["TFLOP_s"] * 1e12 / peak
            prefill_rows.append(row)
        del llm
        gc.collect()

    def at(mode: str, batch: int, key: str):
        return next((r[key] for r in decode_rows if r["mode"] == mode and r["batch"] == batch), None)

    best = "graphs" if any(r["mode"] == "graphs" for r in decode_rows) else "eager"
    batch1_gb_s = at(best, 1, "GB_s")
    eager_ms, graphs_ms, async_ms = at("eager", 1, "step_ms"), at("graphs", 1, "step_ms"), at("async", 1, "step_ms")
    summary = {"device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu", "dtype": str(torch_dtype),
               "quantization": quantization, "weight_GB": read_bytes / 1e9, "batch1_step_ms": at(best, 1, "step_ms"),
               "copy_GB_s": copy_bw / 1e9, "read_GB_s": read_bw / 1e9,
               "matmul_TFLOP_s": peak / 1e12, "ridge_flop_per_byte": ridge,
               "batch1_of_copy_bw": at(best, 1, "of_copy_bw"),
               "batch1_of_read_bw": None if batch1_gb_s is None else batch1_gb_s * 1e9 / read_bw,
               "batch1_eager_of_copy_bw": at("eager", 1, "of_copy_bw"),
               # The graph alone against the whole step: how much of a step is the host's work.
               "batch1_replay_of_copy_bw": at("graphs", 1, "replay_of_copy_bw"),
               "batch1_host_share": (1 - at("graphs", 1, "replay_ms") / graphs_ms
                                     if graphs_ms and at("graphs", 1, "replay_ms") else None),
               "graphs_speedup_at_batch1": eager_ms / graphs_ms if eager_ms and graphs_ms else None,  # both modes run
               # What overlapping the host's work with the device's buys a graphed step.
               "batch1_async_of_copy_bw": at("async", 1, "of_copy_bw"),
               "async_speedup_at_batch1": graphs_ms / async_ms if graphs_ms and async_ms else None,
               "first_compute_bound_batch": next((r["batch"] for r in decode_rows
                                                  if r["mode"] == best and r["bound"] == "compute"), None),
               f"mixed_step_ms ({MIXED_CHUNK}-token prompt + {MIXED_DECODES} decodes)": mixed_ms,
               # The graphs' start-up cost, every step shape of this engine (engine/cuda_graph.py).
               "graph_capture_s": capture.get("graph_capture_s"), "graph_memory_GiB": capture.get("graph_memory_GiB"),
               "graphs_captured": capture.get("graphs_captured")}
    return decode_rows, prefill_rows, summary

