"""Perplexity: exp(mean negative log-likelihood of each next token) over held-out text.

The text is cut into non-overlapping windows (the first token of each window is predicted with no
context, as in the training script, so the figures agree). Several windows go through the model
at once as one flattened batch.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from minillm.engine.model_runner import sequence_logits
from minillm.llm import LLM


def perplexity(llm: LLM, token_ids: list[int], window: int = 512, windows_per_batch: int = 8) -> dict:
    engine = llm.llm_engine
    window = min(window, engine.max_model_len)
    chunks = [token_ids[s:s + window + 1] for s in range(0, len(token_ids) - 1, window)]
    chunks = [c for c in chunks if len(c) > 1]
    nll, count = 0.0, 0
    for i in tqdm(range(0, len(chunks), windows_per_batch), desc="perplexity", leave=False):
        batch = chunks[i:i + windows_per_batch]
        logits = torch.cat(sequence_logits(engine.model, [c[:-1] for c in batch]))
        targets = torch.tensor([t for c in batch for t in c[1:]], device=logits.device)
        nll += F.cross_entropy(logits, targets, reduction="sum").item()
        count += len(targets)
    return {"tokens": count, "nll_per_token": nll / count, "perplexity": math.exp(nll / count)}
