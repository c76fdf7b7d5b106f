"""What minillm needs to know about a checkpoint, read from its Hugging Face `config.json`.

One dataclass covers the whole Llama family; the differences between Llama, Mistral, Qwen2, Qwen3
and SmolLM2 are a handful of flags (biases, q/k norms, tied embeddings, RoPE scaling).
Anything the model file does not implement is refused here, by name, before a weight is read.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from minillm.quant import INT4_GROUP_SIZES, QUANTIZATION_METHODS

SUPPORTED_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",  # Llama 2/3/3.x, SmolLM2, TinyLlama, ...
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
}
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")


@dataclass(frozen=True)
class ModelConfig:
    architecture: str
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    max_position_embeddings: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict = field(default_factory=dict)
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    sliding_window: int | None = None
    checkpoint_dtype: str = "float32"
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    # A checkpoint saved by minillm.models.quant_checkpoint.save_quantized holds its decoder already quantized.
    quantization: str | None = None
    quant_group_size: int | None = None

    @property
    def num_queries_per_kv(self) -> int:
        return self.num_attention_heads // self.num_key_value_heads

    def kv_bytes_per_token(self, element_size: int, scale_size: int = 0) -> int:
        """K and V of one token in every layer: 2 * layers * kv_heads * (head_dim * element_size + scale_size),
        where a quantized cache keeps one scale of scale_size bytes per (token, layer, K or V, kv head)."""
        return 2 * self.num_hidden_layers * self.num_key_value_heads * (self.head_dim * element_size + scale_size)

    def parameter_counts(self) -> dict[str, int]:
        """The checkpoint's parameters by role, from the shapes alone: "embedding" (the input table),
        "head" (the output projection; 0 when tied, as the embedding table is then the head),
        "linear" (the matmul weights of the decoder layers: q, k, v, o, gate, up, down) and "other"
        (norms and biases). K and V have num_key_value_heads heads, Q and O num_attention_heads."""
        hidden, inter, d = self.hidden_size, self.intermediate_size, self.head_dim
        q, kv = self.num_attention_heads * d, self.num_key_value_heads * d
        linear = hidden * (q + 2 * kv) + q * hidden + 3 * hidden * inter
        other = (2 * hidden  # the two RMSNorms of a layer
                 + (q + 2 * kv if self.qkv_bias else 0) + (hidden if self.o_bias else 0)
                 + (2 * inter + hidden if self.mlp_bias else 0) + (2 * d if self.qk_norm else 0))
        embedding = self.vocab_size * hidden
        return {"embedding": embedding, "head": 0 if self.tie_word_embeddings else embedding,
                "linear": self.num_hidden_layers * linear, "other": self.num_hidden_layers * other + hidden}

    @classmethod
    def from_dir(cls, path: Path) -> ModelConfig:
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
        return cls.from_hf_dict(raw, eos_token_id=eos, source=str(config_file))

    @classmethod
    def from_hf_dict(cls, raw: dict, eos_token_id=None, source: str = "config") -> ModelConfig:
        archs = raw.get("architectures") or []
        arch = archs[0] if archs else None
        if arch not in SUPPORTED_ARCHITECTURES:
            raise ValueError(
                f"unsupported architecture {arch!r} in {source}: minillm implements "
                f"{', '.join(SUPPORTED_ARCHITECTURES)}")
        model_type = SUPPORTED_ARCHITECTURES[arch]
        if raw.get("hidden_act", "silu") != "silu":
            raise ValueError(f"unsupported hidden_act {raw['hidden_act']!r} in {source}: only 'silu'")
        heads = raw["num_attention_heads"]
        kv_heads = raw.get("num_key_value_heads") or heads
        if heads % kv_heads:
            raise ValueError(f"num_attention_heads={heads} is not a multiple of "
                             f"num_key_value_heads={kv_heads} in {source}")
        rope_theta, rope_scaling = _read_rope(raw, source)
        quantization, quant_group_size = _read_quantization(raw, source)
        eos = raw.get("eos_token_id") if eos_token_id is None else eos_token_id
        eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,))
        return cls(
            architecture=arch,
            model_type=model_type,
            vocab_size=raw["vocab_size"],
            hidden_size=raw["hidden_size"],
            intermediate_size=raw["intermediate_size"],
            num_hidden_layers=raw["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            head_dim=raw.get("head_dim") or raw["hidden_size"] // heads,
            max_position_embeddings=raw.get("max_position_embeddings", 2048),
            rms_norm_eps=raw.get("rms_norm_eps", 1e-6),
            rope_theta=rope_theta,
            rope_scaling=rope_scaling,
            tie_word_embeddings=raw.get("tie_word_embeddings", False),
            # Qwen2 always has q/k/v biases (and none on o_proj); Llama's attention_bias covers all four.
            qkv_bias=model_type == "qwen2" or raw.get("attention_bias", False),
            o_bias=raw.get("attention_bias", False),
            mlp_bias=raw.get("mlp_bias", False),
            qk_norm=model_type == "qwen3",
            sliding_window=_active_sliding_window(raw),
            checkpoint_dtype=str(raw.get("dtype") or raw.get("torch_dtype") or "float32"),
            bos_token_id=raw.get("bos_token_id"),
            eos_token_ids=eos_ids,
            quantization=quantization,
            quant_group_size=quant_group_size,
        )


def _read_quantization(raw: dict, source: str) -> tuple[str | None, int | None]:
    """minillm's own `quantization_config` (see quant_checkpoint.py); other formats (GPTQ, AWQ, ...)
    pack their weights differently and are refused rather than misread."""
    qc = raw.get("quantization_config")
    if qc is None:
        return None, None
    if qc.get("quant_method") != "minillm":
        raise ValueError(f"unsupported quantization_config {qc.get('quant_method')!r} in {source}: minillm reads "
                         "only checkpoints it quantized itself; load the unquantized model with quantization=...")
    method, group_size = qc.get("quantization"), qc.get("group_size")
    if method not in QUANTIZATION_METHODS or (method == "int4" and group_size not in INT4_GROUP_SIZES):
        raise ValueError(f"quantization_config in {source} must give a quantization in {QUANTIZATION_METHODS} "
                         f"(int4 with a group_size in {INT4_GROUP_SIZES}); got quantization={method!r}, "
                         f"group_size={group_size!r}")
    return method, group_size


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
