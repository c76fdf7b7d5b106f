"""The CUDA-graph path (cuda_graph.py) on the CPU: the same persistent buffers, filled by the same
`ModelRunner.prepare`, and the same padding, run eagerly. A padded step must generate what the
unpadded one does, for every step shape (decodes, prompt chunks mixed with decodes, prefix-cache
hits, preemption, an abort, speculative verification, a draft model's steps), as batches shrink and stale
rows are left in the buffers. Replayed graphs against eager steps are in test_gpu.py."""

from __future__ import annotations

import pytest
import torch
from conftest import ENGINE_FEATURES, step_until_done

from minillm import LLM, SamplingParams
from minillm.attention import BatchDescriptor
from minillm.engine.cuda_graph import capture_sizes, token_capture_sizes
from minillm.engine.trace import record

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # on a GPU, the same padded path, eagerly


@pytest.mark.parametrize("max_num_seqs,sizes", [(1, [1]), (5, [1, 2, 4, 5]), (16, [1, 2, 4, 8, 16]),
                                                (40, [1, 2, 4, 8, 16, 32, 40])])
def test_capture_sizes(max_num_seqs, sizes):
    assert capture_sizes(max_num_seqs) == sizes


def test_capture_sizes_up_to_256():
    sizes = capture_sizes(256)
    assert sizes[:5] == [1, 2, 4, 8, 16] and sizes[-1] == 256 and len(sizes) == 20


@pytest.mark.parametrize("max_num_tokens,sizes", [(4, [4]), (8, [8]), (100, [8, 16, 32, 64, 96, 100]),
                                                  (2048, [8, 16, 32, 64, 96, 128, 192, 256, 384, 512, 768, 1024,
                                                          1536, 2048])])
def test_token_capture_sizes(max_num_tokens, sizes):
    assert token_capture_sizes(max_num_tokens) == sizes


def padded(llm: LLM) -> list[BatchDescriptor]:
    """llm's steps, the draft model's too, padded as its CUDA graphs pad them and run eagerly; returns
    the list that each padded step's shape is appended to."""
    runner = llm.llm_engine.model_runner
    runner.capture_cuda_graphs(capture=False)
    shapes = []
    for graphs in (runner.cuda_graphs, getattr(runner.proposer, "cuda_graphs", None)):
        if graphs is not None:
            graphs.run = lambda batch, run=graphs.run: shapes.append(batch) or run(batch)
    return shapes


def tokens_and_logprobs(outs):
    return [(o.outputs[0].token_ids, [e[t].logprob for e, t in zip(o.outputs[0].logprobs, o.outputs[0].token_ids)])
            for o in outs]


# Each engine feature (conftest.py), and speculation by each proposer. "abort" aborts the first
# request in the middle of the run, while the others go on.
FEATURES = {
    **ENGINE_FEATURES,
    "ngram": {"speculative_config": {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3}},
    "draft": {"speculative_config": {"model": "tiny-draft", "num_speculative_tokens": 3}},
}
ABORT_STEP = 3


# Triton (interpreted) on the case whose steps take every shape (chunks, decodes, verifications, drafts),
# and on one run that meets a prefix-cache hit, a preemption, the INT8 cache and an abort.
@pytest.mark.parametrize("backend,features", [("torch", (f,)) for f in FEATURES] + [
    ("triton", ("draft",)), ("triton", ("prefix cache", "preemption", "int8 cache", "abort"))],
    ids=lambda value: "+".join(value) if isinstance(value, tuple) else value)
def test_padded_steps_of_every_shape_generate_what_unpadded_ones_do(backend, features):
    if backend == "triton":
        pytest.importorskip("triton")
    # Prompts sharing a prefix of 12 tokens (3 blocks of 4), or 16 for Triton (whose blocks hold 16), of up
    # to 44 tokens: with 24 tokens a step, the long ones are prefilled in chunks beside the others' decodes.
    count = 6 if backend == "torch" else 2 if features == ("draft",) else 3  # the interpreter is slow
    prefix = [5, 9, 2, 7] * (3 if backend == "torch" else 4)
    prompts = [{"prompt_token_ids": prefix + list(range(30 + i, 32 + 6 * i))} for i in range(count)]
    args = dict(skip_tokenizer_init=True, dtype="float32", device=DEVICE, attention_backend=backend, max_num_seqs=4,
                max_num_batched_tokens=24, max_model_len=96, enforce_eager=True, enable_prefix_caching=False)
    for feature in features:
        args.update(FEATURES[feature])
    lengths = [4 + 3 * i for i in range(count)]
    if backend == "triton" and "preemption" in features:
        # Triton's tiles need blocks of 16 tokens. Three of them: once the first request is aborted, the
        # last one outgrows its second block while the second one still runs, and one is preempted.
        args.update(block_size=16, num_kv_blocks=3, max_model_len=48)
        lengths = [4, 8, 6]
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True, logprobs=1) for n in lengths]
    abort = "abort" in features
    abort_step = ABORT_STEP if abort else None
    unpadded = LLM("tiny", **args)
    plain = step_until_done(unpadded, prompts, params, abort_step)
    llm = LLM("tiny", **args)
    shapes = padded(llm)
    with record(llm) as trace:
        got = step_until_done(llm, prompts, params, abort_step)
    assert got.keys() == plain.keys() == {str(i) for i in range(count)}
    assert "preemption" not in features or any(event.preempted for event in trace.events)
    assert "prefix cache" not in features or any(s.num_cached_tokens for e in trace.events for s in e.seqs)
    assert not abort or (got["0"] == "abort" and all(got[str(i)][2] == "length" for i in range(1, count)))
    for request_id, ref in plain.items():
        if ref == "abort":
            continue
        (tokens, logprobs, *_), (ref_tokens, ref_logprobs, *_) = got[request_id], ref
        assert tokens == ref_tokens
        # An int8 cache rounds each K/V row to 1/127 of its largest value: a padded matmul's last-bit
        # difference can move a value across a rounding boundary, a whole step of the quantization.
        assert logprobs == pytest.approx(ref_logprobs, abs=1e-4 if "int8 cache" in features else 1e-5)
    assert any(b.uniform_decode for b in shapes) and any(not b.uniform_decode for b in shapes), shapes
    # The drafts too: the target keeps its own greedy tokens whatever a draft proposes, so only the
    # acceptance shows a padded draft step that computed something else.
    assert llm.llm_engine.spec_decoding_stats == unpadded.llm_engine.spec_decoding_stats
    blocks = llm.llm_engine.block_manager
    assert blocks.num_free_blocks == blocks.num_blocks, "KV blocks leaked"


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_padded_decode_generates_what_eager_steps_do(hf_checkpoint, backend):
    _, path = hf_checkpoint("llama_gqa_tied")
    # Five requests of different lengths: the batch shrinks 5 -> 1 while decoding, so batches of 3
    # run in a buffer of 4 rows whose last row still holds a finished sequence's slot.
    prompts = [{"prompt_token_ids": list(range(1 + i, 9 + 7 * i))} for i in range(5)]
    params = [SamplingParams(temperature=0, max_tokens=3 + 4 * i, ignore_eos=True, logprobs=1) for i in range(5)]

    def generate(padded: bool):
        llm = LLM(str(path), skip_tokenizer_init=True, dtype="float32", device=DEVICE, attention_backend=backend,
                  max_num_seqs=8, enforce_eager=True)
        runner = llm.llm_engine.model_runner
        if padded:
            runner.capture_cuda_graphs(capture=False)
            steps = []
            execute = runner.execute
            runner.execute = lambda model_input: steps.append((model_input.num_seqs, model_input.batch)) or \
                execute(model_input)
        outs = llm.generate(prompts, params, use_tqdm=False)
        if padded:  # padded decode batches did run
            assert any(b is not None and b.uniform_decode and n < b.num_seqs for n, b in steps), steps
        return tokens_and_logprobs(outs)

    eager, padded = generate(False), generate(True)
    for (tokens, logprobs), (tokens_padded, logprobs_padded) in zip(eager, padded):
        assert tokens_padded == tokens
        assert logprobs_padded == pytest.approx(logprobs, abs=1e-4)


def test_a_step_replays_the_smallest_shape_that_holds_it_and_none_past_every_bound():
    """Decodes by sequence count, up to and including the largest decode graph; other steps by token
    count, with a sequence row per token and one more, and logits at up to max_num_logits rows; a
    step past the tokens, the sequences or the logits of every graph runs eagerly (None)."""
    llm = LLM("tiny", skip_tokenizer_init=True, dtype="float32", max_num_seqs=4, max_num_batched_tokens=24)
    runner = llm.llm_engine.model_runner
    runner.capture_cuda_graphs(capture=False)
    graphs = runner.cuda_graphs
    assert (graphs.decode_sizes, graphs.token_sizes, graphs.max_num_logits) == ([1, 2, 4], [8, 16, 24], 4)

    def decode(n: int) -> BatchDescriptor:
        return BatchDescriptor(n, n, n, uniform_decode=True)

    def ragged(tokens: int) -> BatchDescriptor:
        return BatchDescriptor(tokens, min(tokens, 4) + 1, min(tokens, 4), uniform_decode=False)

    assert [graphs.descriptor([1] * n, [1] * n) for n in (1, 2, 3, 4)] == [decode(1), decode(2), decode(4), decode(4)]
    # One token each but a row without logits (a draft model's catch-up): not a uniform decode.
    assert graphs.descriptor([1, 1], [1, 0]) == ragged(8)
    assert [graphs.descriptor([n], [1]) for n in (8, 9, 16, 24)] == [ragged(8), ragged(16), ragged(16), ragged(24)]
    assert graphs.descriptor([25], [1]) is None  # more tokens than the largest graph
    assert graphs.descriptor([2] * 5, [0] * 5) is None  # more sequences than its rows (prompt chunks)
    assert graphs.descriptor([3, 3], [3, 2]) is None  # more logits than its output (prompt logprobs)


def test_enforce_eager_and_cudagraph_mode_are_validated():
    with pytest.raises(ValueError, match="enforce_eager must be True or False, got 'yes'"):
        LLM("tiny", enforce_eager="yes")
    with pytest.raises(ValueError, match="cudagraph_mode must be one of .*'FULL_DECODE_ONLY'.*, got 'PIECEWISE'"):
        LLM("tiny", cudagraph_mode="PIECEWISE")


def test_decode_only_graphs_leave_the_other_steps_eager():
    """cudagraph_mode="FULL_DECODE_ONLY": only pure decode steps are padded for a graph; a step with a
    prompt chunk runs unpadded, eagerly."""
    llm = LLM("tiny", skip_tokenizer_init=True, dtype="float32", max_num_seqs=4, max_num_batched_tokens=24)
    runner = llm.llm_engine.model_runner
    runner.capture_cuda_graphs(capture=False, decode_only=True)
    assert runner.cuda_graphs.token_sizes == []
    steps = []
    execute = runner.execute
    runner.execute = lambda model_input: steps.append(model_input.batch) or execute(model_input)
    prompts = [{"prompt_token_ids": list(range(3, 40 + 5 * i))} for i in range(3)]
    llm.generate(prompts, SamplingParams(temperature=0, max_tokens=5, ignore_eos=True), use_tqdm=False)
    assert None in steps and all(b is None or b.uniform_decode for b in steps)
    assert any(b is not None for b in steps)


def test_every_shape_writes_its_logits_into_one_output():
    """What a captured graph returns stays reserved in the graphs' memory pool for good, so every
    shape writes its logits into one output, sized for the most rows any shape samples."""
    llm = LLM("tiny", skip_tokenizer_init=True, dtype="float32", max_num_seqs=4, max_num_batched_tokens=24)
    runner = llm.llm_engine.model_runner
    runner.capture_cuda_graphs(capture=False)
    graphs, outputs = runner.cuda_graphs, []
    run = graphs.run
    graphs.run = lambda batch: outputs.append((batch, run(batch))) or outputs[-1][1]
    prompts = [{"prompt_token_ids": list(range(3, 40 + 5 * i))} for i in range(3)]
    llm.generate(prompts, SamplingParams(temperature=0, max_tokens=5, ignore_eos=True), use_tqdm=False)
    assert {b.uniform_decode for b, _ in outputs} == {True, False}
    assert {logits.data_ptr() for _, logits in outputs} == {graphs.logits_out.data_ptr()}
    assert all(logits.shape == (b.num_logits, llm.llm_engine.model.config.vocab_size) for b, logits in outputs)
    assert graphs.logits_out.shape[0] == max(graphs.decode_sizes[-1], graphs.max_num_logits)


def test_no_graphs_on_a_cpu_or_when_eager():
    assert LLM("tiny", device="cpu").llm_engine.model_runner.cuda_graphs is None
    assert LLM("tiny", device=DEVICE, enforce_eager=True).llm_engine.model_runner.cuda_graphs is None


@pytest.mark.parametrize("kv_cache,capturable", [("paged", True), ("contiguous", False), ("none", False)])
def test_only_a_backend_that_declares_it_is_captured(kv_cache, capturable):
    """The contiguous and no-cache backends keep per-sequence Python state, so their steps run eagerly
    however the engine is configured (on a GPU too: engines of chapters 01 and 06 use them)."""
    llm = LLM("tiny", device=DEVICE, kv_cache=kv_cache)
    runner = llm.llm_engine.model_runner
    assert runner.attn_backend.supports_cuda_graphs is capturable
    if capturable:
        runner.capture_cuda_graphs(capture=False)
    else:
        assert runner.cuda_graphs is None
        with pytest.raises(ValueError, match=f"the '{kv_cache}' attention backend cannot be captured"):
            runner.capture_cuda_graphs(capture=False)
    out = llm.generate("def add(a, b):", SamplingParams(temperature=0, max_tokens=8))[0]
    assert len(out.outputs[0].token_ids) == 8
