"""The architectures minillm implements, in one place: the class that runs each, and how its
Hugging Face `config.json` translates into a ModelConfig. Anything else is refused here, by name,
before a weight is read.

One class covers the whole Llama family: its members differ only by flags (biases, q/k norms, tied
embeddings, RoPE scaling), which the table below and the translation set.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from torch import nn

from minillm.config.model import ModelConfig
from minillm.models.llama import LlamaForCausalLM
from minillm.quant import INT4_GROUP_SIZES, QUANTIZATION_METHODS
from minillm.quant.awq import QUANT_METHOD as AWQ
from minillm.quant.awq import read_awq_config
from minillm.quant.compressed_tensors import QUANT_METHOD as COMPRESSED_TENSORS
from minillm.quant.compressed_tensors import read_compressed_tensors_config

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")


@dataclass(frozen=True)
class Architecture:
    model_type: str
    model_cls: type[nn.Module]  # built as model_cls(config, ops); implements models.interface.CausalLM
    qkv_bias: bool = False  # q, k and v always have biases (o_proj none), whatever attention_bias says
    qk_norm: bool = False  # each head's query and key are RMS-normalised before RoPE
    max_position_embeddings: int = 2048  # transformers' default, for a config.json that leaves it out


ARCHITECTURES = {
    "LlamaForCausalLM": Architecture("llama", LlamaForCausalLM),  # Llama 2/3/3.x, SmolLM2, TinyLlama, ...
    "MistralForCausalLM": Architecture("mistral", LlamaForCausalLM, max_position_embeddings=131072),
    "Qwen2ForCausalLM": Architecture("qwen2", LlamaForCausalLM, qkv_bias=True, max_position_embeddings=32768),
    "Qwen3ForCausalLM": Architecture("qwen3", LlamaForCausalLM, qk_norm=True, max_position_embeddings=32768),
}


def model_class(architecture: str) -> type[nn.Module]:
    if architecture not in ARCHITECTURES:
        raise ValueError(f"no model implements architecture {architecture!r}: minillm implements "
                         f"{', '.join(ARCHITECTURES)}")
    return ARCHITECTURES[architecture].model_cls


def read_model_config(path: Path) -> ModelConfig:
    """The ModelConfig of a Hugging Face model folder (its config.json and generation_config.json)."""
    config_file = path / "config.json"
    if not config_file.is_file():
        raise ValueError(f"model folder {path} has no config.json; is it a Hugging Face model?")
    try:
        raw = json.loads(config_file.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{config_file} is not valid JSON: {e}") from None
    generation = path / "generation_config.json"
    eos = raw.get("eos_token_id")
    if generation.is_file():
        eos = json.loads(generation.read_text()).get("eos_token_id", eos)
    return model_config_from_hf(raw, eos_token_id=eos, source=str(config_file))


def model_config_from_hf(raw: dict, eos_token_id=None, source: str = "config") -> ModelConfig:
    """A config.json's contents translated, for the architecture it names; refused by name where
    minillm does not implement what it asks for."""
    archs = raw.get("architectures") or []
    arch = archs[0] if archs else None
    if arch not in ARCHITECTURES:
        raise ValueError(f"unsupported architecture {arch!r} in {source}: minillm implements "
                         f"{', '.join(ARCHITECTURES)}")
    family = ARCHITECTURES[arch]
    if raw.get("hidden_act", "silu") != "silu":
        raise ValueError(f"unsupported hidden_act {raw['hidden_act']!r} in {source}: only 'silu'")
    heads = raw["num_attention_heads"]
    kv_heads = raw.get("num_key_value_heads") or heads
    if heads % kv_heads:
        raise ValueError(f"num_attention_heads={heads} is not a multiple of "
                         f"num_key_value_heads={kv_heads} in {source}")
    rope_theta, rope_scaling = _read_rope(raw, source)
    quantization, quant_group_size, quant_method = _read_quantization(raw, source)
    eos = raw.get("eos_token_id") if eos_token_id is None else eos_token_id
    eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,))
    return ModelConfig(
        architecture=arch,
        model_type=family.model_type,
        vocab_size=raw["vocab_size"],
        hidden_size=raw["hidden_size"],
        intermediate_size=raw["intermediate_size"],
        num_hidden_layers=raw["num_hidden_layers"],
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=raw.get("head_dim") or raw["hidden_size"] // heads,
        max_position_embeddings=raw.get("max_position_embeddings", family.max_position_embeddings),
        rms_norm_eps=raw.get("rms_norm_eps", 1e-6),
        rope_theta=rope_theta,
        rope_scaling=rope_scaling,
        tie_word_embeddings=raw.get("tie_word_embeddings", False),
        qkv_bias=family.qkv_bias or raw.get("attention_bias", False),
        o_bias=raw.get("attention_bias", False),
        mlp_bias=raw.get("mlp_bias", False),
        qk_norm=family.qk_norm,
        sliding_window=_active_sliding_window(raw),
        checkpoint_dtype=str(raw.get("dtype") or raw.get("torch_dtype") or "float32"),
        bos_token_id=raw.get("bos_token_id"),
        eos_token_ids=eos_ids,
        quantization=quantization,
        quant_group_size=quant_group_size,
        quant_method=quant_method,
    )


def _read_quantization(raw: dict, source: str) -> tuple[str | None, int | None, str | None]:
    """(quantization, group size, quant_method) of a checkpoint's `quantization_config`: minillm's own
    (see models/quant_checkpoint.py), compressed-tensors' int4 (see quant/compressed_tensors.py) or
    AutoAWQ's GEMM layout (see quant/awq.py); other formats (GPTQ, bitsandbytes, ...) pack their
    weights differently and are refused rather than misread."""
    qc = raw.get("quantization_config")
    if qc is None:
        return None, None, None
    if qc.get("quant_method") == COMPRESSED_TENSORS:
        return "int4", read_compressed_tensors_config(qc, source), COMPRESSED_TENSORS
    if qc.get("quant_method") == AWQ:
        return "int4", read_awq_config(qc, source), AWQ
    if qc.get("quant_method") != "minillm":
        raise ValueError(f"unsupported quantization_config {qc.get('quant_method')!r} in {source}: minillm reads "
                         f"checkpoints it quantized itself, {COMPRESSED_TENSORS!r} int4 ones and {AWQ!r} GEMM ones; "
                         "load the unquantized model with quantization=...")
    method, group_size = qc.get("quantization"), qc.get("group_size")
    if method not in QUANTIZATION_METHODS or (method == "int4" and group_size not in INT4_GROUP_SIZES):
        raise ValueError(f"quantization_config in {source} must give a quantization in {QUANTIZATION_METHODS} "
                         f"(int4 with a group_size in {INT4_GROUP_SIZES}); got quantization={method!r}, "
                         f"group_size={group_size!r}")
    return method, group_size, "minillm"


def _read_rope(raw: dict, source: str) -> tuple[float, dict]:
    # transformers 5 writes `rope_parameters` (with rope_theta inside); 4.x writes `rope_theta`
    # and an optional `rope_scaling`.
    params = dict(raw.get("rope_parameters") or raw.get("rope_scaling") or {})
    theta = float(params.pop("rope_theta", raw.get("rope_theta", 10000.0)))
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ValueError(f"unsupported rope scaling type {rope_type!r} in {source}: minillm "
                         f"implements {', '.join(SUPPORTED_ROPE_TYPES)}")
    if raw.get("partial_rotary_factor", params.get("partial_rotary_factor", 1.0)) != 1.0:
        raise ValueError(f"partial_rotary_factor in {source} is not supported (only 1.0)")
    params["rope_type"] = rope_type
    return theta, params if rope_type != "default" else {}


def _active_sliding_window(raw: dict) -> int | None:
    # Qwen2/3 carry a sliding_window value but only use it when use_sliding_window is true.
    window = raw.get("sliding_window")
    if window is None or raw.get("use_sliding_window", True) is False:
        return None
    return int(window)
