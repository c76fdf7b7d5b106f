"""Presence, frequency and repetition penalties against a plain element-by-element reference: in the
sampler, and in greedy generation through the engine (with and without speculation), where the
reference runs the model on the whole text at every step."""

from __future__ import annotations

import pytest
import torch

from minillm import LLM, SamplingParams
from minillm.engine.model_runner import sequence_logits
from minillm.sample.penalties import Penalties, apply_penalties

ENGINE = {"dtype": "float32", "max_model_len": 64, "max_num_seqs": 4}


def reference(logits: torch.Tensor, prompt: list[int], output: list[int], presence_penalty: float,
              frequency_penalty: float, repetition_penalty: float) -> torch.Tensor:
    """vLLM's rule, one token at a time: repetition on the prompt's and the output's tokens (divide a
    positive logit, multiply a negative one), then frequency and presence on the output's."""
    out = logits.clone()
    for token in set(prompt) | set(output):
        out[token] = out[token] / repetition_penalty if out[token] > 0 else out[token] * repetition_penalty
    for token in set(output):
        out[token] -= frequency_penalty * output.count(token) + presence_penalty
    return out


def test_penalties_match_the_reference_row_by_row():
    gen = torch.Generator().manual_seed(0)
    vocab = 40
    logits = torch.randn(4, vocab, generator=gen) * 3
    logits[0, 5] = float("-inf")  # a banned token stays banned
    prompts = [torch.randint(0, vocab, (n,), generator=gen).tolist() for n in (6, 1, 12, 3)]
    outputs = [[5, 7, 7, 7, 2], [], [1, 1, 30], [39]]
    rows = [(0.5, 0.25, 1.3), (1.0, 1.0, 0.7), (-2.0, 2.0, 100.0), (0.0, 0.0, 1.0)]
    params = [SamplingParams(presence_penalty=p, frequency_penalty=f, repetition_penalty=r) for p, f, r in rows]
    penalties = Penalties.from_params(params, prompts, outputs, logits.device)
    ours = apply_penalties(logits, penalties)
    for i, (p, f, r) in enumerate(rows):
        torch.testing.assert_close(ours[i], reference(logits[i], prompts[i], outputs[i], p, f, r))
    assert ours[0, 5] == float("-inf")


def greedy_reference(llm: LLM, prompt: list[int], steps: int, **penalties: float) -> list[int]:
    """Greedy decoding that recomputes the whole sequence's logits at every step (no cache, no sampler)."""
    output: list[int] = []
    for _ in range(steps):
        logits = sequence_logits(llm.llm_engine.model, [prompt + output])[0][-1].float().cpu()
        output.append(int(reference(logits, prompt, output, **penalties).argmax()))
    return output


def test_greedy_generation_with_penalties_is_the_references():
    """Beside a request without penalties, and again with n-gram speculation, whose drafts count as
    output for the positions after them."""
    plain = LLM("tiny", **ENGINE)
    prompt = plain.get_tokenizer()("x = [1, 2, 3]\nx = [1, 2, 3]\nx = [1, ")["input_ids"]  # it repeats itself
    penalties = {"presence_penalty": 0.5, "frequency_penalty": 0.4, "repetition_penalty": 1.3}
    expected = greedy_reference(plain, prompt, 8, **penalties)
    params = [SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, **penalties),
              SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)]
    unpenalized = plain.generate([{"prompt_token_ids": prompt}], params[1], use_tqdm=False)[0].outputs[0].token_ids
    assert expected != unpenalized, "the penalties must change this text"
    speculative = LLM("tiny", speculative_config={"method": "ngram", "num_speculative_tokens": 3}, **ENGINE)
    for llm in (plain, speculative):
        outs = llm.generate([{"prompt_token_ids": prompt}] * 2, params, use_tqdm=False)
        assert [o.outputs[0].token_ids for o in outs] == [expected, unpenalized]


@pytest.mark.parametrize("kwargs, message", [
    ({"presence_penalty": 2.5}, "presence_penalty must be in [-2.0, 2.0]"),
    ({"frequency_penalty": float("nan")}, "frequency_penalty must be in [-2.0, 2.0]"),
    ({"repetition_penalty": 0}, "repetition_penalty must be in [0.01, 100.0]"),
    ({"repetition_penalty": float("inf")}, "repetition_penalty must be in [0.01, 100.0]"),
])
def test_bad_penalties_name_the_argument(kwargs, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        SamplingParams(**kwargs)
