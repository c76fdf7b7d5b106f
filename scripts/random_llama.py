"""Write a Llama-shaped checkpoint with random weights, for throughput benchmarks where the quality
of the text does not matter but the shapes do (the GPU runs use a 0.5B to 1B model):

    python scripts/random_llama.py /tmp/llama-0.5b                # ~0.45B parameters, bf16
    minillm bench throughput --model /tmp/llama-0.5b --device cuda

The writer is `minillm.bench.random_llama`, which chapter 01 also uses.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from minillm.bench.random_llama import write_random_llama

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
