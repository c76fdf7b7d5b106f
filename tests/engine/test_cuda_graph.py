"""The CUDA-graph decode path (cuda_graph.py) on the CPU: the same persistent buffers, filled by the
same `ModelRunner.prepare`, and the same padding, run eagerly. A padded batch must generate what the
unpadded one does, as batches shrink and stale rows are left in the buffers. Replayed graphs against
eager steps are in test_gpu.py."""

from __future__ import annotations

import pytest
import torch

from minillm import LLM, SamplingParams
from minillm.engine.cuda_graph import capture_sizes

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # on a GPU, the same padded path, eagerly


@pytest.mark.parametrize("max_num_seqs,sizes", [(1, [1]), (5, [1, 2, 4, 5]), (16, [1, 2, 4, 8, 16]),
                                                (40, [1, 2, 4, 8, 16, 32, 40])])
def test_capture_sizes(max_num_seqs, sizes):
    assert capture_sizes(max_num_seqs) == sizes


def test_capture_sizes_up_to_256():
    sizes = capture_sizes(256)
    assert sizes[:5] == [1, 2, 4, 8, 16] and sizes[-1] == 256 and len(sizes) == 20


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
            runner.capture_decode_graphs(capture=False)
            steps = []
            execute = runner.execute
            runner.execute = lambda model_input: steps.append((model_input.num_seqs, model_input.graph_size)) or \
                execute(model_input)
        outs = llm.generate(prompts, params, use_tqdm=False)
        if padded:
            assert any(size is not None and n < size for n, size in steps), steps  # padded batches did run
        return [(o.outputs[0].token_ids, [e[t].logprob for e, t in zip(o.outputs[0].logprobs, o.outputs[0].token_ids)])
                for o in outs]

    eager, padded = generate(False), generate(True)
    for (tokens, logprobs), (tokens_padded, logprobs_padded) in zip(eager, padded):
        assert tokens_padded == tokens
        assert logprobs_padded == pytest.approx(logprobs, abs=1e-4)


def test_enforce_eager_is_validated():
    with pytest.raises(ValueError, match="enforce_eager must be True or False, got 'yes'"):
        LLM("tiny", enforce_eager="yes")


def test_no_graphs_on_a_cpu_or_when_eager():
    assert LLM("tiny", device="cpu").llm_engine.model_runner.decode_graphs is None
    assert LLM("tiny", device=DEVICE, enforce_eager=True).llm_engine.model_runner.decode_graphs is None


@pytest.mark.parametrize("kv_cache,capturable", [("paged", True), ("contiguous", False), ("none", False)])
def test_only_a_backend_that_declares_it_is_captured(kv_cache, capturable):
    """The contiguous and no-cache backends keep per-sequence Python state, so their steps run eagerly
    however the engine is configured (on a GPU too: engines of chapters 01 and 06 use them)."""
    llm = LLM("tiny", device=DEVICE, kv_cache=kv_cache)
    runner = llm.llm_engine.model_runner
    assert runner.attn_backend.supports_cuda_graphs is capturable
    if capturable:
        runner.capture_decode_graphs(capture=False)
    else:
        assert runner.decode_graphs is None
        with pytest.raises(ValueError, match=f"the '{kv_cache}' attention backend cannot be captured"):
            runner.capture_decode_graphs(capture=False)
    out = llm.generate("def add(a, b):", SamplingParams(temperature=0, max_tokens=8))[0]
    assert len(out.outputs[0].token_ids) == 8
