"""What a step of the model runner hands back to the scheduler: the tokens it produced, and the
prompt tokens it scored; and the same while the step is still on the device."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from minillm.sample.sampler import SampledTokens, SamplerOutput
from minillm.sequence import Sequence


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

    def select(self, seqs: list[int]) -> ModelRunnerOutput:
        """The output of the sequences `seqs` only (indices into the batch), in that order."""
        starts = [0]
        for tokens in self.sampled_token_ids:
            starts.append(starts[-1] + len(tokens))
        rows = [row for i in seqs for row in range(starts[i], starts[i + 1])]
        return ModelRunnerOutput([self.sampled_token_ids[i] for i in seqs],
                                 None if self.sampler_output is None else self.sampler_output.select(rows),
                                 [self.spec_token_ids[i] for i in seqs], [self.prompt_logprobs[i] for i in seqs])


class AsyncModelRunnerOutput:
    """A step queued on the device whose tokens may not have reached the host yet (vLLM's name): the
    engine can schedule, prepare and queue the next step before `get_output` waits for them, and that
    step can take these tokens as its inputs on the device (`token_rows`, `device_token_ids`)."""

    def __init__(self, seqs: list[Sequence], num_sampled: list[int], sampled: SampledTokens | None,
                 prompt_logprobs: list[SamplerOutput | None]) -> None:
        """num_sampled: rows of `sampled` per sequence, in order."""
        self.sampled = sampled
        self._num_sampled = num_sampled
        self._prompt_logprobs = prompt_logprobs
        self._output: ModelRunnerOutput | None = None
        # The row of each sampling sequence's newest token (its last row), by the sequence itself: a
        # request id may come back, aborted and added again, while this step is in flight.
        self.token_rows: dict[Sequence, int] = {}
        end = 0
        for seq, n in zip(seqs, num_sampled):
            end += n
            if n:
                self.token_rows[seq] = end - 1

    @classmethod
    def done(cls, output: ModelRunnerOutput) -> AsyncModelRunnerOutput:
        """A step whose tokens the host already holds (a speculative step reads its drafts' verdict)."""
        ready = cls([], [], None, [])
        ready._output = output
        return ready

    @property
    def device_token_ids(self) -> torch.Tensor | None:
        return None if self.sampled is None else self.sampled.token_ids

    def get_output(self) -> ModelRunnerOutput:
        """The step's tokens on the host: waits for the device the first time."""
        if self._output is None:
            if self.sampled is None:
                self._output = ModelRunnerOutput([[] for _ in self._num_sampled], prompt_logprobs=self._prompt_logprobs)
            else:
                out = self.sampled.read()
                tokens, row = [], 0
                for n in self._num_sampled:
                    tokens.append(out.token_ids[row:row + n])
                    row += n
                self._output = ModelRunnerOutput(tokens, out, prompt_logprobs=self._prompt_logprobs)
        return self._output
