"""Runs one scheduled step in three parts: `prepare` flattens the batch into the runner's persistent
input buffers (and has the attention backend build its metadata in its own), `execute` runs the
model and computes logits where tokens are due, `sample` turns
them into tokens, a list for each sequence. Steps replay CUDA graphs where they were captured
(cuda_graph.py), the draft model's too.

A request with prompt_logprobs also gets logits at the prompt positions of each of its prefill
chunks: rows of their own before its sampled row, scored against the prompt's next tokens and not
sampled from. No other request's positions reach the (vocabulary-sized) output head.

With speculative decoding a proposer drafts tokens for the decodes first (spec_decode/), the target
computes logits at each of them and the rejection sampler keeps what it agrees with."""

from __future__ import annotations

import functools

import torch

from minillm.attention import NoCacheAttention
from minillm.attention.selector import create_attention_backend
from minillm.config.engine import SchedulerConfig
from minillm.engine.cuda_graph import CudaGraphs
from minillm.engine.input_buffers import InputBuffers
from minillm.engine.model_input import ModelInput, build_model_input, execute_model_input
from minillm.engine.runner_output import AsyncModelRunnerOutput, ModelRunnerOutput
from minillm.engine.scheduler import ScheduledBatch
from minillm.kv.cache_manager import KVCacheManager
from minillm.models.interface import CausalLM
from minillm.sample.proposal import Proposal
from minillm.sample.rejection_sampler import RejectionSampler
from minillm.sample.sampler import Sampler, SamplerOutput, SamplingMetadata, score_tokens
from minillm.sequence import Sequence
from minillm.spec_decode.proposer import Proposer
from minillm.utils.staging import StagingArena


class ModelRunner:
    def __init__(self, model: CausalLM, kv_cache_manager: KVCacheManager, config: SchedulerConfig,
                 max_model_len: int, device: torch.device, seed: int) -> None:
        """The attention backend over kv_cache_manager's storage runs on the model's kernels.
        Speculation is switched on afterwards, by `set_proposer`, as it needs the runner's buffers."""
        self.model = model
        self.kv_cache_manager = kv_cache_manager
        self.max_model_len = max_model_len
        self.device = device
        self.sampler = Sampler(torch.Generator(device=device).manual_seed(seed))
        self.max_num_seqs = config.max_num_seqs
        # A decode step of max_num_seqs rows must fit too, whatever the token budget.
        self.max_num_tokens = max(config.max_num_batched_tokens, config.max_num_seqs)
        # Every staged buffer in one arena, so that a step's inputs reach the device in one copy: the token
        # ids first, then the attention metadata (and a draft model's, made with the proposer).
        self.buffers = InputBuffers(self.max_num_tokens, StagingArena(device))
        self.attn_backend = create_attention_backend(kv_cache_manager, model.ops, model.config.head_dim,
                                                     self.max_num_tokens, config.max_num_seqs, max_model_len,
                                                     self.buffers.arena)
        self.cuda_graphs: CudaGraphs | None = None
        self.proposer: Proposer | None = None
        self.rejection_sampler: RejectionSampler | None = None

    def set_proposer(self, proposer: Proposer, num_speculative_tokens: int) -> None:
        self.proposer = proposer
        self.rejection_sampler = RejectionSampler(self.sampler.generator, num_speculative_tokens)

    def capture_cuda_graphs(self, capture: bool = True, decode_only: bool = False) -> None:
        """Run every step that fits through CUDA graphs (cuda_graph.py), the draft model's too
        (decode_only: pure decode steps alone); capture=False runs the same padded path eagerly, for
        tests on a CPU."""
        if not self.attn_backend.supports_cuda_graphs:
            raise ValueError(f"the {self.attn_backend.name!r} attention backend cannot be captured as a CUDA graph: "
                             "its steps run eagerly")
        # Logits at each sequence's last token and at each of its drafts.
        drafts = self.rejection_sampler.k if self.rejection_sampler else 0
        self.cuda_graphs = CudaGraphs(self.model, self.attn_backend, self.buffers, self.max_num_seqs,
                                      self.max_num_tokens, self.max_num_seqs * (1 + drafts), capture, decode_only,
                                      "target model")
        # Only a proposer that runs a model has graphs to capture (the n-gram one runs none).
        capture_draft = getattr(self.proposer, "capture_cuda_graphs", None)
        if capture_draft is not None:
            capture_draft(self.max_num_seqs, self.max_num_tokens, capture, decode_only)

    @torch.inference_mode()
    def execute_model(self, batch: ScheduledBatch,
                      previous: AsyncModelRunnerOutput | None = None) -> AsyncModelRunnerOutput:
        """The step queued on the device; previous: the step queued before it and not yet read, whose
        newest tokens are this batch's placeholders (async scheduling: `prepare`)."""
        if self.proposer is None or not any(batch.num_spec_tokens):
            model_input = self.prepare(batch, previous=previous)
            return self.sample(self.execute(model_input), batch.seqs, model_input)
        return AsyncModelRunnerOutput.done(self._speculate(batch))

    def _speculate(self, batch: ScheduledBatch) -> ModelRunnerOutput:
        """Drafts proposed, then verified by the target: the rejection sampler reads its verdict at once."""
        proposal = self.proposer.propose(batch.seqs, batch.num_spec_tokens)
        logits = self.execute(self.prepare(batch, proposal))
        rows = [i for i, sample in enumerate(batch.do_sample) if sample]  # prompt chunks have no logits
        verified = proposal.select(rows)
        emitted, sampled = self.rejection_sampler(logits, [batch.seqs[i] for i in rows], verified)
        tokens: list[list[int]] = [[] for _ in batch.seqs]
        spec: list[list[int]] = [[] for _ in batch.seqs]
        for i, run, drafts in zip(rows, emitted, verified.token_ids):
            tokens[i], spec[i] = run, drafts
        return ModelRunnerOutput(tokens, sampled, spec)

    def prepare(self, batch: ScheduledBatch, proposal: Proposal | None = None,
                previous: AsyncModelRunnerOutput | None = None) -> ModelInput:
        """The batch's inputs; with a proposal, each sequence's drafts follow its last token (fewer than
        the slots reserved where the proposer found fewer) and each gets logits. Drafts still on the
        device are copied into the input ids there, behind placeholders on the host; so is the token
        that `previous` sampled for each of its sequences, the last input of each here."""
        if proposal is None:
            spec = [[] for _ in batch.seqs]
        else:
            spec = [[0] * n for n in proposal.num_tokens] if proposal.on_device else proposal.token_ids
        starts = [seq.num_computed_tokens for seq in batch.seqs]
        token_ids = [seq.token_ids[start:start + n - reserved] + drafts for seq, start, n, reserved, drafts
                     in zip(batch.seqs, starts, batch.num_new_tokens, batch.num_spec_tokens, spec)]
        # Logits at each sampling sequence's last position, and at each of its drafts.
        num_logits = [len(drafts) + 1 if sample else 0 for sample, drafts in zip(batch.do_sample, spec)]
        # And before those, at the prompt positions that score prompt_logprobs.
        scored = [seq.prompt_tokens_to_score(start, n)
                  for seq, start, n in zip(batch.seqs, starts, batch.num_new_tokens)]
        model_input = build_model_input(batch.seqs, starts, token_ids, [k + len(p) for k, p in zip(num_logits, scored)],
                                        self.attn_backend, self.buffers, self.cuda_graphs, scored)
        ends = model_input.metadata.query_start_loc[1:]  # one past each sequence's last row
        # The rows of input_ids whose tokens only the device has: a draft model's drafts or, with async
        # scheduling (which never speculates), what the step before sampled, from these rows of its
        # tokens. Staged with the rest of the step, which reaches the device in one flush.
        rows, sources = [], None
        if proposal is not None and proposal.on_device:
            rows = proposal.device_rows([end - 1 for end in ends])
        elif previous is not None:
            pairs = [(end - 1, previous.token_rows[seq]) for seq, end in zip(batch.seqs, ends)
                     if seq in previous.token_rows]
            if pairs:
                rows, from_rows = zip(*pairs)
                sources = self.buffers.previous_rows.stage(from_rows)
        rows = self.buffers.draft_rows.stage(rows) if rows else None
        self.buffers.arena.flush()
        if rows is not None:
            tokens = (proposal.device_token_ids if sources is None
                      else previous.device_token_ids.index_select(0, sources))
            model_input.input_ids.index_copy_(0, rows, tokens)
        return model_input

    def execute(self, model_input: ModelInput) -> torch.Tensor | None:
        """Logits [rows, vocab] at model_input.logits_indices; None if the step samples nothing."""
        return execute_model_input(self.model, self.attn_backend, model_input, self.cuda_graphs)

    def sample(self, logits: torch.Tensor | None, seqs: list[Sequence],
               model_input: ModelInput) -> AsyncModelRunnerOutput:
        """Tokens from logits, queued on the device; `get_output()` reads them."""
        num_logits, prompt_logprobs = model_input.num_logits, []
        if logits is not None and any(model_input.prompt_scored):
            logits, num_logits, prompt_logprobs = score_prompts(logits, seqs, model_input)
        sampled = None
        if sum(num_logits):
            row_seqs = [seq for seq, k in zip(seqs, num_logits) for _ in range(k)]
            sampled = self.sampler.sample_on_device(logits, SamplingMetadata.from_seqs(row_seqs, self.device))
        return AsyncModelRunnerOutput(seqs, num_logits, sampled, prompt_logprobs)


def score_prompts(logits: torch.Tensor, seqs: list[Sequence],
                  model_input: ModelInput) -> tuple[torch.Tensor, list[int], list[SamplerOutput | None]]:
    """The rows of logits that score prompts taken apart from those to sample: returns the rows to
    sample, how many of them each sequence has, and each sequence's scored prompt tokens (None if none)."""
    keep, num_sampled, scored, row = [], [], [], 0
    for seq, k, tokens in zip(seqs, model_input.num_logits, model_input.prompt_scored):
        p = len(tokens)
        scored.append(score_tokens(logits[row:row + p], seq.token_ids[tokens.start:tokens.stop],
                                   seq.params.prompt_logprobs) if p else None)
        keep.extend(range(row + p, row + k))
        num_sampled.append(k - p)
        row += k
    return logits[keep], num_sampled, scored


@torch.inference_mode()
def sequence_logits(model: CausalLM, sequences: list[list[int]]) -> list[torch.Tensor]:
    """Logits at every position of each whole sequence, no cache involved: [len(seq), vocab] each.
    All sequences go through the model together, as one flattened batch."""
    device = next(model.parameters()).device
    backend = NoCacheAttention()
    metadata = backend.build_metadata([], [0] * len(sequences), [len(seq) for seq in sequences])
    hidden = model(torch.tensor([t for seq in sequences for t in seq], device=device),
                   torch.tensor([p for seq in sequences for p in range(len(seq))], device=device),
                   functools.partial(backend.forward, metadata=metadata))
    return list(model.compute_logits(hidden).split([len(seq) for seq in sequences]))
