"""Runs one scheduled step: flatten the batch, run the model, sample one token per sequence."""

from __future__ import annotations

import functools

import torch

from minillm.attention import AttentionBackend, AttentionMetadata
from minillm.kv_cache import ContiguousKVCache
from minillm.layers.sampler import Sampler, SamplerOutput, SamplingMetadata
from minillm.models.llama import LlamaForCausalLM
from minillm.scheduler import ScheduledBatch


class ModelRunner:
    def __init__(self, model: LlamaForCausalLM, attn_backend: AttentionBackend,
                 kv_cache: ContiguousKVCache | None, device: torch.device, seed: int) -> None:
        self.model = model
        self.attn_backend = attn_backend
        self.kv_cache = kv_cache
        self.device = device
        self.sampler = Sampler(torch.Generator(device=device).manual_seed(seed))

    @torch.inference_mode()
    def run(self, batch: ScheduledBatch) -> SamplerOutput:
        input_ids: list[int] = []
        positions: list[int] = []
        query_start_loc = [0]
        start_pos = []
        for seq, n in zip(batch.seqs, batch.num_new_tokens):
            start = seq.num_computed_tokens
            input_ids += seq.token_ids[start:start + n]
            positions += range(start, start + n)
            query_start_loc.append(query_start_loc[-1] + n)
            start_pos.append(start)
        metadata = AttentionMetadata(
            query_start_loc=query_start_loc, start_pos=start_pos,
            kv_buffers=[self.kv_cache.buffer(s) for s in batch.seqs] if self.kv_cache else [])
        hidden = self.model(torch.tensor(input_ids, device=self.device),
                            torch.tensor(positions, device=self.device),
                            functools.partial(self.attn_backend.forward, metadata=metadata))
        last_token_rows = torch.tensor(query_start_loc[1:], device=self.device) - 1
        logits = self.model.compute_logits(hidden[last_token_rows])
        return self.sampler(logits, SamplingMetadata.from_seqs(batch.seqs, self.device))
