"""How often a draft model's greedy guesses match the target's: the number that decides whether
speculative decoding pays.

With greedy decoding, speculation produces exactly the target's own greedy text, so it can be
replayed without a speculative engine: generate the target's continuation once, then at each
point let the draft propose k tokens from the same context. The proposal is accepted up to its
first mismatch; the target's next token comes free with the verification, so the replay advances
by accepted + 1 tokens per target call.

Two rates are reported, because both are in use:
- acceptance_rate: Leviathan et al.'s alpha, the chance that a draft token is accepted given that
  the tokens before it were: accepted / (accepted + rejected), where each target call rejects at
  most one token (those after a rejection are never judged). Expected tokens per target call are
  then (1 - alpha^(k+1)) / (1 - alpha).
- accepted_per_proposed: accepted / all draft tokens proposed, as vLLM's metrics count it; tokens
  after a rejection count as proposed, so it is always the lower of the two.
"""

from __future__ import annotations

import random

from tqdm.auto import tqdm

from minillm.llm import LLM
from minillm.sampling_params import SamplingParams


def sample_prompts(token_ids: list[int], num_prompts: int, prompt_len: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    starts = sorted(rng.sample(range(len(token_ids) - prompt_len), num_prompts))
    return [token_ids[s:s + prompt_len] for s in starts]


def greedy_acceptance(target: LLM, draft: LLM, prompts: list[list[int]], num_tokens: int = 64,
                      k: int = 4) -> dict:
    greedy = SamplingParams(temperature=0.0, max_tokens=num_tokens, ignore_eos=True)
    outs = target.generate([{"prompt_token_ids": p} for p in prompts], greedy, use_tqdm=False)
    continuations = [o.outputs[0].token_ids for o in outs]
    done = [0] * len(prompts)  # tokens of each continuation already produced
    proposed = accepted = rejected = target_calls = 0
    bar = tqdm(total=len(prompts) * num_tokens, desc="acceptance", leave=False)
    while active := [i for i in range(len(prompts)) if done[i] < num_tokens]:
        guesses = draft.generate(
            [{"prompt_token_ids": prompts[i] + continuations[i][:done[i]]} for i in active],
            [SamplingParams(temperature=0.0, max_tokens=min(k, num_tokens - done[i]), ignore_eos=True)
             for i in active], use_tqdm=False)
        for i, guess in zip(active, guesses):
            proposal = guess.outputs[0].token_ids
            truth = continuations[i][done[i]:done[i] + len(proposal)]
            matched = next((j for j, (a, b) in enumerate(zip(proposal, truth)) if a != b), len(proposal))
            proposed += len(proposal)
            accepted += matched
            rejected += matched < len(proposal)
            target_calls += 1
            step = min(matched + 1, num_tokens - done[i])
            done[i] += step
            bar.update(step)
    bar.close()
    return {"k": k, "prompts": len(prompts), "tokens": len(prompts) * num_tokens,
            "proposed": proposed, "accepted": accepted, "rejected": rejected,
            "acceptance_rate": accepted / (accepted + rejected), "accepted_per_proposed": accepted / proposed,
            "tokens_per_target_call": len(prompts) * num_tokens / target_calls}
