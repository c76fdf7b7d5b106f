"""Presence, frequency and repetition penalties, with vLLM's meaning (the first two are OpenAI's).

They change the logits before temperature and the filters, greedy rows included:
- repetition_penalty r (1: none) looks at the prompt and the output: the logit of every token seen
  in either is divided by r when positive and multiplied by r when negative, so r > 1 makes each of
  them less likely whatever its sign (the CTRL paper's rule, as vLLM and Hugging Face apply it);
- frequency_penalty f subtracts f times the number of times the token occurs in the output;
- presence_penalty p subtracts p once from every token that occurs in the output at all.
Negative values of f and p encourage repeats instead.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from minillm.sampling_params import SamplingParams


@dataclass
class Penalties:
    """One row per row of logits."""

    presence: torch.Tensor  # [B]
    frequency: torch.Tensor  # [B]
    repetition: torch.Tensor  # [B]
    prompt_token_ids: list[list[int]]
    output_token_ids: list[list[int]]  # what the row has generated before the token it samples

    @classmethod
    def from_params(cls, params: list[SamplingParams], prompt_token_ids: list[list[int]],
                    output_token_ids: list[list[int]], device: torch.device) -> Penalties:
        def column(name: str) -> torch.Tensor:
            return torch.tensor([getattr(p, name) for p in params], dtype=torch.float32, device=device)

        return cls(column("presence_penalty"), column("frequency_penalty"), column("repetition_penalty"),
                   prompt_token_ids, output_token_ids)


def token_counts(rows: list[list[int]], vocab: int, device: torch.device) -> torch.Tensor:
    """[len(rows), vocab] float32: how many times each token occurs in each row."""
    width = max((len(row) for row in rows), default=0)
    # Rows are padded with `vocab`, a column of its own that is cut away at the end.
    ids = torch.tensor([row + [vocab] * (width - len(row)) for row in rows], dtype=torch.long,
                       device=device).reshape(len(rows), width)
    counts = torch.zeros(len(rows), vocab + 1, device=device)
    counts.scatter_add_(1, ids, torch.ones(ids.shape, device=device))
    return counts[:, :vocab]


def apply_penalties(logits: torch.Tensor, penalties: Penalties) -> torch.Tensor:
    """logits [B, vocab] float32 -> the penalized logits; a banned token (-inf) stays banned."""
    vocab = logits.shape[1]
    output_counts = token_counts(penalties.output_token_ids, vocab, logits.device)
    in_output = output_counts > 0
    seen = in_output | (token_counts(penalties.prompt_token_ids, vocab, logits.device) > 0)
    repetition = torch.where(seen, penalties.repetition[:, None], 1.0)
    logits = torch.where(logits > 0, logits / repetition, logits * repetition)
    logits = logits - penalties.frequency[:, None] * output_counts
    return logits - penalties.presence[:, None] * in_output
