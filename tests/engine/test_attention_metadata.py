"""Each attention backend builds its own metadata from the step's sequences (the KV-cache manager
keeps only the scheduler's bookkeeping), the paged one in tensors of its own whose addresses never
change, padded for a CUDA graph with rows that store nothing and attend to nothing."""

from __future__ import annotations

from minillm import LLM, SamplingParams
from minillm.attention.base import BatchDescriptor, query_start_loc
from minillm.attention.paged import PagedAttention
from minillm.sequence import Sequence


def paged_engine():
    return LLM("tiny", skip_tokenizer_init=True, dtype="float32", block_size=4, num_kv_blocks=32,
               max_model_len=64, max_num_seqs=8).llm_engine


def test_the_paged_backend_stages_slots_lengths_and_tables_in_its_own_tensors():
    engine = paged_engine()
    backend = engine.model_runner.attn_backend
    assert isinstance(backend, PagedAttention) and not hasattr(engine.kv_cache_manager, "attn_backend")
    a, b = Sequence("a", prompt_token_ids=range(6)), Sequence("b", prompt_token_ids=range(3))
    a.block_table, b.block_table = [7, 2], [5, 9, 3]

    def build(*args):
        metadata = backend.build_metadata(*args)
        engine.model_runner.buffers.arena.flush()  # what the runner does once the step is staged
        return metadata

    build([a, b], [6, 0], [1, 3])  # b's row now holds 3 entries on the host too
    b.block_table = [5]
    # a decodes its 7th token (position 6, block 2 slot 2); b prefills 3 tokens from position 0.
    metadata = build([a, b], [6, 0], [1, 3])
    assert metadata.query_start_loc == query_start_loc([1, 3]) == [0, 1, 4]
    assert metadata.slot_mapping.tolist() == [2 * 4 + 2, 5 * 4, 5 * 4 + 1, 5 * 4 + 2]
    assert metadata.seq_lens.tolist() == [7, 3]
    assert metadata.block_tables.tolist() == [[7, 2], [5, 0]]  # what the last step left there is cleared
    assert metadata.cu_seqlens_q.tolist() == [0, 1, 4]
    assert (metadata.decode_only, metadata.max_query_len, metadata.max_seq_len) == (False, 3, 7)
    for staged, own in ((metadata.slot_mapping, backend.slot_mapping), (metadata.seq_lens, backend.seq_lens),
                        (metadata.block_tables, backend.block_tables)):
        assert staged.data_ptr() == own.tensor.data_ptr()  # a view, never a new tensor

    # Padded to a graph's 8 tokens and 4 sequence rows: the padding tokens store nothing and belong
    # to the last sequence row, which has no keys; the rows between own nothing, whatever a step of
    # more sequences left in them (a draft's next step moves every row with keys one slot on).
    c = Sequence("c", prompt_token_ids=range(2))
    c.block_table = [4]
    build([a, b, c], [6, 0, 1], [1, 3, 1], BatchDescriptor(8, 4, 4, uniform_decode=False))
    padded = build([a, b], [6, 0], [1, 3], BatchDescriptor(8, 4, 4, uniform_decode=False))
    assert padded.query_start_loc == [0, 1, 4]  # the batch's own, for the logits
    assert padded.slot_mapping.tolist() == [10, 20, 21, 22, -1, -1, -1, -1]
    assert padded.seq_lens.tolist() == [7, 3, 0, 0] and padded.cu_seqlens_q.tolist() == [0, 1, 4, 4, 8]
    assert padded.block_tables.shape == (4, 64 // 4) and padded.block_tables[:2, :2].tolist() == [[7, 2], [5, 0]]
    # Bounds of the shape, not of the batch: the same launch for every batch padded to it.
    assert (padded.decode_only, padded.max_query_len, padded.max_seq_len) == (False, 8, engine.max_model_len)
    # A draft's next step, made on the device from this one: each sequence one token on (a at position
    # 7, block 2 slot 3; b at 3, block 5 slot 3), the padding rows still storing and attending to nothing.
    assert backend.advance_decode(4).tolist() == [7, 3, 0, 0]
    assert backend.slot_mapping.tensor[:4].tolist() == [11, 23, -1, -1]
    assert backend.seq_lens.tensor[:4].tolist() == [8, 4, 0, 0]
    graph = backend.graph_metadata(BatchDescriptor(4, 4, 4, uniform_decode=True))
    assert graph.slot_mapping.data_ptr() == backend.slot_mapping.tensor.data_ptr()
    assert backend.graph_metadata(BatchDescriptor(4, 4, 4, uniform_decode=True)) is graph  # made once per shape
    assert (graph.decode_only, graph.max_query_len, graph.max_seq_len) == (True, 1, engine.max_model_len)


def test_a_full_batch_padded_to_a_graph_keeps_a_row_for_its_padding_tokens():
    """max_num_seqs sequences in a step of fewer tokens than its graph's: the shape has one sequence
    row more than max_num_seqs, so the padding tokens belong to a row with no keys rather than to the
    last sequence's, whose attention they would otherwise compute for nothing."""
    engine = paged_engine()
    runner = engine.model_runner
    runner.capture_cuda_graphs(capture=False)
    seqs = [Sequence(str(i), prompt_token_ids=range(3)) for i in range(engine.scheduler.max_num_seqs)]
    for i, seq in enumerate(seqs):
        seq.block_table = [i]
    query_lens = [1] * (len(seqs) - 1) + [2]  # one prompt chunk among decodes: a ragged step
    batch = runner.cuda_graphs.descriptor(query_lens, [1] * len(seqs))
    assert batch.num_tokens > sum(query_lens) and batch.num_seqs == len(seqs) + 1
    metadata = runner.attn_backend.build_metadata(seqs, [2] * (len(seqs) - 1) + [1], query_lens, batch)
    runner.buffers.arena.flush()
    assert metadata.cu_seqlens_q.tolist()[-2:] == [sum(query_lens), batch.num_tokens]
    assert metadata.seq_lens.tolist() == [3] * len(seqs) + [0]


def test_contiguous_and_no_cache_backends_build_theirs():
    engine = LLM("tiny", skip_tokenizer_init=True, dtype="float32", kv_cache="contiguous").llm_engine
    seq = Sequence("a", prompt_token_ids=range(5), max_model_len=16)
    engine.kv_cache_manager.allocate(seq)
    metadata = engine.model_runner.attn_backend.build_metadata([seq], [2], [3])
    assert metadata.kv_buffers[0] is engine.kv_cache.buffer(seq) and metadata.query_start_loc == [0, 3]
    none = LLM("tiny", skip_tokenizer_init=True, kv_cache="none").llm_engine.model_runner.attn_backend
    assert none.build_metadata([], [0, 0], [2, 5]).query_start_loc == [0, 2, 7]


def test_a_padded_step_gives_the_tokens_of_an_unpadded_one():
    """The graph path's padding, run eagerly on the CPU: greedy tokens and log-probabilities equal."""
    params = SamplingParams(temperature=0, max_tokens=6, logprobs=2)
    prompts = [{"prompt_token_ids": list(range(3 + i, 12 + 2 * i))} for i in range(3)]
    plain = LLM("tiny", skip_tokenizer_init=True, dtype="float32").generate(prompts, params, use_tqdm=False)
    padded = LLM("tiny", skip_tokenizer_init=True, dtype="float32")
    padded.llm_engine.model_runner.capture_cuda_graphs(capture=False)
    outs = padded.generate(prompts, params, use_tqdm=False)
    for a, b in zip(plain, outs):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
        for x, y in zip(a.outputs[0].logprobs, b.outputs[0].logprobs):
            assert x.keys() == y.keys() and all(abs(x[t].logprob - y[t].logprob) < 1e-5 for t in x)
    assert padded.llm_engine.model_runner.cuda_graphs is not None
