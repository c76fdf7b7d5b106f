"""LLMEngine: owns the model, the cache, the scheduler; `step()` is one iteration of serving."""

from __future__ import annotations

import dataclasses
import logging
import time
import warnings
from collections.abc import Callable

import torch

from minillm.config.engine import EngineConfig, check_checkpoint_quantization, resolve_max_model_len
from minillm.engine.async_step import InFlightStep, placeholders
from minillm.engine.input_processor import InputProcessor, PromptType
from minillm.engine.metrics import EngineCounters, Metric, collect_metrics
from minillm.engine.model_runner import ModelRunner
from minillm.engine.output_processor import OutputProcessor
from minillm.engine.parallel_sampling import ParallelSampling, child_params, child_request_id
from minillm.engine.runner_output import ModelRunnerOutput
from minillm.engine.scheduler import ScheduledBatch, Scheduler
from minillm.engine.trace import SeqState, StepEvent, TraceInfo
from minillm.kernels.ops import load_ops, resolve_kernel
from minillm.kv.cache_manager import create_kv_cache_manager
from minillm.kv.pool import kv_bytes_per_token
from minillm.models.loader import load_model, load_tokenizer, resolve_model_path
from minillm.models.registry import read_model_config
from minillm.outputs import RequestOutput
from minillm.sampling_params import SamplingParams
from minillm.sequence import Sequence, SequenceStatus
from minillm.spec_decode.acceptance import AcceptanceCounts
from minillm.spec_decode.proposers import create_proposer, load_draft_model
from minillm.utils.device import device_memory_bytes, resolve_device, resolve_dtype
from minillm.utils.logger import init_logger
from minillm.utils.memory import PeakMemory

logger = init_logger(__name__)


class LLMEngine:
    def __init__(self, model: str, **engine_args) -> None:
        """engine_args: vLLM's names, as listed in `LLM`'s docstring; see config/engine.py."""
        self.config = config = EngineConfig.from_engine_args(model, **engine_args)
        self.model_name = str(model)
        self.model_path = path = resolve_model_path(model)
        self.model_config = model_config = read_model_config(path)
        self.max_model_len = resolve_max_model_len(config.model.max_model_len, model_config)
        self.device = resolve_device(config.device.device)
        self.dtype = resolve_dtype(config.model.dtype, model_config.checkpoint_dtype, self.device)
        self.kv_cache_dtype = config.cache.kv_cache_dtype
        # One choice of kernels for every layer that has one, attention included: Triton's on a GPU,
        # PyTorch's references on a CPU unless Triton's interpreter is asked for.
        self.ops = load_ops(resolve_kernel(config.device.attention_backend, self.device, config.cache.block_size))
        check_checkpoint_quantization(config.model, model_config, path)
        self.tokenizer = None if config.model.skip_tokenizer_init else load_tokenizer(path)
        self.input_processor = InputProcessor(self.tokenizer, model_config.vocab_size, self.max_model_len,
                                              config.speculative is not None)
        # A quantized checkpoint loads quantized; otherwise quantization, if asked for, happens as each
        # weight arrives, so that the unquantized model is never held whole.
        with PeakMemory(self.device) as load_memory:
            self.model = load_model(path, model_config, self.dtype, self.device, self.ops,
                                    config.model.quantization, config.model.quant_group_size, config.model.load_format)
        self.load_peak_bytes = load_memory.bytes
        self._log_load()
        eos = set(model_config.eos_token_ids)
        if self.tokenizer is not None and self.tokenizer.eos_token_id is not None:
            eos.add(self.tokenizer.eos_token_id)
        self.eos_token_ids = frozenset(eos)
        spec = config.speculative
        # The draft loads before the KV pools are sized: its weights and its own pool share the memory.
        draft = load_draft_model(spec, model_config, self.tokenizer, self.dtype, self.device, self.ops,
                                 self.max_model_len) if spec is not None and spec.method == "draft_model" else None
        self.kv_cache_manager = kv = create_kv_cache_manager(
            config.cache, model_config, self.dtype, self.device, self.max_model_len,
            config.scheduler.max_num_seqs,
            kv_bytes_per_token(draft[1], self.dtype, self.kv_cache_dtype) if draft else 0)
        self.kv_cache, self.block_manager = kv.storage, kv.block_manager
        self.model_runner = runner = ModelRunner(self.model, kv, config.scheduler, self.max_model_len, self.device,
                                                 config.model.seed)
        if spec is not None:
            runner.set_proposer(create_proposer(spec, draft, kv, runner.attn_backend, runner.buffers,
                                                runner.sampler.generator, self.kv_cache_dtype),
                                spec.num_speculative_tokens)
        self.spec_decoding_stats = AcceptanceCounts(spec.num_speculative_tokens) if spec else None
        self.counters = EngineCounters(self.max_model_len)
        # Steps replay CUDA graphs, as in vLLM, where they are made of Triton kernels on a GPU and the
        # attention backend can be captured.
        mode = "NONE" if config.device.enforce_eager else config.device.cudagraph_mode
        if (mode != "NONE" and self.device.type == "cuda" and self.ops.kernel == "triton"
                and runner.attn_backend.supports_cuda_graphs):
            self.model_runner.capture_cuda_graphs(decode_only=mode == "FULL_DECODE_ONLY")
        self.output_processor = OutputProcessor(self.tokenizer)
        self.scheduler = Scheduler(config.scheduler, kv)
        self.parallel_sampling = ParallelSampling()  # requests with SamplingParams.n > 1
        self.step_listeners: list[Callable[[StepEvent], None]] = []  # see engine/trace.py
        self.num_steps = 0
        self._in_flight: InFlightStep | None = None  # async_scheduling: the step queued last, not yet read

    def _log_load(self) -> None:
        """The weights' size and the peak memory of loading them: at INFO on an accelerator, where they
        decide what fits (as vLLM logs them); at DEBUG on a CPU, which the course's notebooks run on."""
        held = sum(t.numel() * t.element_size() for t in self.model.state_dict().values())
        method = self.model_config.quantization or self.config.model.quantization
        group = self.model_config.quant_group_size or self.config.model.quant_group_size
        scheme = str(self.dtype).removeprefix("torch.") if method is None else method + (
            f" g{group}" if method == "int4" else "")
        peak = "" if self.load_peak_bytes is None else f", peak {self.load_peak_bytes / 2**30:.2f} GiB while loading"
        logger.log(logging.DEBUG if self.device.type == "cpu" else logging.INFO,
                   f"loaded {self.model_name}: {held / 2**30:.2f} GiB of weights ({scheme}){peak}")

    def add_request(self, request_id: str, prompt: PromptType, params: SamplingParams,
                    arrival_time: float | None = None) -> None:
        """Queues a request; with params.n > 1, one request per completion (engine/parallel_sampling.py),
        whose outputs come back under request_id."""
        text, token_ids = self.input_processor.process_prompt(prompt)
        self.input_processor.check_params(params)
        ids = [request_id] if params.n == 1 else [child_request_id(j, request_id) for j in range(params.n)]
        for taken in (request_id, *ids):
            if self.scheduler.find(taken) is not None or self.parallel_sampling.knows(taken):
                raise ValueError(f"request_id {request_id!r} is already in the engine" if taken == request_id else
                                 f"request_id {request_id!r} with n={params.n} names its completions "
                                 f"{ids[0]!r} to {ids[-1]!r}, and {taken!r} is already in the engine")
        arrival = time.time() if arrival_time is None else arrival_time
        if params.n == 1:
            self.scheduler.add_request(self._sequence(request_id, text, token_ids, params, arrival))
            return
        children = [self._sequence(rid, text, token_ids, child_params(params, j), arrival) for j, rid in enumerate(ids)]
        self.parallel_sampling.add(request_id, children)
        for child in children:  # in order: the first computes the prompt, the others share its blocks
            self.scheduler.add_request(child)

    def _sequence(self, request_id: str, text: str | None, token_ids: list[int], params: SamplingParams,
                  arrival_time: float) -> Sequence:
        generator = None
        if params.seed is not None:
            generator = torch.Generator(device=self.device).manual_seed(params.seed)
        return Sequence(request_id, text, token_ids, params, self.max_model_len, self.eos_token_ids, generator,
                        arrival_time)

    def abort_request(self, request_id: str) -> None:
        """Stops a request and frees its memory; a parallel sampling's id (or one of its completions')
        stops every completion."""
        parent = self.parallel_sampling.parent_of(request_id)
        if parent is not None:
            self.parallel_sampling.remove(parent)
        for rid in [request_id] if parent is None else [child.request_id for child in parent.children]:
            seq = self.scheduler.find(rid)
            if seq is not None:
                seq.finish_reason = "abort"
                self.scheduler.finish(seq)
                self.counters.request_success["abort"] += 1

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    def step(self) -> list[RequestOutput]:
        """One iteration: schedule; queue the model's step on the device; then read a step's tokens: the
        output processor appends them and decides the stops (the one place that does, once per step)
        and makes the outputs; the scheduler advances the cache and frees the finished sequences; the
        step is recorded.

        The step read is this one, unless async_scheduling left the one before in flight: then this
        step is scheduled and queued first, behind it, and that one is read (engine/async_step.py).
        The outputs of a request's n completions come back as the request's (engine/parallel_sampling.py)."""
        previous, self._in_flight = self._in_flight, None
        with placeholders(previous):
            queued = self._schedule_and_queue(previous)
        outputs = [] if previous is None else self._finish(previous)
        if queued is not None and self._may_stay_in_flight(queued.batch):
            self._in_flight = queued
        elif queued is not None:
            outputs += self._finish(queued)
        return self.parallel_sampling.merge(outputs)

    def _schedule_and_queue(self, previous: InFlightStep | None) -> InFlightStep | None:
        """The next step scheduled and queued on the device (None for an empty batch), behind `previous`
        if given. If that fails (an error, or Ctrl-C in a notebook), the prompt blocks the scheduler put
        in the prefix cache for it hold no K/V, and leave the cache."""
        try:
            batch = self.scheduler.schedule()
            if not batch.seqs:
                return None
            states = self._seq_states(batch) if self.step_listeners else None
            return InFlightStep(batch, self.model_runner.execute_model(batch, previous and previous.output), states)
        except BaseException:
            self.scheduler.forget_uncomputed_blocks()
            raise

    def _may_stay_in_flight(self, batch: ScheduledBatch) -> bool:
        """Whether the next step may be queued before this one's tokens are read (async_scheduling): not
        when speculating (a speculative step reads its verdict at once), nor without a KV cache (each
        step feeds every token from the host), nor where a token's penalties need the one before it,
        nor while a step listener watches (the live views show each step as it ends)."""
        return (self.config.scheduler.async_scheduling and self.model_runner.proposer is None
                and self.kv_cache_manager.name != "none" and not self.step_listeners
                and not any(seq.params.has_penalties for seq in batch.seqs))

    def _finish(self, step: InFlightStep) -> list[RequestOutput]:
        """A queued step's tokens read back (the host waits for the device here) and taken in by those of
        its sequences that have not finished since it was queued (async scheduling queues a step
        before it knows whether the one before stopped a sequence)."""
        batch, output = step.batch, step.output.get_output()
        live = [i for i, seq in enumerate(batch.seqs) if seq.status is not SequenceStatus.FINISHED]
        if len(live) < len(batch.seqs):
            batch, output = batch.select(live), output.select(live)
            states = None if step.states is None else [step.states[i] for i in live]
        else:
            states = step.states
        before = [(seq.num_output_tokens, seq.metrics.last_token_time) for seq in batch.seqs]
        outputs = self.output_processor.process_outputs(batch.seqs, output)
        self.scheduler.update(batch, output)
        self._record_step(batch, output, before, states)
        return outputs

    def _record_step(self, batch: ScheduledBatch, output: ModelRunnerOutput, before: list[tuple[int, float | None]],
                     states: list[SeqState] | None) -> None:
        """The finished step into the counters of get_metrics, then to the step listeners; before: each
        sequence's output tokens and last token time before the step; states: its sequences before it,
        when someone listens."""
        c = self.counters
        c.num_preemptions += len(batch.preempted)
        for drafts, tokens in zip(output.spec_token_ids, output.sampled_token_ids):
            if drafts:  # accepted: what the rejection sampler kept, whether or not a stop cut the run
                self.spec_decoding_stats.add(len(drafts), len(tokens) - 1)
        for seq, (num_output_tokens, last_token_time) in zip(batch.seqs, before):
            c.observe(seq, num_output_tokens, last_token_time)
        if states is not None:
            self._notify(self._step_event(batch, states, output))
        self.num_steps += 1

    def get_metrics(self) -> list[Metric]:
        kv = self.kv_cache_manager
        usage = 1 - kv.num_free_blocks / kv.num_blocks if kv.num_blocks else 0.0
        return collect_metrics({"model_name": self.model_name, "engine": "0"}, self.counters,
                               len(self.scheduler.running), len(self.scheduler.waiting), usage,
                               self.spec_decoding_stats)

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
        kv = self.kv_cache_manager
        return TraceInfo(
            model=self.model_name, device=str(self.device), dtype=str(self.dtype).replace("torch.", ""),
            kv_cache=kv.name, kv_bytes_per_token=kv_bytes_per_token(self.model_config, self.dtype, self.kv_cache_dtype),
            device_memory_bytes=device_memory_bytes(self.device), max_model_len=self.max_model_len,
            max_num_seqs=self.scheduler.max_num_seqs, block_size=kv.block_size, num_kv_blocks=kv.num_blocks,
            speculative_method=spec.method if (spec := self.config.speculative) else None,
            num_speculative_tokens=spec.num_speculative_tokens if spec else 0)

    def _seq_states(self, batch: ScheduledBatch) -> list[SeqState]:
        """The batch's sequences before the step runs: what it computes of each, and their memory."""
        states = []
        for seq, n in zip(batch.seqs, batch.num_new_tokens):
            start = seq.num_computed_tokens  # the first position computed
            prefill = max(0, min(start + n, seq.num_prompt_tokens) - start)
            states.append(SeqState(
                request_id=seq.request_id, prefill_tokens=prefill, decode_tokens=n - prefill, kv_tokens=start,
                kv_reserved_tokens=self.kv_cache_manager.reserved_tokens(seq), block_table=tuple(seq.block_table),
                num_cached_tokens=seq.num_cached_tokens))
        return states

    def _step_event(self, batch: ScheduledBatch, before: list[SeqState], output: ModelRunnerOutput) -> StepEvent:
        """The step as the widgets see it, once finished sequences have given their memory back."""
        kv = self.kv_cache_manager
        seqs = tuple(dataclasses.replace(
            state, kv_tokens=seq.num_computed_tokens, finish_reason=seq.finish_reason,
            decode_tokens=state.decode_tokens - reserved + len(spec), spec_token_ids=tuple(spec),
            num_accepted_tokens=len(tokens) - 1 if spec else 0, target_token_id=tokens[-1] if spec else None)
            for seq, state, reserved, spec, tokens in zip(batch.seqs, before, batch.num_spec_tokens,
                                                          output.spec_token_ids, output.sampled_token_ids))
        return StepEvent(step=self.num_steps, seqs=seqs, num_waiting=len(self.scheduler.waiting),
                         num_free_blocks=kv.num_free_blocks, cached_blocks=tuple(sorted(kv.cached_block_ids.values())),
                         preempted=tuple(s.request_id for s in batch.preempted))
