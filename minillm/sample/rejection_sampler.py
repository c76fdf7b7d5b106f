"""Which drafted tokens to keep: the rule of Leviathan et al. (2023) and Chen et al. (2023).

A sequence brings k draft tokens x_1..x_k, proposed from distributions q_1..q_k, and the target's
k + 1 distributions p_1..p_{k+1} from one forward pass over them. Going left to right, x_i is kept
with probability min(1, p_i(x_i) / q_i(x_i)). At the first rejection the token is drawn instead from
the residual normalize(max(0, p_i - q_i)) and the run ends there; when all k are kept, a bonus
token is drawn from p_{k+1}. Each emitted token is then distributed exactly as p: the output is the
target's own, whatever the draft. Greedy requests keep x_i while it equals argmax p_i, then take
that argmax, so their output is token for token the target's greedy output.

Tensors are padded to the batch's largest k; a sequence's tokens end at the first -1.
"""

from __future__ import annotations

import itertools

import torch

from minillm.sample.proposal import Proposal
from minillm.sample.sampler import (
    SamplerOutput,
    SamplingMetadata,
    fill_logprobs,
    per_row_random,
    restrict,
    sampling_probs,
)
from minillm.sequence import Sequence

PAD = -1


def greedy_accept(target_token_ids: torch.Tensor, draft_token_ids: torch.Tensor,
                  num_draft_tokens: torch.Tensor) -> torch.Tensor:
    """target_token_ids [B, k + 1]: the target's argmax at each verified position; draft_token_ids
    [B, k]; num_draft_tokens [B]: how many of each row's drafts are real. -> [B, k + 1] tokens."""
    k = draft_token_ids.shape[1]
    real = torch.arange(k, device=draft_token_ids.device) < num_draft_tokens[:, None]
    kept = ((draft_token_ids == target_token_ids[:, :k]) & real).cumprod(dim=1).bool()
    return _emit(kept, draft_token_ids, target_token_ids.gather(1, kept.sum(dim=1, keepdim=True)))


def stochastic_accept(target_probs: torch.Tensor, draft_probs: torch.Tensor, draft_token_ids: torch.Tensor,
                      num_draft_tokens: torch.Tensor, uniforms: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """target_probs [B, k + 1, V]; draft_probs [B, k, V]; draft_token_ids [B, k]; num_draft_tokens [B];
    uniforms [B, k] in [0, 1); noise [B, V] ~ Exp(1), for the one token drawn from the residual or p.
    -> [B, k + 1] tokens."""
    batch, k = draft_token_ids.shape
    rows = torch.arange(batch, device=draft_token_ids.device)
    real = torch.arange(k, device=draft_token_ids.device) < num_draft_tokens[:, None]
    x = draft_token_ids.clamp(min=0)[..., None]
    p_x = target_probs[:, :k].gather(2, x)[..., 0]
    q_x = draft_probs.gather(2, x)[..., 0]
    # u < p / q, written without the division: q(x) = 0 (never proposed by a sampling draft) accepts
    # whenever p(x) > 0, and p(x) = 0 always rejects.
    kept = ((uniforms * q_x < p_x) & real).cumprod(dim=1).bool()
    stop = kept.sum(dim=1)  # the position of the first rejection, or k_b when all were kept
    p = target_probs[rows, stop]
    # After a rejection: the residual. After all k kept: the bonus, from p itself (q counts as 0).
    q = torch.where((stop < num_draft_tokens)[:, None], draft_probs[rows, stop.clamp(max=k - 1)], 0) if k else 0
    residual = (p - q).clamp(min=0)
    # p == q to rounding leaves no residual mass, and the rejection had no chance: fall back to p.
    residual = torch.where(residual.sum(dim=1, keepdim=True) > 0, residual, p)
    # The exponential race: argmax(w / E) picks index i with probability w_i / sum(w), unnormalized.
    last = (residual / noise).argmax(dim=1, keepdim=True)
    return _emit(kept, draft_token_ids, last)


def _emit(kept: torch.Tensor, draft_token_ids: torch.Tensor, last: torch.Tensor) -> torch.Tensor:
    """The kept prefix of the drafts, then `last` [B, 1], then padding."""
    out = torch.full((kept.shape[0], kept.shape[1] + 1), PAD, dtype=torch.long, device=kept.device)
    out[:, :-1] = torch.where(kept, draft_token_ids, PAD)
    return out.scatter_(1, kept.sum(dim=1, keepdim=True), last)


class RejectionSampler:
    """The sampler of a step that verifies drafts: every sequence of the batch goes through it, one
    without drafts (a prompt's first token) simply draws from p, as the plain sampler would."""

    greedy_accept = staticmethod(greedy_accept)  # class attributes, so that the course can swap them
    stochastic_accept = staticmethod(stochastic_accept)

    def __init__(self, generator: torch.Generator, num_speculative_tokens: int) -> None:
        self.generator = generator  # for requests without a seed of their own
        # Every sequence's tensors are padded to k, whatever the batch: a seeded request then draws
        # the same random numbers, and so the same tokens, alone and in any batch. Not across a
        # preemption: its recompute, like a prompt, verifies no drafts (as in vLLM), so the token it
        # samples is drawn as plain decoding draws it, where the decode step it replaces verified some.
        self.k = num_speculative_tokens

    def __call__(self, logits: torch.Tensor, seqs: list[Sequence],
                 proposal: Proposal) -> tuple[list[list[int]], SamplerOutput]:
        """logits [rows, V]: each sequence's drafts + 1 rows in batch order; proposal: the drafts of
        seqs (their q where they have one, else one-hot: n-gram, greedy). Returns the tokens each
        sequence emits and their rows' logprobs (the target's), in order."""
        device = logits.device
        counts = proposal.num_tokens
        k, vocab = self.k, logits.shape[1]
        row_seqs = [seq for seq, n in zip(seqs, counts) for _ in range(n + 1)]
        offsets = [j for n in counts for j in range(n + 1)]
        # Penalties count the drafts before a position as output: only they need the drafts' values now.
        before = [d[:j] for d in proposal.token_ids for j in range(len(d) + 1)] if any(
            s.params.has_penalties for s in seqs) else None
        meta = SamplingMetadata.from_seqs(row_seqs, device, offsets, before)
        want_logprobs = any(n is not None for n in meta.num_logprobs)
        raw = logits.log_softmax(dim=-1) if want_logprobs else None
        logits = restrict(logits, meta)
        target = logits.argmax(dim=-1)
        # An all-greedy step decides on the host, from the target's argmax read back in one copy with
        # drafts still on the device: a few dozen numbers, where the device would take a dozen launches
        # of a few microseconds each (on a GPU, part of why a small model's verification step cost two
        # plain steps).
        work = torch.device("cpu") if meta.all_greedy else device
        if meta.all_greedy:
            target = proposal.read_with(target)
        draft_token_ids = proposal.token_ids
        starts = torch.tensor(list(itertools.accumulate((n + 1 for n in counts[:-1]), initial=0)), device=work)
        num = torch.tensor(counts, device=work)
        # Row of each (sequence, position); positions past a sequence's drafts repeat its last row.
        index = starts[:, None] + torch.minimum(torch.arange(k + 1, device=work)[None], num[:, None])
        drafts = torch.tensor([d + [PAD] * (k - len(d)) for d in draft_token_ids], dtype=torch.long,
                              device=work).reshape(len(seqs), k)
        tokens = self.greedy_accept(target[index], drafts, num)
        if not meta.all_greedy:
            generators = [s.generator for s in seqs]
            sampled = self.stochastic_accept(
                sampling_probs(logits, meta)[index], self._draft_probs(proposal.probs, drafts, k, vocab), drafts,
                num, self._uniforms(generators, counts, k, device),
                per_row_random((len(seqs), vocab), generators, self.generator, torch.Tensor.exponential_))
            greedy_rows = torch.tensor([s.params.greedy for s in seqs], device=device)
            tokens = torch.where(greedy_rows[:, None], tokens, sampled)
        emitted = [[t for t in row if t != PAD] for row in tokens.tolist()]
        out = SamplerOutput(token_ids=[t for row in emitted for t in row])
        if raw is not None:
            rows = torch.tensor([start + j for start, row in zip(starts.tolist(), emitted) for j in range(len(row))],
                                device=device)
            fill_logprobs(out, raw[rows], torch.tensor(out.token_ids, device=device),
                          max(n or 0 for n in meta.num_logprobs))
        return emitted, out

    def _uniforms(self, generators: list[torch.Generator | None], counts: list[int], k: int,
                  device: torch.device) -> torch.Tensor:
        """[B, k] uniforms, drawn only for sequences with drafts: one without draws its token exactly as
        the plain sampler would, so a seeded request's numbers never depend on its neighbours'."""
        uniforms = torch.zeros(len(counts), k, device=device)
        rows = [b for b, n in enumerate(counts) if n]
        if rows:
            uniforms[rows] = per_row_random((len(rows), k), [generators[b] for b in rows], self.generator,
                                            torch.Tensor.uniform_)
        return uniforms

    @staticmethod
    def _draft_probs(draft_probs: list[torch.Tensor | None], drafts: torch.Tensor, k: int, vocab: int) -> torch.Tensor:
        """q for every sequence, [B, k, V]: the draft's, or one-hot on the drafted token."""
        q = torch.nn.functional.one_hot(drafts.clamp(min=0), vocab).float()
        for b, probs in enumerate(draft_probs):
            if probs is not None:
                q[b, :probs.shape[0]] = probs
        return q
