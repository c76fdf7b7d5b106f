"""A Llama-shaped checkpoint with random weights, written locally: for measurements where the
quality of the text does not matter but the shapes do (a step's cost depends on the shapes only).

The tokenizer is tiny's: token ids below 4096 are valid in any larger vocabulary, so prompts drawn
from it work at every size. Safetensors, written by transformers. A shape can also be given by its
config.json alone, for an engine that makes random weights on the device (load_format="dummy").
"""

from __future__ import annotations

import shutil
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from minillm.models.loader import resolve_model_path


def llama_config(hidden: int, layers: int, heads: int, kv_heads: int, intermediate: int, vocab: int) -> LlamaConfig:
    return LlamaConfig(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                       num_key_value_heads=kv_heads, intermediate_size=intermediate, vocab_size=vocab,
                       max_position_embeddings=16384, bos_token_id=0, eos_token_id=0, pad_token_id=0,
                       architectures=["LlamaForCausalLM"])


def write_llama_config(out: Path | str, **shape: int) -> Path:
    """Only the config.json of a Llama of `shape` (bench/shapes.py), for an engine with load_format="dummy"."""
    llama_config(**shape).save_pretrained(out)
    return Path(out)


def write_random_llama(out: Path | str, hidden: int, layers: int, heads: int, kv_heads: int, intermediate: int,
                       vocab: int, dtype: torch.dtype = torch.bfloat16, seed: int = 0) -> int:
    """Writes the checkpoint to `out` and returns its parameter count."""
    out = Path(out)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(llama_config(hidden, layers, heads, kv_heads, intermediate, vocab)).to(dtype)
    model.save_pretrained(out)
    tiny = resolve_model_path("tiny")
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (tiny / name).exists():
            shutil.copy(tiny / name, out / name)
    return sum(p.numel() for p in model.parameters())
