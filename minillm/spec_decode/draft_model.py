"""Drafts from a small model of the same vocabulary, run on the same sequences as the target.

The draft keeps K/V in a paged pool of its own with as many blocks as the target's, addressed by the
target's block tables: a block id means the same tokens in both pools, so the block manager, the
lookahead slots the scheduler reserves and preemption serve the draft too. Proposing k tokens takes
k draft steps: the first catches the draft up on every token it has not seen (a whole prompt, or the
one or two tokens the last verification added), each later one feeds the previous draft token. That
token stays on the device, copied into the next step's input ids there: the host queues the k steps
back to back and does not wait for them. The drafts stay on the device too, for the target to
verify there (sample/proposal.py); the host reads them with the target's tokens.

Rollback is a number: the draft's K/V for rejected tokens stay in the pool, but the draft counts as
having computed only the tokens the target kept, so they are overwritten before they are read.
A new sequence's draft starts from its first token even when the target found its prompt in the
prefix cache: the draft's K/V for a cached block may be missing its last token, which the draft
never fed when it was proposed last.

On a GPU the draft's steps replay CUDA graphs of their own, over the draft's model and pool: the
catch-up step is ragged, each later one a uniform decode (engine/cuda_graph.py). A later step of the
same sequences needs no host work at all: each sequence's position, length and slot move one token
on, on the device (PagedAttention.advance_decode), in a small graph of its own per padded size, so
the host's part of such a step is a few calls, where building its inputs took about 150 µs (a
tiny-draft step cost 0.68 of a plain step of tiny on an H200 before, 0.46 after: BENCHMARKS.md).
"""

from __future__ import annotations

import functools

import torch

from minillm.attention.paged import PagedAttention
from minillm.engine.cuda_graph import CudaGraphs, capture_graph
from minillm.engine.input_buffers import InputBuffers
from minillm.engine.model_input import ModelInput, build_model_input, execute_model_input
from minillm.models.interface import CausalLM
from minillm.sample.proposal import Proposal
from minillm.sample.sampler import SamplingMetadata, ban_tokens, per_row_random, sampling_probs
from minillm.sampling_params import GREEDY_EPS
from minillm.sequence import Sequence


class DraftModelProposer:
    def __init__(self, model: CausalLM, attn_backend: PagedAttention, buffers: InputBuffers,
                 generator: torch.Generator) -> None:
        """attn_backend: over the draft's own pool, read through the target's block tables; buffers:
        the draft's token ids and positions, in the runner's staging arena with attn_backend's
        metadata; generator: for unseeded requests."""
        self.model = model
        self.attn_backend = attn_backend
        self.buffers = buffers
        self.generator = generator
        self.cuda_graphs: CudaGraphs | None = None
        self.advance_graphs: dict[int, torch.cuda.CUDAGraph] = {}  # by padded decode size

    def capture_cuda_graphs(self, max_num_seqs: int, max_num_tokens: int, capture: bool = True,
                            decode_only: bool = False) -> None:
        """The draft's steps through CUDA graphs (capture=False: the same padded path, eagerly)."""
        self.cuda_graphs = CudaGraphs(self.model, self.attn_backend, self.buffers, max_num_seqs, max_num_tokens,
                                      max_num_seqs, capture, decode_only, "draft model")
        self.advance_graphs = {}  # those of an earlier capture would replay even where capture=False
        if capture:
            self._capture_advance()

    @torch.inference_mode()
    def _capture_advance(self) -> None:
        pool = None  # one memory pool for all: each graph's few small tensors
        for n in reversed(self.cuda_graphs.decode_sizes):
            self.advance_graphs[n], _ = capture_graph(functools.partial(self._advance, n), pool)
            pool = self.advance_graphs[n].pool()

    @torch.inference_mode()
    def propose(self, seqs: list[Sequence], num_tokens: list[int]) -> Proposal:
        probs: list[list[torch.Tensor]] = [[] for _ in seqs]
        # Each draft step's sequences and its tokens, on the device, a row per sequence: a step's
        # tokens are the next step's input without the host reading them.
        steps: list[tuple[list[int], torch.Tensor]] = []
        active = [i for i, k in enumerate(num_tokens) if k]
        padded = False  # whether the last step ran padded, as a CUDA graph's
        for j in range(max(num_tokens, default=0)):
            kept = [row for row, i in enumerate(active) if num_tokens[i] > j]
            active = [active[row] for row in kept]
            batch = [seqs[i] for i in active]
            if j == 0:  # roll back to what the target kept, then catch up on every token since
                starts = [min(s.num_draft_computed_tokens, s.num_computed_tokens) for s in batch]
                feed = [s.token_ids[start:] for s, start in zip(batch, starts)]
            else:  # the previous draft token, whose id only the device knows yet: a placeholder first
                starts = [s.num_draft_computed_tokens for s in batch]
                feed = [[0] for _ in batch]
            if padded and len(kept) == len(steps[-1][0]):
                model_input = self._advanced_input(len(batch))  # the same sequences: on the device
            else:
                model_input = build_model_input(batch, starts, feed, [1] * len(batch), self.attn_backend,
                                                self.buffers, self.cuda_graphs)
                self.buffers.arena.flush()
            padded = model_input.batch is not None
            if j:
                tokens = steps[-1][1]
                if len(kept) < len(tokens):
                    tokens = tokens[torch.tensor(kept).to(tokens.device, non_blocking=True)]
                model_input.input_ids[:len(batch)].copy_(tokens)
            logits = execute_model_input(self.model, self.attn_backend, model_input, self.cuda_graphs)
            for s, start, ids in zip(batch, starts, feed):
                s.num_draft_computed_tokens = start + len(ids)
            tokens, q = self._sample(logits, batch, j)
            steps.append((active, tokens))
            for row, i in enumerate(active):
                if q is not None and not seqs[i].params.greedy:
                    probs[i].append(q[row])
        # Left on the device: the host never waits for the draft (sample/proposal.py).
        return Proposal(list(num_tokens), [torch.stack(p) if p else None for p in probs], None,
                        torch.cat([tokens for _, tokens in steps]) if steps else self.buffers.input_ids.tensor[:0],
                        [i for rows, _ in steps for i in rows])

    def _advanced_input(self, num_seqs: int) -> ModelInput:
        """The input of a uniform decode step of the num_seqs sequences the last padded step ran, each one
        token further; its token ids are left to the caller."""
        batch = self.cuda_graphs.descriptor([1] * num_seqs, [1] * num_seqs)
        if batch.num_seqs in self.advance_graphs:
            self.advance_graphs[batch.num_seqs].replay()
        else:
            self._advance(batch.num_seqs)
        return ModelInput(self.buffers.input_ids.tensor[:num_seqs], self.buffers.positions.tensor[:num_seqs],
                          self.attn_backend.graph_metadata(batch), self.buffers.logits_indices.tensor[:num_seqs],
                          [1] * num_seqs, batch)

    def _advance(self, num_seqs: int) -> None:
        self.buffers.positions.tensor[:num_seqs].copy_(self.attn_backend.advance_decode(num_seqs))

    def _sample(self, logits: torch.Tensor, seqs: list[Sequence],
                offset: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """A draft token per row, on the device, from the draft's distribution after the request's own
        filters (the q the rejection sampler divides by); greedy rows take the argmax and need no q."""
        meta = SamplingMetadata.from_seqs(seqs, logits.device, [offset] * len(seqs))
        ban_tokens(logits, meta.banned_token_ids)
        if meta.all_greedy:
            return logits.argmax(dim=-1), None
        q = sampling_probs(logits, meta)
        noise = per_row_random(q.shape, meta.generators, self.generator, torch.Tensor.exponential_)
        greedy = meta.temperature < GREEDY_EPS
        return torch.where(greedy, logits.argmax(dim=-1), (q / noise).argmax(dim=-1)), q
