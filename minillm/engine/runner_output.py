"""What a step of the model runner hands back to the scheduler: the tokens it produced, and the
prompt tokens it scored."""

from __future__ import annotations

from dataclasses import dataclass, field

from minillm.sample.sampler import SamplerOutput


@dataclass
class ModelRunnerOutput:
    # Per sequence of the batch, the tokens it produced: none for a prompt chunk that leaves some of
    # the prompt for later, one for a decode, up to k + 1 once k drafted tokens are verified.
    sampled_token_ids: list[list[int]]
    # The rows behind those tokens, in the same order, for their logprobs.
    sampler_output: SamplerOutput | None = None
    # Speculative decoding: per sequence, the draft tokens this step verified (none without). The
    # tokens it produced are the accepted ones (a prefix of them) and then one of the target's own.
    spec_token_ids: list[list[int]] = field(default_factory=list)
    # prompt_logprobs: per sequence, the prompt tokens this step's chunk scored, in order (None where
    # it scored none); apart from the sampled rows above.
    prompt_logprobs: list[SamplerOutput | None] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.spec_token_ids:
            self.spec_token_ids = [[] for _ in self.sampled_token_ids]
        if not self.prompt_logprobs:
            self.prompt_logprobs = [None for _ in self.sampled_token_ids]
