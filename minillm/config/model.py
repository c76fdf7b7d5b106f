"""What minillm needs to know about a checkpoint: the shapes and flags of its model.

One dataclass covers the whole Llama family; the differences between Llama, Mistral, Qwen2, Qwen3
and SmolLM2 are a handful of flags (biases, q/k norms, tied embeddings, RoPE scaling). It is read
from a Hugging Face `config.json` by the model registry (minillm/models/registry.py), which refuses,
by name, anything the model file does not implement.
"""

from __future__ import annotations

from dataclasses import dataclass, field


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
    # A checkpoint saved by minillm.models.quant_checkpoint.save_quantized, or by another tool whose format
    # maps onto minillm's (minillm/quant/compressed_tensors.py, awq.py), holds its decoder already quantized;
    # quant_method names the writer, as its quantization_config does ("minillm", "compressed-tensors", "awq").
    quantization: str | None = None
    quant_group_size: int | None = None
    quant_method: str | None = None

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
