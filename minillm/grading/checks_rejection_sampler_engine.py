"""Checks for exercise 05, part 3: the learner's `greedy_accept` and `stochastic_accept` as the real
engine's rejection sampler, verifying a draft model's tokens: greedy output token for token that of
decoding without speculation, sampled output distributed as the target's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from unittest import mock

import torch

from minillm import sequence
from minillm.engine.model_runner import sequence_logits
from minillm.grading.engine_check import check_generation
from minillm.grading.feedback import CheckFailed, call_learner, shape
from minillm.grading.rejection_sampler_cases import GREEDY_ARGS, GREEDY_RULE, STOCHASTIC_ARGS, STOCHASTIC_RULE, validate
from minillm.llm import LLM
from minillm.sample import rejection_sampler
from minillm.sample.rejection_sampler import RejectionSampler
from minillm.sample.sampler import SamplingMetadata, sampling_probs
from minillm.sampling_params import SamplingParams
from minillm.spec_decode.chi_square import chi_square, p_value

# The engine check: seeded requests of 3 tokens at temperature 1. The first token ends the prompt's
# prefill; the step after it verifies a draft for the second, so that token went through the
# learner's function (accepted, or drawn from the residual).
ENGINE_PROMPT = "def fibonacci(n):\n"
ENGINE_REQUESTS = 800
ENGINE_PARAMS = SamplingParams(temperature=1.0, max_tokens=3, ignore_eos=True)
ENGINE_MIN_P_VALUE = 1e-3
MIN_GROUP = 20  # requests sharing a first token, for their second tokens to be tested


def _keep_nothing(target_token_ids: torch.Tensor, draft_token_ids: torch.Tensor,
                  num_draft_tokens: torch.Tensor) -> torch.Tensor:
    """A greedy_accept that keeps no draft: each step emits the target's own next token, which is
    greedy decoding without speculation."""
    return rejection_sampler.greedy_accept(target_token_ids, draft_token_ids, torch.zeros_like(num_draft_tokens))


def check_engine(greedy_accept: Callable, stochastic_accept: Callable, llm: LLM) -> None:
    """The learner's functions as the engine's rejection sampler: greedy output token for token that
    of decoding without speculation; sampled output distributed as the target's."""
    sampler = llm.llm_engine.model_runner.rejection_sampler
    if sampler is None:
        raise CheckFailed("this LLM does not speculate: create it with speculative_config={'model': "
                          "course.draft_model, 'num_speculative_tokens': 4}")
    k = sampler.k
    try:
        done = check_generation(llm, sampler, "greedy_accept", _keep_nothing,
                                _validated(greedy_accept, "greedy_accept", GREEDY_ARGS), "greedy_accept")
    except CheckFailed as e:
        if not str(e).startswith("with your greedy_accept in the engine, "):
            raise  # not implemented, raised, or returned the wrong shape: the message says it all
        raise CheckFailed(f"{e}\n  hint: the reference is decoding without speculation, which the step named "
                          f"above describes; the engine verifies up to k = {k} drafts per step. If the checks of "
                          f"Part 1 pass, look at what differs in the engine: rows with fewer drafts than k, a "
                          f"batch of several rows. {GREEDY_RULE}") from None
    value = _engine_p_value(llm, sampler, stochastic_accept)
    if value < ENGINE_MIN_P_VALUE:
        raise CheckFailed(f"with your stochastic_accept in the engine, sampled tokens are not distributed as the "
                          f"target's: the second token of {ENGINE_REQUESTS} seeded requests at temperature 1 (each "
                          f"verified as a draft, k = {k}) against the target's exact distribution, chi-square "
                          f"p-value {value:.2g}\n  hint: if the checks of Part 2 pass, look at what differs in the "
                          f"engine: a vocabulary of {llm.llm_engine.model_config.vocab_size} tokens, rows with "
                          f"fewer drafts than k, a batch of many rows. {STOCHASTIC_RULE}")
    print(f"check_engine passed: greedy, {done.replace('the reference', 'decoding without speculation')}; "
          f"sampled, the second token of {ENGINE_REQUESTS} seeded requests is distributed as the target's "
          f"(chi-square p-value {value:.2g})")


def _validated(fn: Callable, name: str, names: Sequence[str]) -> Callable:
    """fn as the engine calls it, its output checked before the engine uses it."""
    def call(*args: torch.Tensor) -> torch.Tensor:
        case = "a call from the engine with " + ", ".join(f"{n} {shape(a)}" for n, a in zip(names, args))
        batch, k = args[names.index("draft_token_ids")].shape
        return validate(call_learner(fn, name, case, *args), batch, k, args[0].device, name, case)
    return call


def _engine_p_value(llm: LLM, sampler: RejectionSampler, stochastic_accept: Callable) -> float:
    learner = _validated(stochastic_accept, "stochastic_accept", STOCHASTIC_ARGS)
    prompt = llm.llm_engine.input_processor.process_prompt(ENGINE_PROMPT)[1]
    with mock.patch.object(sampler, "stochastic_accept", learner):
        try:
            return second_token_p_value(llm, prompt, ENGINE_PARAMS, ENGINE_REQUESTS)
        except CheckFailed:
            raise
        except Exception as e:
            raise CheckFailed(f"the engine failed with your stochastic_accept in place ({type(e).__name__}: "
                              f"{e})") from e


def second_token_p_value(llm: LLM, prompt: list[int], params: SamplingParams, n: int) -> float:
    """n requests seeded 0..n-1; the second token of each was the first one speculation produced (the
    first ends the prompt's prefill). After each first token a that MIN_GROUP requests or more share,
    the second tokens are tested against the target's exact p(. | prompt, a); the tests are combined."""
    outs = llm.generate([{"prompt_token_ids": prompt}] * n, [dataclasses.replace(params, seed=i) for i in range(n)],
                        use_tqdm=False)
    pairs = torch.tensor([o.outputs[0].token_ids[:2] for o in outs])
    counts = pairs[:, 0].bincount()
    firsts = (counts >= MIN_GROUP).nonzero().flatten().tolist()
    exact = exact_next_token_probs(llm, [prompt + [a] for a in firsts], params)
    statistic, dof = 0.0, 0
    for a, probs in zip(firsts, exact):
        seconds = torch.bincount(pairs[pairs[:, 0] == a, 1], minlength=len(probs))
        s, d, _ = chi_square(seconds, probs)
        statistic, dof = statistic + s, dof + d
    return p_value(statistic, dof)


def exact_next_token_probs(llm: LLM, sequences: list[list[int]], params: SamplingParams) -> torch.Tensor:
    """The target's next-token distribution after each sequence, under params' filters, [len, V]: no
    cache, no batching with anything else."""
    with torch.inference_mode():
        logits = torch.stack([x[-1] for x in sequence_logits(llm.llm_engine.model, sequences)])
    meta = SamplingMetadata.from_seqs([sequence.Sequence("p", None, s, params) for s in sequences], logits.device)
    return sampling_probs(logits, meta).cpu()
