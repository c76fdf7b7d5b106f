"""A step's batch flattened into the model's inputs: token ids, positions, the attention metadata
(built by the attention backend), and which rows get logits. The model runner builds one for the
target; a draft model builds its own over the same sequences (spec_decode/draft_model.py)."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import torch

from minillm.attention import AttentionBackend, AttentionMetadata, BatchDescriptor
from minillm.engine.cuda_graph import CudaGraphs
from minillm.engine.input_buffers import InputBuffers
from minillm.models.interface import CausalLM
from minillm.sequence import Sequence


@dataclass
class ModelInput:
    input_ids: torch.Tensor  # [tokens]: views of the runner's buffers
    positions: torch.Tensor
    metadata: AttentionMetadata
    # Rows of the model's output that get logits, each sequence's in order (a view of the buffers'
    # logits_indices); and how many each sequence has.
    logits_indices: torch.Tensor
    num_logits: list[int]
    batch: BatchDescriptor | None = None  # the padded shape of a CUDA graph's step, if one replays it
    # The prompt tokens that each sequence's first num_logits rows score (prompt_logprobs), one a row,
    # before the rows that sample; empty when none do.
    prompt_scored: list[range] = field(default_factory=list)

    @property
    def num_seqs(self) -> int:
        return len(self.num_logits)


def build_model_input(seqs: list[Sequence], start_pos: list[int], token_ids: list[list[int]],
                      num_logits: list[int], attn_backend: AttentionBackend, buffers: InputBuffers,
                      graphs: CudaGraphs | None = None, prompt_scored: list[range] | None = None) -> ModelInput:
    """Sequence i feeds token_ids[i] at positions start_pos[i], ...; logits at its last num_logits[i]
    positions, the first len(prompt_scored[i]) of them scoring those prompt tokens. With `graphs`, padded to
    the shape of the one that holds the step, if one does: rows past the batch read and write nothing.
    The tensors hold these values on the device once the caller has flushed buffers.arena, after
    whatever else the step stages."""
    batch = None if graphs is None else graphs.descriptor([len(ids) for ids in token_ids], num_logits)
    input_ids = [t for ids in token_ids for t in ids]
    positions = [p for start, ids in zip(start_pos, token_ids) for p in range(start, start + len(ids))]
    metadata = attn_backend.build_metadata(seqs, start_pos, [len(ids) for ids in token_ids], batch)
    ends = metadata.query_start_loc[1:]
    logits_indices = [i for end, k in zip(ends, num_logits) for i in range(end - k, end)]
    rows = None if batch is None else batch.num_tokens
    indices = buffers.logits_indices.stage(logits_indices, None if batch is None else batch.num_logits)
    return ModelInput(buffers.input_ids.stage(input_ids, rows), buffers.positions.stage(positions, rows),
                      metadata, indices[:len(logits_indices)], list(num_logits), batch, list(prompt_scored or []))


def compute_logits(model: CausalLM, attn_backend: AttentionBackend, model_input: ModelInput) -> torch.Tensor | None:
    """The model, eagerly, on model_input: logits [rows, vocab] at its logits_indices (None if none)."""
    hidden = model(model_input.input_ids, model_input.positions,
                   functools.partial(attn_backend.forward, metadata=model_input.metadata))
    if not sum(model_input.num_logits):
        return None
    return model.compute_logits(hidden[model_input.logits_indices])


def execute_model_input(model: CausalLM, attn_backend: AttentionBackend, model_input: ModelInput,
                        graphs: CudaGraphs | None) -> torch.Tensor | None:
    """Logits [rows, vocab] at model_input.logits_indices (None if none): replayed by `graphs` where
    the input was padded for one of them, else eagerly."""
    if model_input.batch is None:
        return compute_logits(model, attn_backend, model_input)
    logits = graphs.run(model_input.batch)
    rows = len(model_input.logits_indices)
    return logits[:rows] if rows else None
