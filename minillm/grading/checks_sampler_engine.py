"""Checks for exercise 00, part 3: the learner's `sample` as the real engine's sampler, drawing every
row of every step, and the engine's output token for token what its own sampler gives: greedy
requests, and seeded ones (each with a generator of its own, so that its tokens depend on its seed
alone, whatever shares its batch).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from unittest import mock

import torch

from minillm.engine.model_runner import ModelRunner
from minillm.grading.engine_check import PROMPTS
from minillm.grading.feedback import CheckFailed, call_learner
from minillm.grading.sampler_cases import Settings, validate
from minillm.llm import LLM
from minillm.outputs import RequestOutput
from minillm.sample.sampler import SampledTokens, Sampler, SamplingMetadata
from minillm.sampling_params import SamplingParams

MAX_TOKENS = 8
# Every prompt with each setting, in one batch: a greedy row, a temperature alone, all four filters.
ENGINE_SETTINGS = (Settings(temperature=0.0), Settings(temperature=1.0),
                   Settings(temperature=0.8, top_k=40, top_p=0.9, min_p=0.05))
SEEDED_DRAW = ("the engine draws with the exponential race from each request's own generator: noise = "
               "torch.empty_like(probs).exponential_(generator=generator), then (probs / noise).argmax(dim=-1). "
               "Another way to draw (a uniform and a cumulative sum, say) can sample the right distribution, which "
               "parts 1 and 2 test, yet give other tokens than the engine for the same seed")


class LearnerSampler(Sampler):
    """The engine's Sampler, logprobs and banned tokens included, with the learner's `sample` drawing
    each row's token, greedy rows too, with the row's settings and generator."""

    def __init__(self, sample: Callable, generator: torch.Generator) -> None:
        super().__init__(generator)
        self.sample = sample

    def sample_on_device(self, logits: torch.Tensor, meta: SamplingMetadata) -> SampledTokens:
        return super().sample_on_device(logits, dataclasses.replace(meta, all_greedy=False))

    def _sample(self, logits: torch.Tensor, meta: SamplingMetadata) -> torch.Tensor:
        def column(values: torch.Tensor | None, row: int, off: float) -> float:
            return off if values is None else values[row].item()

        tokens = []
        for row, generator in enumerate(meta.generators):
            # No temperatures at all: every row is greedy.
            settings = Settings(column(meta.temperature, row, 0.0), int(column(meta.top_k, row, 0)),
                                column(meta.top_p, row, 1.0), column(meta.min_p, row, 0.0))
            row_logits = logits[row:row + 1]
            case = f"a call from the engine: one row of logits {list(row_logits.shape)}, {settings}"
            out = call_learner(self.sample, "sample", case, row_logits.clone(), settings.temperature, settings.top_k,
                               settings.top_p, settings.min_p, generator or self.generator)
            tokens.append(validate(out, row_logits, case))
        return torch.cat(tokens)


def check_engine(sample: Callable, llm: LLM) -> None:
    """Greedy and seeded requests, generated with the engine's sampler and then with `sample` in its
    place: the same tokens."""
    runner: ModelRunner = llm.llm_engine.model_runner
    if runner.rejection_sampler is not None:
        raise CheckFailed("this LLM speculates, and its drafts are verified by the rejection sampler, not by "
                          "sample: create it without speculative_config")
    requests = [(prompt, _params(settings, seed)) for seed, (prompt, settings)
                in enumerate((p, s) for p in PROMPTS for s in ENGINE_SETTINGS)]
    expected = _generate(llm, requests)
    with mock.patch.object(runner, "sampler", LearnerSampler(sample, runner.sampler.generator)):
        try:
            got = _generate(llm, requests)
        except CheckFailed:
            raise
        except Exception as e:
            raise CheckFailed(f"the engine failed with your sample in place ({type(e).__name__}: {e})") from e
    for (prompt, params), want, have in zip(requests, expected, got, strict=True):
        _compare(prompt, params, want.outputs[0].token_ids, have.outputs[0].token_ids)
    print(f"check_engine passed: {len(PROMPTS)} prompts x {len(ENGINE_SETTINGS)} settings (greedy, seeded at "
          f"temperature 1, seeded with every filter) in one batch, {MAX_TOKENS} tokens each: your sample gives "
          "the engine's tokens, token for token")


def _params(settings: Settings, seed: int) -> SamplingParams:
    return SamplingParams(**dataclasses.asdict(settings), seed=None if settings.temperature == 0 else seed,
                          max_tokens=MAX_TOKENS, ignore_eos=True)


def _generate(llm: LLM, requests: list[tuple[str, SamplingParams]]) -> list[RequestOutput]:
    return llm.generate([prompt for prompt, _ in requests], [params for _, params in requests], use_tqdm=False)


def _compare(prompt: str, params: SamplingParams, want: list[int], have: list[int]) -> None:
    if want == have:
        return
    at = next(i for i, (a, b) in enumerate(zip(want, have)) if a != b)
    settings = Settings(params.temperature, params.top_k, params.top_p, params.min_p)
    hint = ("temperature 0 is greedy: each row's argmax of the logits" if params.greedy else
            f"{SEEDED_DRAW}. If it draws so already, look at what differs in the engine: a vocabulary of "
            f"thousands of tokens, one row per call")
    raise CheckFailed(f"with your sample in the engine, the request {prompt!r} ({settings}, seed {params.seed}) "
                      f"generated other tokens than with the engine's sampler\n  expected: {want}\n  got:      "
                      f"{have}\n  first difference at generated token {at}\n  hint: {hint}")
