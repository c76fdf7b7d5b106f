"""A step's batch flattened into the model's inputs: token ids, positions, the attention metadata
(built by the attention backend), and which rows get logits. The model runner builds one for the
target; a draft model builds its own over the same sequences (spec_decode/draft_model.py)."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from minillm.attention import AttentionBackend, AttentionMetadata
from minillm.engine.input_buffers import InputBuffers
from minillm.models.interface import CausalLM
from minillm.sequence import Sequence
from minillm.utils.staging import stage


@dataclass
class ModelInput:
    input_ids: torch.Tensor  # [tokens]: views of the runner's buffers
    positions: torch.Tensor
    metadata: AttentionMetadata
    # Rows of the model's output that get logits, each sequence's in order; and how many each has.
    logits_indices: list[int]
    num_logits: list[int]
    graph_size: int | None = None  # a decode step replayed by the graph of this many rows

    @property
    def num_seqs(self) -> int:
        return len(self.num_logits)


def build_model_input(seqs: list[Sequence], start_pos: list[int], token_ids: list[list[int]],
                      num_logits: list[int], attn_backend: AttentionBackend, buffers: InputBuffers,
                      graph_size: int | None = None) -> ModelInput:
    """Sequence i feeds token_ids[i] at positions start_pos[i], ...; logits at its last num_logits[i]
    positions. Rows past the batch up to graph_size are padding that reads and writes nothing."""
    input_ids = [t for ids in token_ids for t in ids]
    positions = [p for start, ids in zip(start_pos, token_ids) for p in range(start, start + len(ids))]
    metadata = attn_backend.build_metadata(seqs, start_pos, [len(ids) for ids in token_ids], graph_size)
    ends = metadata.query_start_loc[1:]
    logits_indices = [i for end, k in zip(ends, num_logits) for i in range(end - k, end)]
    return ModelInput(stage(buffers.input_ids, input_ids, graph_size), stage(buffers.positions, positions, graph_size),
                      metadata, logits_indices, list(num_logits), graph_size)


def compute_logits(model: CausalLM, attn_backend: AttentionBackend, model_input: ModelInput) -> torch.Tensor | None:
    """The model, eagerly, on model_input: logits [rows, vocab] at its logits_indices (None if none)."""
    hidden = model(model_input.input_ids, model_input.positions,
                   functools.partial(attn_backend.forward, metadata=model_input.metadata))
    if not model_input.logits_indices:
        return None
    return model.compute_logits(hidden[torch.tensor(model_input.logits_indices, device=hidden.device)])
