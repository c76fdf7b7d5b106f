"""`echo` for /v1/completions: the prompt sent back before the completion, with its tokens'
log-probabilities when `logprobs` is asked for. This is how lm-evaluation-harness scores a
continuation (its loglikelihood tasks): it sends context + continuation as the prompt with echo,
logprobs=1 and max_tokens 0 or 1, and sums the continuation's token logprobs.

Each prompt token after the first gets its logprob given the tokens before it, its rank, and the
most likely tokens there: vLLM's prompt_logprobs, raw (from the model's logits, before any
penalty). The model reads the whole prompt once more for it, without the KV cache, in the worker
thread that tokenized the request; it touches no state the engine's steps use.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from minillm.async_llm import AsyncLLM
from minillm.engine.model_runner import sequence_logits
from minillm.outputs import Logprob
from minillm.sample.sampler import SamplerOutput, fill_logprobs


@dataclass
class Echo:
    """One prompt as sent back: its text, its first token (which has no logprob: nothing precedes
    it), and the entries of the tokens after it, when logprobs were asked for."""

    text: str
    first_token: str
    logprobs: list[dict[int, Logprob]] | None


def echo_prompt(engine: AsyncLLM, prompt: dict, num_logprobs: int | None) -> Echo:
    """prompt: {"prompt": text or None, "prompt_token_ids": [...]}, as prepared for the engine."""
    if (tokenizer := engine.get_tokenizer()) is None:
        raise ValueError("echo needs a tokenizer; this server was started with skip_tokenizer_init")
    ids = prompt["prompt_token_ids"]
    text = prompt["prompt"] if prompt["prompt"] is not None else tokenizer.decode(ids)
    entries = None if num_logprobs is None else prompt_logprobs(engine, ids, num_logprobs)
    return Echo(text, tokenizer.decode(ids[:1]), entries)


@torch.inference_mode()
def prompt_logprobs(engine: AsyncLLM, token_ids: list[int], top_n: int) -> list[dict[int, Logprob]]:
    """An entry per prompt token after the first: the token itself first, then the top_n most likely."""
    logits = sequence_logits(engine.llm_engine.model, [token_ids])[0][:-1].float()
    tokens = torch.tensor(token_ids[1:], device=logits.device)
    out = SamplerOutput(token_ids=token_ids[1:])
    fill_logprobs(out, logits.log_softmax(dim=-1), tokens, top_n)
    tokenizer = engine.get_tokenizer()
    entries = []
    for row, token in enumerate(token_ids[1:]):
        entry = {token: Logprob(out.sampled_logprobs[row], out.sampled_ranks[row])}
        for rank, (tid, lp) in enumerate(zip(out.top_token_ids[row], out.top_logprobs[row]) if top_n else (), 1):
            entry.setdefault(tid, Logprob(lp, rank))
        for tid, lp in entry.items():
            lp.decoded_token = tokenizer.decode([tid])
        entries.append(entry)
    return entries
