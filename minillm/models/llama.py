"""The Llama family decoder: Llama 2/3/3.x, Mistral, Qwen2/2.5, Qwen3 and SmolLM2.

Inputs are flattened: the tokens of every sequence in the step sit in one [tokens] vector with
their positions, with no padding. Where a token's keys and values live, and which earlier tokens
it may attend to, is the attention backend's business (`attn`), not the model's.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from minillm.config.model import ModelConfig
from minillm.kernels.ops import KernelOps, load_ops
from minillm.layers.activation import SiluAndMul
from minillm.layers.linear import MergedLinear
from minillm.layers.norm import RMSNorm
from minillm.layers.rotary import RotaryEmbedding
from minillm.models.interface import AttentionFn


class LlamaAttention(nn.Module):
    def __init__(self, config: ModelConfig, layer_idx: int, ops: KernelOps) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = d = config.head_dim
        self.qkv_proj = MergedLinear(config.hidden_size, [self.num_heads * d, self.num_kv_heads * d,
                                                          self.num_kv_heads * d], bias=config.qkv_bias)
        self.o_proj = nn.Linear(self.num_heads * d, config.hidden_size, bias=config.o_bias)
        if config.qk_norm:  # Qwen3 normalises each head's query and key before RoPE
            self.q_norm = RMSNorm(d, config.rms_norm_eps, ops)
            self.k_norm = RMSNorm(d, config.rms_norm_eps, ops)
        self.qk_norm = config.qk_norm

    def forward(self, positions: torch.Tensor, x: torch.Tensor, rotary: RotaryEmbedding,
                attn: AttentionFn) -> torch.Tensor:
        q, k, v = self.qkv_proj(x).split(self.qkv_proj.output_sizes, dim=-1)
        q = q.view(-1, self.num_heads, self.head_dim)
        k = k.view(-1, self.num_kv_heads, self.head_dim)
        v = v.view(-1, self.num_kv_heads, self.head_dim)
        norms = (self.q_norm, self.k_norm) if self.qk_norm else ()
        # q and k go to attention unrotated, with their rotation: a paged cache rotates and stores them in one launch.
        out = attn(self.layer_idx, q, k, v, rotation=rotary.rotation(positions, q, *norms))
        return self.o_proj(out.reshape(-1, self.num_heads * self.head_dim))


class LlamaMLP(nn.Module):
    def __init__(self, config: ModelConfig, ops: KernelOps) -> None:
        super().__init__()
        inter = config.intermediate_size
        self.gate_up_proj = MergedLinear(config.hidden_size, [inter, inter], bias=config.mlp_bias)
        self.act_fn = SiluAndMul(ops)
        self.down_proj = nn.Linear(inter, config.hidden_size, bias=config.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_up_proj(x)))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer_idx: int, ops: KernelOps) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, ops)
        self.self_attn = LlamaAttention(config, layer_idx, ops)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, ops)
        self.mlp = LlamaMLP(config, ops)

    def forward(self, positions: torch.Tensor, h: torch.Tensor, residual: torch.Tensor | None,
                rotary: RotaryEmbedding, attn: AttentionFn) -> tuple[torch.Tensor, torch.Tensor]:
        """h: the last sublayer's output, not yet added to the residual stream (the first layer: the
        embeddings, with residual None). Each norm adds the pending output in as it normalises, in
        place: h and residual are used only as the norm returns them."""
        if residual is None:
            h, residual = self.input_layernorm(h), h
        else:
            h, residual = self.input_layernorm(h, residual)
        h = self.self_attn(positions, h, rotary, attn)
        h, residual = self.post_attention_layernorm(h, residual)
        return self.mlp(h), residual


class LlamaModel(nn.Module):
    def __init__(self, config: ModelConfig, ops: KernelOps) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(LlamaDecoderLayer(config, i, ops) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, ops)
        self.rotary = RotaryEmbedding(config.head_dim, config.rope_theta, config.rope_scaling,
                                      config.max_position_embeddings, ops)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, attn: AttentionFn) -> torch.Tensor:
        h, residual = self.embed_tokens(input_ids), None
        for layer in self.layers:
            h, residual = layer(positions, h, residual, self.rotary, attn)
        return self.norm(h, residual)[0]


class LlamaForCausalLM(nn.Module):
    # Checkpoint tensor name -> (our merged module, shard index); see loader.py and models/interface.py.
    packed_modules_mapping = {
        "q_proj": ("qkv_proj", 0), "k_proj": ("qkv_proj", 1), "v_proj": ("qkv_proj", 2),
        "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1),
    }

    def __init__(self, config: ModelConfig, ops: KernelOps | None = None) -> None:
        """ops: the engine's kernels, which every layer with a kernel calls (the references without)."""
        super().__init__()
        self.config = config
        self.ops = ops = ops if ops is not None else load_ops("torch")
        self.model = LlamaModel(config, ops)
        self.lm_head = None if config.tie_word_embeddings else nn.Linear(
            config.hidden_size, config.vocab_size, bias=False)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, attn: AttentionFn) -> torch.Tensor:
        """input_ids, positions: [tokens] -> final hidden states [tokens, hidden_size]."""
        return self.model(input_ids, positions, attn)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Only the rows that are sampled from reach the (vocab-sized, expensive) output head."""
        weight = self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        return F.linear(hidden, weight).float()
