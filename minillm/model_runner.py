"""Runs one scheduled step: flatten the batch, run the model, sample one token for each sequence
that has computed all its tokens (not for a prompt chunk that leaves some of the prompt for later).
Pure decode steps replay CUDA graphs where they were captured (cuda_graph.py)."""

from __future__ import annotations

import functools

import torch

from minillm.attention import AttentionBackend, AttentionMetadata, NoCacheAttention
from minillm.cuda_graph import DecodeGraphs
from minillm.kv_cache import ContiguousKVCache
from minillm.kv_pool import KVPool
from minillm.layers.sampler import Sampler, SamplerOutput, SamplingMetadata
from minillm.models.llama import LlamaForCausalLM
from minillm.scheduler import ScheduledBatch


class ModelRunner:
    def __init__(self, model: LlamaForCausalLM, attn_backend: AttentionBackend,
                 kv_cache: ContiguousKVCache | KVPool | None, device: torch.device, seed: int) -> None:
        self.model = model
        self.attn_backend = attn_backend
        self.kv_cache = kv_cache
        self.device = device
        self.sampler = Sampler(torch.Generator(device=device).manual_seed(seed))
        self.decode_graphs: DecodeGraphs | None = None

    def capture_decode_graphs(self, max_num_seqs: int, max_model_len: int, capture: bool = True) -> None:
        """Run pure decode steps through CUDA graphs (cuda_graph.py); capture=False runs the same
        padded path eagerly, for tests on a CPU."""
        self.decode_graphs = DecodeGraphs(self.model, self.attn_backend, max_num_seqs, max_model_len,
                                          self.kv_cache.block_size, self.device, capture)

    @torch.inference_mode()
    def run(self, batch: ScheduledBatch) -> SamplerOutput | None:
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
        if self._replays(batch):
            logits = self.decode_graphs.run(input_ids, positions, *self._paged_inputs(batch, start_pos))
            return self.sampler(logits, SamplingMetadata.from_seqs(batch.seqs, self.device))
        metadata = AttentionMetadata(query_start_loc=query_start_loc, start_pos=start_pos)
        if isinstance(self.kv_cache, ContiguousKVCache):
            metadata.kv_buffers = [self.kv_cache.buffer(s) for s in batch.seqs]
        elif isinstance(self.kv_cache, KVPool):
            self._add_paged_metadata(metadata, batch)
        hidden = self.model(torch.tensor(input_ids, device=self.device),
                            torch.tensor(positions, device=self.device),
                            functools.partial(self.attn_backend.forward, metadata=metadata))
        # Logits only where a token is sampled: at each sampling sequence's last position.
        sampling = [(seq, end - 1) for seq, end, sample in zip(batch.seqs, query_start_loc[1:], batch.do_sample)
                    if sample]
        if not sampling:
            return None
        seqs, rows = zip(*sampling)
        logits = self.model.compute_logits(hidden[torch.tensor(rows, device=self.device)])
        return self.sampler(logits, SamplingMetadata.from_seqs(list(seqs), self.device))

    def _replays(self, batch: ScheduledBatch) -> bool:
        """Whether the step is one the decode graphs hold: one token per sequence, each sampled."""
        return (self.decode_graphs is not None and len(batch.seqs) <= self.decode_graphs.max_batch_size
                and all(n == 1 for n in batch.num_new_tokens) and all(batch.do_sample))

    def _paged_inputs(self, batch: ScheduledBatch, start_pos: list[int]
                      ) -> tuple[list[int], list[list[int]], list[int]]:
        """Slot of every new token, each sequence's block table (padded with block 0 to the longest)
        and its length after the step."""
        block_size = self.kv_cache.block_size
        slots: list[int] = []
        for seq, n, start in zip(batch.seqs, batch.num_new_tokens, start_pos):
            table = seq.block_table
            slots += (table[p // block_size] * block_size + p % block_size for p in range(start, start + n))
        seq_lens = [start + n for start, n in zip(start_pos, batch.num_new_tokens)]
        width = max(len(seq.block_table) for seq in batch.seqs)
        return slots, [seq.block_table + [0] * (width - len(seq.block_table)) for seq in batch.seqs], seq_lens

    def _add_paged_metadata(self, metadata: AttentionMetadata, batch: ScheduledBatch) -> None:
        slots, tables, seq_lens = self._paged_inputs(batch, metadata.start_pos)

        def tensor(values) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.int32, device=self.device)

        metadata.slot_mapping = tensor(slots)
        metadata.block_tables = tensor(tables)
        metadata.seq_lens = tensor(seq_lens)
        metadata.max_seq_len = max(seq_lens)
        metadata.cu_seqlens_q = tensor(metadata.query_start_loc)
        metadata.max_query_len = max(batch.num_new_tokens)
        metadata.num_decodes = next((i for i, n in enumerate(batch.num_new_tokens) if n > 1), len(batch.seqs))


@torch.inference_mode()
def sequence_logits(model: LlamaForCausalLM, sequences: list[list[int]]) -> list[torch.Tensor]:
    """Logits at every position of each whole sequence, no cache involved: [len(seq), vocab] each.
    All sequences go through the model together, as one flattened batch."""
    device = model.model.embed_tokens.weight.device
    query_start_loc = [0]
    for seq in sequences:
        query_start_loc.append(query_start_loc[-1] + len(seq))
    metadata = AttentionMetadata(query_start_loc=query_start_loc, start_pos=[0] * len(sequences))
    hidden = model(torch.tensor([t for seq in sequences for t in seq], device=device),
                   torch.tensor([p for seq in sequences for p in range(len(seq))], device=device),
                   functools.partial(NoCacheAttention().forward, metadata=metadata))
    return list(model.compute_logits(hidden).split([len(seq) for seq in sequences]))
