"""Model shapes that benchmarks build with random weights made on the device (load_format="dummy"):
only the config travels through the disk, so a 7B-shaped model is ready in seconds on a GPU, where
writing and reading its 13.5 GB checkpoint would take longer than the measurement."""

from __future__ import annotations

# Llama-2-7B: 32 layers of width 4096, full multi-head attention (32 KV heads), 13.5 GB in bf16.
SHAPES = {"llama-2-7b": dict(hidden=4096, layers=32, heads=32, kv_heads=32, intermediate=11008, vocab=32000)}
