"""LLMEngine: owns the model, the cache, the scheduler; `step()` is one iteration of serving."""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable

import torch

from minillm.attention import ContiguousAttention, NoCacheAttention
from minillm.attention.paged import PagedAttention
from minillm.attention.selector import resolve_attention_backend
from minillm.block_manager import BlockManager
from minillm.config import ModelConfig
from minillm.device import device_memory_bytes, resolve_device, resolve_dtype
from minillm.kv_cache import ContiguousKVCache
from minillm.kv_pool import KV_CACHE_DTYPES, KVPool, kv_bytes_per_token, resolve_num_kv_blocks
from minillm.loader import load_model, load_tokenizer, resolve_model_path
from minillm.model_runner import ModelRunner
from minillm.output_processor import OutputProcessor
from minillm.outputs import RequestOutput
from minillm.quant.linear import quantize_model
from minillm.sampling_params import SamplingParams
from minillm.scheduler import ScheduledBatch, Scheduler
from minillm.sequence import Sequence
from minillm.trace import SeqState, StepEvent, TraceInfo

KV_CACHE_MODES = ("paged", "contiguous", "none")
PromptType = str | dict


class LLMEngine:
    def __init__(self, model: str, *, dtype: str | torch.dtype = "auto", device: str | None = None,
                 skip_tokenizer_init: bool = False, max_num_seqs: int = 256, max_num_batched_tokens: int = 2048,
                 max_model_len: int | None = None, kv_cache: str = "paged", block_size: int = 16,
                 num_kv_blocks: int | None = None, gpu_memory_utilization: float = 0.9,
                 enable_prefix_caching: bool = True, attention_backend: str = "auto", seed: int = 0,
                 quantization: str | None = None, quant_group_size: int = 128, kv_cache_dtype: str = "auto",
                 enforce_eager: bool = False) -> None:
        if kv_cache not in KV_CACHE_MODES:
            raise ValueError(f"kv_cache must be one of {KV_CACHE_MODES}, got {kv_cache!r}")
        if kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"kv_cache_dtype must be one of {KV_CACHE_DTYPES}, got {kv_cache_dtype!r}")
        if kv_cache_dtype != "auto" and kv_cache != "paged":
            raise ValueError(f"kv_cache_dtype={kv_cache_dtype!r} needs kv_cache='paged', got kv_cache={kv_cache!r}")
        if isinstance(block_size, bool) or not isinstance(block_size, int) or not (
                1 <= block_size <= 1024 and block_size & (block_size - 1) == 0):
            raise ValueError(f"block_size must be a power of two in [1, 1024], got {block_size!r}")
        if isinstance(max_num_seqs, bool) or not isinstance(max_num_seqs, int) or max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be an integer >= 1, got {max_num_seqs!r}")
        if isinstance(max_num_batched_tokens, bool) or not isinstance(max_num_batched_tokens, int) or \
                max_num_batched_tokens < 1:
            raise ValueError(f"max_num_batched_tokens must be an integer >= 1, got {max_num_batched_tokens!r}")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ValueError(f"seed must be an integer, got {seed!r}")
        if not isinstance(enforce_eager, bool):
            raise ValueError(f"enforce_eager must be True or False, got {enforce_eager!r}")
        path = resolve_model_path(model)
        self.model_name = str(model)
        self.model_config = config = ModelConfig.from_dir(path)
        self.max_model_len = _resolve_max_model_len(max_model_len, config)
        self.device = resolve_device(device)
        self.dtype = resolve_dtype(dtype, config.checkpoint_dtype, self.device)
        self.kv_cache_dtype = kv_cache_dtype
        kernel = resolve_attention_backend(attention_backend, self.device, block_size)
        if attention_backend == "triton" and kv_cache != "paged":
            raise ValueError(f"attention_backend='triton' needs kv_cache='paged', got kv_cache={kv_cache!r}")
        self.tokenizer = None if skip_tokenizer_init else load_tokenizer(path)
        self.model_path = path
        if config.quantization is not None and (quantization not in (None, config.quantization) or (
                quantization == "int4" and quant_group_size != config.quant_group_size)):
            raise ValueError(
                f"quantization={quantization!r} (quant_group_size={quant_group_size}) does not match the checkpoint "
                f"in {path}, which is already quantized as {config.quantization!r}"
                f"{f' with group size {config.quant_group_size}' if config.quantization == 'int4' else ''}; "
                "pass quantization=None")
        # A quantized checkpoint loads quantized. Its matmuls run on the attention's kernels: Triton's
        # on a GPU, PyTorch's references on a CPU unless Triton's interpreter is asked for.
        self.model = load_model(path, config, self.dtype, self.device, kernel)
        if quantization is not None and config.quantization is None:
            quantize_model(self.model, quantization, quant_group_size, kernel)
        eos = set(config.eos_token_ids)
        if self.tokenizer is not None and self.tokenizer.eos_token_id is not None:
            eos.add(self.tokenizer.eos_token_id)
        self.eos_token_ids = frozenset(eos)
        self.block_manager = None
        if kv_cache == "none":
            self.kv_cache, backend = None, NoCacheAttention()
        else:
            # Both caches get the same budget, so that they can be compared on equal memory.
            num_blocks = resolve_num_kv_blocks(
                num_kv_blocks, gpu_memory_utilization, config=config, block_size=block_size, dtype=self.dtype,
                device=self.device, max_model_len=self.max_model_len, max_num_seqs=max_num_seqs,
                kv_cache_dtype=kv_cache_dtype)
            if kv_cache == "paged":
                self.kv_cache = KVPool(config, num_blocks, block_size, self.dtype, self.device, kv_cache_dtype)
                self.block_manager = BlockManager(num_blocks, block_size, enable_prefix_caching)
                backend = PagedAttention(self.kv_cache, kernel, config.head_dim)
            else:
                self.kv_cache = ContiguousKVCache(config, self.dtype, self.device, num_blocks * block_size)
                backend = ContiguousAttention()
        self.model_runner = ModelRunner(self.model, backend, self.kv_cache, self.device, seed)
        # Decode steps replay CUDA graphs, as in vLLM, where the step is made of Triton kernels on a GPU.
        if not enforce_eager and self.device.type == "cuda" and kernel == "triton" and kv_cache == "paged":
            self.model_runner.capture_decode_graphs(max_num_seqs, self.max_model_len)
        self.scheduler = Scheduler(max_num_seqs, max_num_batched_tokens,
                                   None if self.block_manager else self.kv_cache, self.block_manager)
        self.output_processor = OutputProcessor(self.tokenizer)
        self.step_listeners: list[Callable[[StepEvent], None]] = []  # see trace.py
        self.num_steps = 0

    def add_request(self, request_id: str, prompt: PromptType, params: SamplingParams,
                    arrival_time: float | None = None) -> None:
        text, token_ids = self.process_prompt(prompt)
        self.check_params(params)
        if self.scheduler.find(request_id) is not None:
            raise ValueError(f"request_id {request_id!r} is already in the engine")
        generator = None
        if params.seed is not None:
            generator = torch.Generator(device=self.device).manual_seed(params.seed)
        self.scheduler.add_request(Sequence(
            request_id, text, token_ids, params, self.max_model_len, self.eos_token_ids, generator,
            time.time() if arrival_time is None else arrival_time))

    def abort_request(self, request_id: str) -> None:
        seq = self.scheduler.find(request_id)
        if seq is not None:
            seq.finish_reason = "abort"
            self.scheduler.finish(seq)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    def step(self) -> list[RequestOutput]:
        """One iteration: schedule, run, sample, postprocess."""
        batch = self.scheduler.schedule()
        if not batch.seqs:
            return []
        sampled = self.model_runner.run(batch)
        if self.kv_cache is not None:
            for seq, n in zip(batch.seqs, batch.num_new_tokens):
                seq.num_computed_tokens += n
                if self.block_manager is not None:
                    self.block_manager.cache_full_blocks(seq)
        sampling = [seq for seq, sample in zip(batch.seqs, batch.do_sample) if sample]
        outputs = self.output_processor.process(sampling, sampled) if sampling else []
        states = self._seq_states(batch) if self.step_listeners else None
        for seq in sampling:
            if seq.finish_reason is not None:
                self.scheduler.finish(seq)
        if states is not None:
            self._notify(self._step_event(states, batch))
        self.num_steps += 1
        return outputs

    def _notify(self, event: StepEvent) -> None:
        # Listeners are views and probes: one that breaks must not break generation. It is warned
        # about and removed; the engine's own state is complete before any listener runs.
        for listener in list(self.step_listeners):
            try:
                listener(event)
            except Exception as e:
                self.step_listeners.remove(listener)
                warnings.warn(f"step listener {listener!r} raised {type(e).__name__}: {e}; it was removed",
                              RuntimeWarning, stacklevel=2)

    def trace_info(self) -> TraceInfo:
        return TraceInfo(
            model=self.model_name, device=str(self.device), dtype=str(self.dtype).replace("torch.", ""),
            kv_cache=self.model_runner.attn_backend.name,
            kv_bytes_per_token=kv_bytes_per_token(self.model_config, self.dtype, self.kv_cache_dtype),
            device_memory_bytes=device_memory_bytes(self.device), max_model_len=self.max_model_len,
            max_num_seqs=self.scheduler.max_num_seqs,
            block_size=self.block_manager.block_size if self.block_manager else 0,
            num_kv_blocks=self.block_manager.num_blocks if self.block_manager else 0)

    def _seq_states(self, batch: ScheduledBatch) -> tuple[SeqState, ...]:
        states = []
        for seq, n in zip(batch.seqs, batch.num_new_tokens):
            start = seq.num_computed_tokens - n if self.kv_cache is not None else 0  # first position computed
            prefill = max(0, min(start + n, seq.num_prompt_tokens) - start)
            if self.block_manager is not None:
                reserved = len(seq.block_table) * self.block_manager.block_size
            else:
                reserved = seq.max_len if self.kv_cache is not None else 0
            states.append(SeqState(
                request_id=seq.request_id, prefill_tokens=prefill, decode_tokens=n - prefill,
                kv_tokens=seq.num_computed_tokens, kv_reserved_tokens=reserved, finish_reason=seq.finish_reason,
                block_table=tuple(seq.block_table), num_cached_tokens=seq.num_cached_tokens))
        return tuple(states)

    def _step_event(self, states: tuple[SeqState, ...], batch: ScheduledBatch) -> StepEvent:
        """The step as the widgets see it, once finished sequences have given their blocks back."""
        blocks = self.block_manager
        return StepEvent(step=self.num_steps, seqs=states, num_waiting=len(self.scheduler.waiting),
                         num_free_blocks=blocks.num_free_blocks if blocks else 0,
                         cached_blocks=tuple(sorted(blocks.cached_block_ids.values())) if blocks else (),
                         preempted=tuple(s.request_id for s in batch.preempted))

    def process_prompt(self, prompt: PromptType) -> tuple[str | None, list[int]]:
        """Validate a prompt and tokenize it: a string, {"prompt": str} or {"prompt_token_ids": [...]}."""
        if isinstance(prompt, dict) and "prompt_token_ids" in prompt:
            text, ids = prompt.get("prompt"), prompt["prompt_token_ids"]
            if not isinstance(ids, (list, tuple)) or not all(
                    isinstance(i, int) and not isinstance(i, bool) for i in ids):
                raise ValueError(f"prompt_token_ids must be a list of ints, got {ids!r:.80}")
            ids = list(ids)
        else:
            text = prompt.get("prompt") if isinstance(prompt, dict) else prompt
            if not isinstance(text, str):
                raise ValueError("prompt must be a string, {'prompt': str} or {'prompt_token_ids': [int, ...]}, "
                                 f"got {type(prompt).__name__}")
            if self.tokenizer is None:
                raise ValueError("prompt must be {'prompt_token_ids': [...]} when skip_tokenizer_init=True")
            ids = self.tokenizer(text, add_special_tokens=True)["input_ids"]
        if not ids:
            raise ValueError("prompt must not be empty (it has no tokens)")
        vocab = self.model_config.vocab_size
        if bad := [i for i in ids if not 0 <= i < vocab]:
            raise ValueError(f"prompt_token_ids must be in [0, {vocab}), got {bad[0]}")
        if len(ids) >= self.max_model_len:
            raise ValueError(f"prompt has {len(ids)} tokens, but max_model_len is {self.max_model_len}: "
                             "it must be shorter, to leave room for at least one generated token")
        return text, ids

    def check_params(self, params: SamplingParams) -> None:
        if not isinstance(params, SamplingParams):
            raise TypeError(f"sampling_params must be SamplingParams, got {type(params).__name__}")
        if params.stop_strings and self.tokenizer is None:
            raise ValueError("stop strings need a tokenizer; with skip_tokenizer_init=True use stop_token_ids")
        if params.logprobs is not None and params.logprobs > self.model_config.vocab_size:
            raise ValueError(f"logprobs must be <= vocab_size={self.model_config.vocab_size}, got {params.logprobs}")


def _resolve_max_model_len(requested: int | None, config: ModelConfig) -> int:
    limit = config.max_position_embeddings
    if config.sliding_window is not None:
        # minillm implements full attention only; within one window the two are the same thing.
        limit = min(limit, config.sliding_window)
    if requested is None:
        return limit
    if isinstance(requested, bool) or not isinstance(requested, int) or not 2 <= requested <= limit:
        raise ValueError(f"max_model_len must be an integer in [2, {limit}] for this model, got {requested!r}")
    return requested
