"""A step's batch flattened into the model's inputs: token ids, positions, the attention metadata,
and which rows get logits. The model runner builds one for the target; a draft model builds its own
over the same sequences (spec_decode/draft_model.py)."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from minillm.attention import AttentionBackend, AttentionMetadata
from minillm.engine.input_buffers import InputBuffers, stage
from minillm.kv.manager import KVCacheManager
from minillm.models.llama import LlamaForCausalLM
from minillm.sequence import Sequence


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
                      num_logits: list[int], kv_cache_manager: KVCacheManager, buffers: InputBuffers,
                      graph_size: int | None = None) -> ModelInput:
    """Sequence i feeds token_ids[i] at positions start_pos[i], ...; logits at its last num_logits[i]
    positions. Rows past the batch up to graph_size are padding that reads and writes nothing."""
    input_ids: list[int] = []
    positions: list[int] = []
    query_start_loc = [0]
    for start, ids in zip(start_pos, token_ids):
        input_ids += ids
        positions += range(start, start + len(ids))
        query_start_loc.append(query_start_loc[-1] + len(ids))
    logits_indices = [i for end, k in zip(query_start_loc[1:], num_logits) for i in range(end - k, end)]
    metadata = AttentionMetadata(query_start_loc=query_start_loc, start_pos=list(start_pos))
    kv_cache_manager.fill_metadata(metadata, seqs, [len(ids) for ids in token_ids], buffers, graph_size)
    return ModelInput(stage(buffers.input_ids, input_ids, graph_size), stage(buffers.positions, positions, graph_size),
                      metadata, logits_indices, list(num_logits), graph_size)


def compute_logits(model: LlamaForCausalLM, attn_backend: AttentionBackend,
                   model_input: ModelInput) -> torch.Tensor | None:
    """The model, eagerly, on model_input: logits [rows, vocab] at its logits_indices (None if none)."""
    hidden = model(model_input.input_ids, model_input.positions,
                   functools.partial(attn_backend.forward, metadata=model_input.metadata))
    if not model_input.logits_indices:
        return None
    return model.compute_logits(hidden[torch.tensor(model_input.logits_indices, device=hidden.device)])
