"""Parallel sampling: `SamplingParams.n`, n completions of one prompt (vLLM's names and behaviour).

The engine runs completion j as a request of its own, a child: id `f"{j}_{request_id}"`, the same
parameters with n = 1, and seed + j where a seed is given (so completion j is what a request with that
seed alone would give). Only the first child scores the prompt when prompt_logprobs asks for it: the
scores are the prompt's, the same for every child, and every output carries them once they are
complete. The children's outputs go back out under the parent's id, each CompletionOutput's `index`
saying which completion it is: streamed, each child's output as it comes, the RequestOutput
`finished` once the last child is; otherwise one RequestOutput holding all n, in order, when the
last one finishes.

The prompt is computed once. The children go into the queue together, in order; the first one
admitted computes the prompt, and the scheduler puts the prompt's full blocks in the prefix cache as
it schedules them (engine/scheduler.py), so the others, admitted after it in the same step, find
them there (chapter 02) and compute only the prompt's last block, as in vLLM v1. Without prefix
caching, or with a prompt shorter than a block, there is nothing to share, and each child computes
the whole prompt.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from minillm.outputs import CompletionOutput, Logprob, RequestOutput
from minillm.sampling_params import RequestOutputKind, SamplingParams
from minillm.sequence import Sequence


def child_request_id(index: int, request_id: str) -> str:
    return f"{index}_{request_id}"


def child_params(params: SamplingParams, index: int) -> SamplingParams:
    """Completion `index`'s parameters: one completion, its own seed, the prompt scored by the first only."""
    return dataclasses.replace(params, n=1, seed=None if params.seed is None else params.seed + index,
                               prompt_logprobs=params.prompt_logprobs if index == 0 else None)


@dataclass
class ParentRequest:
    request_id: str
    children: list[Sequence]  # completion j is children[j]
    running: set[int] = field(init=False)  # completions not finished
    finals: dict[int, CompletionOutput] = field(init=False, default_factory=dict)  # FINAL_ONLY: the finished ones
    first_output: RequestOutput | None = field(init=False, default=None)  # FINAL_ONLY: the first child's final one

    def __post_init__(self) -> None:
        self.running = set(range(len(self.children)))

    @property
    def first(self) -> Sequence:
        return self.children[0]

    def prompt_logprobs(self) -> list[dict[int, Logprob] | None] | None:
        """The prompt's scores, which the first child computes for all, once it has them all."""
        first = self.first
        return None if first.prompt_logprobs is None or first.needs_prompt_logprobs else first.prompt_logprobs

    def merge(self, index: int, out: RequestOutput) -> RequestOutput | None:
        """A child's output as the parent's: streamed, at once; otherwise once every child finished."""
        completion = dataclasses.replace(out.outputs[0], index=index)
        if completion.finished():
            self.running.discard(index)
        if self.first.params.output_kind is RequestOutputKind.CUMULATIVE:
            return dataclasses.replace(out, request_id=self.request_id, outputs=[completion],
                                       finished=not self.running, prompt_logprobs=self.prompt_logprobs())
        self.finals[index] = completion
        if index == 0:
            self.first_output = out  # the prompt's fields (its scores included) come from the first child
        if self.running:
            return None
        return dataclasses.replace(self.first_output, request_id=self.request_id,
                                   outputs=[self.finals[j] for j in range(len(self.children))])


class ParallelSampling:
    """The engine's parents and their children, by request id."""

    def __init__(self) -> None:
        self.parents: dict[str, ParentRequest] = {}
        self.children: dict[str, tuple[ParentRequest, int]] = {}  # child request id -> (parent, index)

    def knows(self, request_id: str) -> bool:
        return request_id in self.parents or request_id in self.children

    def add(self, request_id: str, children: list[Sequence]) -> None:
        parent = ParentRequest(request_id, children)
        self.parents[request_id] = parent
        for index, child in enumerate(children):
            self.children[child.request_id] = parent, index

    def parent_of(self, request_id: str) -> ParentRequest | None:
        """The parent of a parent's or child's id; None for a request of one completion."""
        if (parent := self.parents.get(request_id)) is not None:
            return parent
        return self.children[request_id][0] if request_id in self.children else None

    def remove(self, parent: ParentRequest) -> None:
        del self.parents[parent.request_id]
        for child in parent.children:
            del self.children[child.request_id]

    def merge(self, outputs: list[RequestOutput]) -> list[RequestOutput]:
        """A step's outputs with the children's turned into their parents' (and parents that finished forgotten)."""
        merged = []
        for out in outputs:
            if out.request_id not in self.children:
                merged.append(out)
                continue
            parent, index = self.children[out.request_id]
            if (parent_out := parent.merge(index, out)) is not None:
                merged.append(parent_out)
            if not parent.running:
                self.remove(parent)
        return merged
