"""Every engine setting, in one place, checked once: `LLM(model, **engine_args)` splits the keyword
arguments (vLLM's names) into the parts below, and each part validates itself on creation.

What can only be decided with the checkpoint in hand (the context limit, the dtype the device
supports, whether a quantized checkpoint agrees with `quantization`) is resolved by the functions
at the end, when the engine has read the model's config.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from minillm.config.model import ModelConfig
from minillm.config.speculative import SpeculativeConfig
from minillm.quant import INT4_GROUP_SIZES, QUANTIZATION_METHODS
from minillm.sampling_params import MAX_SEED, MIN_SEED
from minillm.utils.validation import check_bool, check_choice, check_int, check_number

KV_CACHE_MODES = ("paged", "contiguous", "none")
KV_CACHE_DTYPES = ("auto", "int8")
# The kernels a layer can run: the PyTorch references or Triton's (kernels/ops.py); "auto" picks per device.
KERNELS = ("torch", "triton")
KERNEL_CHOICES = ("auto", *KERNELS)
# vLLM's names: graphs for every step shape, for pure decode steps only, or none.
CUDAGRAPH_MODES = ("FULL", "FULL_DECODE_ONLY", "NONE")
# Scheduling policies by name, vLLM's default among them (engine/policy.py implements them).
SCHEDULING_POLICIES = ("fcfs",)
# vLLM's names: weights read from the checkpoint's safetensors, or random ones made on the device (the
# folder's config.json alone is read), for measurements whose figures depend on the shapes only.
LOAD_FORMATS = ("auto", "dummy")


@dataclass
class ModelSettings:
    model: str  # "tiny", "tiny-draft", a local Hugging Face folder or a Hub id
    dtype: str | torch.dtype = "auto"
    max_model_len: int | None = None  # None: the model's own limit
    quantization: str | None = None  # weight-only, of the decoder's linear layers
    quant_group_size: int = 128  # int4 only
    skip_tokenizer_init: bool = False
    seed: int = 0  # of the sampler's generator, for requests without a seed of their own
    load_format: str = "auto"  # LOAD_FORMATS

    def __post_init__(self) -> None:
        check_int("max_model_len", self.max_model_len, optional=True)  # its range depends on the model
        check_choice("quantization", self.quantization, (None, *QUANTIZATION_METHODS))
        check_choice("load_format", self.load_format, LOAD_FORMATS)
        if self.load_format == "dummy" and self.quantization is not None:
            raise ValueError(f"load_format='dummy' makes unquantized random weights, got "
                             f"quantization={self.quantization!r}; pass quantization=None")
        if self.quantization == "int4":
            check_choice("quant_group_size", self.quant_group_size, INT4_GROUP_SIZES)
        check_bool("skip_tokenizer_init", self.skip_tokenizer_init)
        check_int("seed", self.seed, MIN_SEED, MAX_SEED)  # what torch.Generator.manual_seed takes


@dataclass
class CacheConfig:
    kv_cache: str = "paged"  # or "contiguous" (a buffer per sequence) or "none" (recompute everything)
    block_size: int = 16  # tokens per block of the paged cache
    num_kv_blocks: int | None = None  # None: what gpu_memory_utilization leaves for it (kv/pool.py)
    gpu_memory_utilization: float = 0.9  # of the device's memory, weights and cache together (vLLM's meaning)
    enable_prefix_caching: bool = True
    kv_cache_dtype: str = "auto"  # "auto" (the model's dtype) or "int8"

    def __post_init__(self) -> None:
        check_choice("kv_cache", self.kv_cache, KV_CACHE_MODES)
        check_int("block_size", self.block_size, 1, 1024, power_of_two=True)
        check_int("num_kv_blocks", self.num_kv_blocks, 1, optional=True)
        check_number("gpu_memory_utilization", self.gpu_memory_utilization, 0, 1, low_open=True)
        check_bool("enable_prefix_caching", self.enable_prefix_caching)
        check_choice("kv_cache_dtype", self.kv_cache_dtype, KV_CACHE_DTYPES)
        if self.kv_cache_dtype != "auto" and self.kv_cache != "paged":
            raise ValueError(f"kv_cache_dtype={self.kv_cache_dtype!r} needs kv_cache='paged', "
                             f"got kv_cache={self.kv_cache!r}")


@dataclass
class SchedulerConfig:
    max_num_seqs: int = 256  # sequences running at once
    max_num_batched_tokens: int = 2048  # tokens per step; longer prompts are prefilled in chunks
    # Speculative decoding: slots a decode reserves for the drafts it verifies (set from speculative_config).
    num_lookahead_slots: int = 0
    # Who joins each step, and how many tokens the step may compute: a name of SCHEDULING_POLICIES, or a
    # policy of one's own, an object (or a class, made here without arguments) with admit and token_budget.
    scheduling_policy: Any = "fcfs"
    # Queue each step before the tokens of the one before are read, so that the host's work between
    # steps overlaps the device's (engine/async_step.py).
    async_scheduling: bool = False

    def __post_init__(self) -> None:
        check_bool("async_scheduling", self.async_scheduling)
        check_int("max_num_seqs", self.max_num_seqs, 1)
        check_int("max_num_batched_tokens", self.max_num_batched_tokens, 1)
        check_int("num_lookahead_slots", self.num_lookahead_slots, 0)
        if isinstance(self.scheduling_policy, type):
            self.scheduling_policy = self.scheduling_policy()
        _check_scheduling_policy(self.scheduling_policy)


def _check_scheduling_policy(policy: Any) -> None:
    if isinstance(policy, str):
        problem = "" if policy in SCHEDULING_POLICIES else f"got {policy!r}"
    else:
        missing = [method for method in ("admit", "token_budget") if not callable(getattr(policy, method, None))]
        problem = f"got {policy!r}, which has no {' and no '.join(missing)} method" if missing else ""
    if problem:
        raise ValueError(f"scheduling_policy must be one of {SCHEDULING_POLICIES} or an object with the methods "
                         f"admit(scheduler, batch, budget) and token_budget(scheduler), {problem}")


@dataclass
class DeviceConfig:
    device: str | torch.device | None = None  # None: CUDA, else MPS, else CPU
    attention_backend: str = "auto"  # the kernels: "torch", "triton", or "auto" (Triton on a CUDA GPU)
    enforce_eager: bool = False  # True: no CUDA graphs, whatever cudagraph_mode says
    cudagraph_mode: str = "FULL"  # which steps replay CUDA graphs (engine/cuda_graph.py): CUDAGRAPH_MODES

    def __post_init__(self) -> None:
        check_choice("attention_backend", self.attention_backend, KERNEL_CHOICES)
        check_bool("enforce_eager", self.enforce_eager)
        check_choice("cudagraph_mode", self.cudagraph_mode, CUDAGRAPH_MODES)


@dataclass
class EngineConfig:
    model: ModelSettings
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    device: DeviceConfig = field(default_factory=DeviceConfig)
    speculative: SpeculativeConfig | None = None

    def __post_init__(self) -> None:
        if self.device.attention_backend == "triton" and self.cache.kv_cache != "paged":
            raise ValueError(f"attention_backend='triton' needs kv_cache='paged', got kv_cache={self.cache.kv_cache!r}")
        if self.speculative is not None:
            if self.cache.kv_cache != "paged":
                raise ValueError(f"speculative_config needs kv_cache='paged', got kv_cache={self.cache.kv_cache!r}")
            # Each decode reserves cache slots and step budget for the drafts it verifies.
            self.scheduler = dataclasses.replace(self.scheduler,
                                                 num_lookahead_slots=self.speculative.num_speculative_tokens)

    @classmethod
    def from_engine_args(cls, model: str, **engine_args) -> EngineConfig:
        """The parts, each taking the keyword arguments named like its fields."""
        def take(part_cls: type) -> dict:
            names = {f.name for f in dataclasses.fields(part_cls)}
            return {k: engine_args.pop(k) for k in list(engine_args) if k in names}

        parts = {"cache": CacheConfig(**take(CacheConfig)), "scheduler": SchedulerConfig(**take(SchedulerConfig)),
                 "device": DeviceConfig(**take(DeviceConfig))}
        settings = ModelSettings(model, **take(ModelSettings))
        speculative = SpeculativeConfig.from_dict(engine_args.pop("speculative_config", None))
        if engine_args:
            raise TypeError(f"unexpected engine argument(s): {', '.join(sorted(engine_args))}")
        return cls(settings, **parts, speculative=speculative)


def resolve_max_model_len(requested: int | None, config: ModelConfig) -> int:
    limit = config.max_position_embeddings
    if config.sliding_window is not None:
        # minillm implements full attention only; within one window the two are the same thing.
        limit = min(limit, config.sliding_window)
    if requested is None:
        return limit
    check_int("max_model_len", requested, 2, limit)
    return requested


def check_checkpoint_quantization(settings: ModelSettings, config: ModelConfig, path: Path) -> None:
    """A quantized checkpoint loads as it was quantized; asking for something else is an error."""
    method, group = settings.quantization, settings.quant_group_size
    if config.quantization is None or method is None:
        return
    if method != config.quantization or method == "int4" and group != config.quant_group_size:
        raise ValueError(
            f"quantization={method!r} (quant_group_size={group}) does not match the checkpoint in {path}, which "
            f"is already quantized as {config.quantization!r}"
            f"{f' with group size {config.quant_group_size}' if config.quantization == 'int4' else ''}; "
            "pass quantization=None")
