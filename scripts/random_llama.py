"""Write a Llama-shaped checkpoint with random weights, for throughput benchmarks where the quality
of the text does not matter but the shapes do (issue 5's GPU run asks for a 0.5B to 1B model):

    python scripts/random_llama.py /tmp/llama-0.5b                # ~0.45B parameters, bf16
    minillm bench throughput --model /tmp/llama-0.5b --device cuda

The tokenizer is tiny's (token ids below 4096 are valid in any larger vocabulary), so the benchmark's
prompts are the same held-out source as on the CPU. Safetensors, written by transformers.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from minillm.loader import resolve_model_path


def write_random_llama(out: Path, hidden: int, layers: int, heads: int, kv_heads: int, intermediate: int,
                       vocab: int, seed: int = 0) -> int:
    """Returns the parameter count."""
    torch.manual_seed(seed)
    config = LlamaConfig(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                         num_key_value_heads=kv_heads, intermediate_size=intermediate, vocab_size=vocab,
                         max_position_embeddings=16384, bos_token_id=0, eos_token_id=0, pad_token_id=0)
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(out)
    tiny = resolve_model_path("tiny")
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (tiny / name).exists():
            shutil.copy(tiny / name, out / name)
    return sum(p.numel() for p in model.parameters())


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--intermediate", type=int, default=4096)
    parser.add_argument("--vocab", type=int, default=32000)
    args = parser.parse_args()
    count = write_random_llama(args.out, args.hidden, args.layers, args.heads, args.kv_heads, args.intermediate,
                               args.vocab)
    print(f"wrote {args.out}: {count / 1e9:.2f}B parameters")
