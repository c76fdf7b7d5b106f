"""Runs one scheduled step in three parts: `prepare` flattens the batch into the runner's persistent
input buffers, `execute` runs the model and computes logits where tokens are due, `sample` turns
them into tokens, a list for each sequence. Pure decode steps replay CUDA graphs where they were
captured (cuda_graph.py)."""

from __future__ import annotations

import bisect
import functools
from dataclasses import dataclass

import torch

from minillm.attention import AttentionMetadata, NoCacheAttention
from minillm.cuda_graph import DecodeGraphs, capture_sizes
from minillm.engine_config import SchedulerConfig
from minillm.input_buffers import InputBuffers, stage
from minillm.kv_cache_manager import KVCacheManager
from minillm.layers.sampler import Sampler, SamplingMetadata
from minillm.models.llama import LlamaForCausalLM
from minillm.runner_output import ModelRunnerOutput
from minillm.scheduler import ScheduledBatch
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


class ModelRunner:
    def __init__(self, model: LlamaForCausalLM, kv_cache_manager: KVCacheManager, config: SchedulerConfig,
                 max_model_len: int, device: torch.device, seed: int) -> None:
        self.model = model
        self.kv_cache_manager = kv_cache_manager
        self.attn_backend = kv_cache_manager.attn_backend
        self.max_model_len = max_model_len
        self.device = device
        self.sampler = Sampler(torch.Generator(device=device).manual_seed(seed))
        self.max_num_seqs = config.max_num_seqs
        # A decode step of max_num_seqs rows must fit too, whatever the token budget.
        max_tokens = max(config.max_num_batched_tokens, config.max_num_seqs)
        block_size = kv_cache_manager.block_size
        self.buffers = InputBuffers(max_tokens, config.max_num_seqs,
                                    -(-max_model_len // block_size) if block_size else 0, device)
        self.decode_graphs: DecodeGraphs | None = None

    def capture_decode_graphs(self, capture: bool = True) -> None:
        """Run pure decode steps through CUDA graphs (cuda_graph.py); capture=False runs the same
        padded path eagerly, for tests on a CPU."""
        self.decode_graphs = DecodeGraphs(self._decode_forward, capture_sizes(self.max_num_seqs), capture)

    @torch.inference_mode()
    def execute_model(self, batch: ScheduledBatch) -> ModelRunnerOutput:
        model_input = self.prepare(batch)
        return self.sample(self.execute(model_input), batch.seqs, model_input)

    def prepare(self, batch: ScheduledBatch) -> ModelInput:
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
        # Logits at each sampling sequence's last position.
        num_logits = [int(sample) for sample in batch.do_sample]
        logits_indices = [end - 1 for end, k in zip(query_start_loc[1:], num_logits) if k]
        graph_size = self._graph_size(batch)
        buffers = self.buffers
        metadata = AttentionMetadata(query_start_loc=query_start_loc, start_pos=start_pos)
        self.kv_cache_manager.fill_metadata(metadata, batch.seqs, batch.num_new_tokens, buffers, graph_size)
        return ModelInput(stage(buffers.input_ids, input_ids, graph_size),
                          stage(buffers.positions, positions, graph_size), metadata, logits_indices, num_logits,
                          graph_size)

    def execute(self, model_input: ModelInput) -> torch.Tensor | None:
        """Logits [rows, vocab] at model_input.logits_indices; None if the step samples nothing."""
        if model_input.graph_size is not None:
            return self.decode_graphs.run(model_input.graph_size)[:model_input.num_seqs]
        hidden = self.model(model_input.input_ids, model_input.positions,
                            functools.partial(self.attn_backend.forward, metadata=model_input.metadata))
        if not model_input.logits_indices:
            return None
        rows = torch.tensor(model_input.logits_indices, device=self.device)
        return self.model.compute_logits(hidden[rows])

    def sample(self, logits: torch.Tensor | None, seqs: list[Sequence], model_input: ModelInput) -> ModelRunnerOutput:
        if logits is None:
            return ModelRunnerOutput([[] for _ in seqs])
        row_seqs = [seq for seq, k in zip(seqs, model_input.num_logits) for _ in range(k)]
        sampled = self.sampler(logits, SamplingMetadata.from_seqs(row_seqs, self.device))
        tokens, row = [], 0
        for k in model_input.num_logits:
            tokens.append(sampled.token_ids[row:row + k])
            row += k
        return ModelRunnerOutput(tokens, sampled)

    def _graph_size(self, batch: ScheduledBatch) -> int | None:
        """The decode graph a step replays: one token per sequence, each sampled, and few enough."""
        graphs = self.decode_graphs
        n = len(batch.seqs)
        if graphs is None or n > graphs.sizes[-1] or not all(batch.do_sample) or any(
                k != 1 for k in batch.num_new_tokens):
            return None
        return graphs.sizes[bisect.bisect_left(graphs.sizes, n)]

    def _decode_forward(self, num_rows: int) -> torch.Tensor:
        """The model on the first num_rows rows of the buffers, as a pure decode step: logits for each."""
        metadata = self.kv_cache_manager.decode_metadata(self.buffers, num_rows, self.max_model_len)
        hidden = self.model(self.buffers.input_ids[:num_rows], self.buffers.positions[:num_rows],
                            functools.partial(self.attn_backend.forward, metadata=metadata))
        return self.model.compute_logits(hidden)


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
