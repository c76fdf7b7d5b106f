"""Speculative decoding: a cheap proposer guesses k tokens, the target model checks them all in one
forward pass, and a rejection sampler keeps the longest prefix the target agrees with, plus one
token of the target's own. The output is the target's, exactly (greedy) or in distribution
(sampling); only the number of target forward passes changes.

- proposer.py: what the runner asks of a proposer, which returns a Proposal (minillm/sample/proposal.py,
  where the rejection sampler reads it); proposers.py: the one an engine's config asks for;
- ngram.py: prompt lookup, drafts copied from the sequence's own earlier tokens;
- draft_model.py: a small model of the same vocabulary, batched, on its own paged KV pool;
- acceptance.py: acceptance counted (drafts, tokens, accepted, per position), alpha and the formula;
- chi_square.py: the test that sampled tokens follow the target's distribution.

Its settings are `SpeculativeConfig` (minillm/config/speculative.py); the rejection sampler,
Leviathan et al.'s accept / residual / bonus rule vectorized over the batch, is a sampler
(minillm/sample/rejection_sampler.py).
"""
