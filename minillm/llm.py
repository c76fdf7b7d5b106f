"""`LLM`: the offline entry point, vLLM's API: `LLM(model).generate(prompts, SamplingParams(...))`."""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
from collections.abc import Iterator, Sequence

from tqdm.auto import tqdm

from minillm.chat_utils import apply_chat_template
from minillm.engine.llm_engine import LLMEngine, PromptType
from minillm.engine.metrics import Metric
from minillm.outputs import RequestOutput
from minillm.sampling_params import RequestOutputKind, SamplingParams


class LLM:
    def __init__(self, model: str, **engine_args) -> None:
        """model: "tiny", "tiny-draft", a local Hugging Face folder, or a Hub id.
        engine_args: dtype, device, skip_tokenizer_init, max_model_len, seed; the scheduler's max_num_seqs,
        max_num_batched_tokens (tokens per step; longer prompts are prefilled in chunks) and scheduling_policy
        ("fcfs", or an object with admit and token_budget: see engine/policy.py); and the cache:
        kv_cache ("paged", "contiguous" or "none"), block_size, num_kv_blocks, gpu_memory_utilization (the
        share of the GPU's memory that weights and cache take together, vLLM's meaning),
        enable_prefix_caching, attention_backend ("auto", "torch" or "triton"), kv_cache_dtype ("auto": the
        model's dtype, or "int8": K and V quantized with a scale per token and head, paged cache only, about
        half the bytes of fp16); weight-only quantization of the decoder's linear layers: quantization
        (None, "int8" or "int4") and quant_group_size (int4: 32, 64 or 128). A folder written by
        `minillm quantize` (models/quant_checkpoint.py), by llm-compressor in compressed-tensors'
        pack-quantized INT4 format (quant/compressed_tensors.py) or by AutoAWQ in its GEMM layout
        (quant/awq.py), loads already quantized. enforce_eager: False (the
        default) replays steps as CUDA graphs on a GPU with the Triton backend, of every shape or of
        pure decodes alone (cudagraph_mode "FULL", the default, or "FULL_DECODE_ONLY"); True (or
        cudagraph_mode "NONE") runs every step eagerly, launch by launch (engine/cuda_graph.py).
        async_scheduling: True queues each step on the device before the tokens of the step before are
        read, so that the host's work between steps overlaps the device's (engine/async_step.py).
        speculative_config: None, or vLLM's dict for speculative decoding, {"model": "tiny-draft",
        "num_speculative_tokens": 4} (a draft model of the same vocabulary) or {"method": "ngram",
        "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2} (drafts copied
        from the sequence itself); see spec_decode/. load_format: "auto" (the checkpoint's safetensors) or
        "dummy" (random weights of the config's shapes made on the device, only config.json read: for
        measurements, vLLM's meaning)."""
        self.llm_engine = LLMEngine(model, **engine_args)
        self._request_ids = itertools.count()

    def get_tokenizer(self):
        return self.llm_engine.tokenizer

    def get_metrics(self) -> list[Metric]:
        """Counters, gauges and histograms since the engine started, vLLM's classes and names
        (engine/metrics.py), speculative decoding's included."""
        return self.llm_engine.get_metrics()

    def generate(self, prompts: PromptType | Sequence[PromptType],
                 sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
                 *, use_tqdm: bool = True) -> list[RequestOutput]:
        """Run every prompt to completion, all batched together; outputs in the prompts' order, each
        with SamplingParams.n completions."""
        if isinstance(prompts, (str, dict)):
            prompts = [prompts]
        if not isinstance(prompts, (list, tuple)):
            raise TypeError(f"prompts must be a prompt or a list of them, got {type(prompts).__name__}")
        params = _per_prompt(sampling_params, len(prompts))
        engine = self.llm_engine
        processed = []
        for prompt, p in zip(prompts, params):  # reject bad input before anything is queued
            text, token_ids = engine.input_processor.process_prompt(prompt)
            engine.input_processor.check_params(p)
            # tokenized once; replace() checks every field again, so it too runs before anything is queued
            processed.append(({"prompt": text, "prompt_token_ids": token_ids},
                              dataclasses.replace(p, output_kind=RequestOutputKind.FINAL_ONLY)))
        ids = [self._add(prompt, p) for prompt, p in processed]
        pending, finished = set(ids), {}
        # disable is only passed to switch the bar off: passing False would override TQDM_DISABLE.
        quiet = {} if use_tqdm else {"disable": True}
        with tqdm(total=len(ids), desc="Processed prompts", leave=False, **quiet) as bar:
            with _abort_on_exit(engine, ids):
                while pending and engine.has_unfinished_requests():
                    for out in engine.step():
                        if out.finished and out.request_id in pending:
                            pending.discard(out.request_id)
                            finished[out.request_id] = out
                            bar.update(1)
        if pending:
            raise RuntimeError(f"requests {sorted(pending)} were aborted before they finished")
        return [finished[i] for i in ids]

    def chat(self, messages: list[dict] | list[list[dict]],
             sampling_params: SamplingParams | Sequence[SamplingParams] | None = None, *, use_tqdm: bool = True,
             chat_template: str | None = None, add_generation_prompt: bool = True,
             continue_final_message: bool = False) -> list[RequestOutput]:
        """generate() on conversations: one (a list of {"role": ..., "content": ...} messages) or a
        list of them, each rendered by the tokenizer's chat template or by chat_template (a Jinja
        template); continue_final_message (with add_generation_prompt=False) lets the model go on
        with the last message instead of answering it. One output per conversation."""
        if not isinstance(messages, (list, tuple)) or not messages:
            raise ValueError("messages must be a conversation (a non-empty list of messages) or a list of them")
        conversations = [messages] if isinstance(messages[0], dict) else messages
        prompts = [apply_chat_template(self.get_tokenizer(), _conversation(c), chat_template, add_generation_prompt,
                                       continue_final_message) for c in conversations]
        return self.generate(prompts, sampling_params, use_tqdm=use_tqdm)

    def stream(self, prompt: PromptType, sampling_params: SamplingParams | None = None) -> Iterator[str]:
        """Yield the text as it is generated, piece by piece; stop strings never leak."""
        params = sampling_params or SamplingParams()
        if params.n != 1:
            raise ValueError(f"n must be 1 to stream one text, got {params.n}; generate() returns n completions")
        request_id = self._add(prompt, dataclasses.replace(params, output_kind=RequestOutputKind.CUMULATIVE))
        sent = 0
        with _abort_on_exit(self.llm_engine, [request_id]):
            while self.llm_engine.has_unfinished_requests():
                for out in self.llm_engine.step():
                    if out.request_id != request_id:
                        continue
                    text = out.outputs[0].text
                    if len(text) > sent:
                        yield text[sent:]
                        sent = len(text)
                    if out.finished:
                        return

    def _add(self, prompt: PromptType, params: SamplingParams) -> str:
        request_id = str(next(self._request_ids))
        self.llm_engine.add_request(request_id, prompt, params)
        return request_id


def _per_prompt(sampling_params, n: int) -> list[SamplingParams]:
    if sampling_params is None:
        return [SamplingParams()] * n
    if isinstance(sampling_params, SamplingParams):
        return [sampling_params] * n
    if not isinstance(sampling_params, (list, tuple)):
        raise TypeError(f"sampling_params must be SamplingParams or a list of them, got "
                        f"{type(sampling_params).__name__}")
    params = list(sampling_params)
    if len(params) != n:
        raise ValueError(f"sampling_params must be one SamplingParams or one per prompt ({n}), got {len(params)}")
    return params


def _conversation(messages) -> list[dict]:
    """A conversation's messages, each a dict with a role and text content, as chat templates take them."""
    if not isinstance(messages, (list, tuple)) or not messages or not all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
            for m in messages):
        raise ValueError(f"messages must be dicts with a string role and string content, got {messages!r:.80}")
    return list(messages)


@contextlib.contextmanager
def _abort_on_exit(engine: LLMEngine, request_ids: list[str]) -> Iterator[None]:
    """Whatever ends the loop (done, an exception, Ctrl-C in a notebook, a stream the caller
    stopped reading), requests still in the engine are aborted so that its cache is clean for
    the next call; finished requests are already gone and unaffected."""
    try:
        yield
    finally:
        for request_id in request_ids:
            engine.abort_request(request_id)
