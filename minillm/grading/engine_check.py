"""The last check of every exercise: the learner's function, plugged into the real engine, makes it
generate exactly what the engine's reference makes it generate.

Greedy tokens are compared one for one, and so are their log-probabilities: a weak model can pick
the same tokens from wrong probabilities, which would hide a mistake that a stronger one shows.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from minillm.grading.feedback import CheckFailed, call_learner, shape
from minillm.llm import LLM
from minillm.outputs import RequestOutput
from minillm.sampling_params import SamplingParams

PROMPTS = ("def fibonacci(n):\n", "import os\nimport sys\n\n\nclass ", "for i in range(")
MAX_TOKENS = 24
LOGPROB_TOLERANCE = 1e-3


def check_generation(llm: LLM, owner: object, attr: str, reference: Callable, learner: Callable,
                     name: str) -> str:
    """Generate with `owner.attr = reference`, then with `owner.attr = learner`, and compare.
    `owner.attr` is left as it was found. Returns what was compared, for the check's message."""
    if llm.llm_engine.dtype != torch.float32:
        raise CheckFailed(f"this check compares against the reference in float32, but the LLM runs in "
                          f"{llm.llm_engine.dtype}: create it with LLM(model, dtype='float32'). In half "
                          "precision two correct implementations can round differently and pick different "
                          "tokens where two are nearly tied")
    with _swapped(owner, attr, reference):
        expected = _generate(llm)
    signature = inspect.signature(reference)
    last_call = {"inputs": "none yet", "returned": ""}

    def guarded(*args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(*args, **kwargs).arguments.items()
        last_call["inputs"] = ", ".join(f"{k} {shape(v)}" if isinstance(v, torch.Tensor) else f"{k}={v!r}"
                                        for k, v in bound)
        last_call["returned"] = ""
        out = call_learner(learner, name, f"a call from the engine with {last_call['inputs']}", *args, **kwargs)
        last_call["returned"] = f", and it returned {shape(out)}"
        return out

    with _swapped(owner, attr, guarded):
        try:
            got = _generate(llm)
        except CheckFailed:
            raise
        except Exception as e:
            raise CheckFailed(f"the engine failed with your {name} in place ({type(e).__name__}: {e})\n"
                              f"  its last call to {name} was with {last_call['inputs']}"
                              f"{last_call['returned']}") from e
    for i, (exp, out) in enumerate(zip(expected, got, strict=True)):
        _compare(name, f"prompt {i + 1} of {len(PROMPTS)} {PROMPTS[i]!r}", exp, out, llm)
    return (f"{len(PROMPTS)} prompts x {MAX_TOKENS} greedy tokens match the reference token for token "
            f"(log-probabilities within {LOGPROB_TOLERANCE})")


@contextmanager
def _swapped(owner: object, attr: str, value: Any) -> Iterator[None]:
    previous = getattr(owner, attr)
    setattr(owner, attr, value)
    try:
        yield
    finally:
        setattr(owner, attr, previous)


def _generate(llm: LLM) -> list[RequestOutput]:
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=1)
    # Eager steps only: a CUDA graph replays the kernels it recorded, not the function swapped in.
    with _swapped(llm.llm_engine.model_runner, "cuda_graphs", None):
        return llm.generate(list(PROMPTS), params, use_tqdm=False)


def _compare(name: str, prompt: str, expected: RequestOutput, got: RequestOutput, llm: LLM) -> None:
    want, have = expected.outputs[0], got.outputs[0]
    n_prompt = len(expected.prompt_token_ids)
    for i, (a, b) in enumerate(zip(want.token_ids, have.token_ids, strict=True)):
        step = f"generated token {i} comes from " + (
            f"the prefill step (start=0, n={n_prompt} prompt tokens)" if i == 0
            else f"a decode step (n=1, start={n_prompt + i - 1})")
        if a != b:
            raise CheckFailed(f"with your {name} in the engine, greedy generation differs from the reference "
                              f"on {prompt}\n  at generated token {i}: expected {_token(llm, a)}, got "
                              f"{_token(llm, b)}\n  {step}")
        diff = abs(want.logprobs[i][a].logprob - have.logprobs[i][b].logprob)
        if diff > LOGPROB_TOLERANCE:
            raise CheckFailed(f"with your {name} in the engine, on {prompt}, generated token {i} is the "
                              f"reference's token, but its log-probability is off by {diff:.3g} (more than "
                              f"{LOGPROB_TOLERANCE}): a stronger model could pick another token\n  {step}")


def _token(llm: LLM, token_id: int) -> str:
    tokenizer = llm.get_tokenizer()
    text = tokenizer.decode([token_id]) if tokenizer is not None else ""
    return f"{text!r} (id {token_id})"
