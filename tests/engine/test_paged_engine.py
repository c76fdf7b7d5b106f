"""The engine on its paged KV cache: the same greedy tokens with either attention backend, with and
without prefix caching, under preemption; blocks never leak; bad configuration is refused."""

from __future__ import annotations

import pytest
import torch

from minillm import LLM, SamplingParams
from minillm.engine.trace import record

GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
# float32 throughout, so that greedy comparisons hold on a GPU too (where "auto" is the model's bf16).
# A shared "system prompt" of several blocks, then a different ending per request.
SYSTEM = ('"""Command line entry point of a small utility."""\n\nimport argparse\nimport os\nimport sys\n\n\n'
          "def main(argv: list[str]) -> int:\n    parser = argparse.ArgumentParser()\n    ")
PROMPTS = [SYSTEM + "return 0\n", SYSTEM + "for arg in argv:\n", SYSTEM + "print(argv)\n", "x = 1\n"]


def token_ids(outputs) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in outputs]


def assert_no_blocks_held(llm: LLM) -> None:
    blocks = llm.llm_engine.block_manager
    assert not llm.llm_engine.has_unfinished_requests()
    assert blocks.num_free_blocks == blocks.num_blocks
    assert all(b.ref_count == 0 for b in blocks.blocks)


@pytest.mark.parametrize("kind", ["llama_gqa_tied", "qwen3_qk_norm"])
def test_triton_backend_matches_transformers(kind, hf_checkpoint):
    pytest.importorskip("triton")
    hf, path = hf_checkpoint(kind)
    llm = LLM(str(path), skip_tokenizer_init=True, dtype="float32", attention_backend="triton", max_model_len=64)
    gen = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, 512, (n,), generator=gen).tolist() for n in (1, 17, 40)]
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], GREEDY, use_tqdm=False)
    for prompt, out in zip(prompts, outs):
        ref = hf.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=8, min_new_tokens=8)
        assert out.outputs[0].token_ids == ref[0, len(prompt):].tolist(), f"{kind}: prompt of {len(prompt)}"


@pytest.fixture(scope="module")
def reference_tokens():
    """Each prompt generated alone, on the contiguous cache of the foundation."""
    llm = LLM("tiny", kv_cache="contiguous", dtype="float32")
    return {p: token_ids(llm.generate(p, GREEDY, use_tqdm=False))[0] for p in PROMPTS}



# Triton (interpreted, slow on a CPU) with the prefix cache only: its prompts then take both paths,
# a cached prefix (the shared system prompt) and a whole prompt (the last one, which shares nothing);
# test_triton_backend_matches_transformers covers its plain prefill as well.
@pytest.mark.parametrize("backend,caching", [("torch", True), ("torch", False), ("triton", True)])
def test_backends_and_prefix_caching_give_the_same_tokens(backend, caching, reference_tokens):
    if backend == "triton":
        pytest.importorskip("triton")
    llm = LLM("tiny", attention_backend=backend, enable_prefix_caching=caching, max_model_len=128,
              dtype="float32")
    first = llm.generate(PROMPTS[:1], GREEDY, use_tqdm=False)  # fills the prefix cache
    rest = llm.generate(PROMPTS[1:], GREEDY, use_tqdm=False)  # shares SYSTEM's leading blocks
    assert token_ids(first + rest) == [reference_tokens[p] for p in PROMPTS]
    hits = [o.num_cached_tokens for o in rest]
    if caching:
        assert hits[0] >= 32 and hits[0] % 16 == 0 and hits == [hits[0], hits[0], 0]
    else:
        assert hits == [0, 0, 0]
    assert_no_blocks_held(llm)


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_requests_arriving_together_share_their_prefix_in_their_first_step(backend, reference_tokens):
    """The first request's prompt blocks enter the prefix cache as it is scheduled, so the two after it,
    admitted in the same step, hit the shared system prompt's blocks and read K/V that the same layer of
    the same step has just stored."""
    if backend == "triton":
        pytest.importorskip("triton")
    llm = LLM("tiny", attention_backend=backend, max_model_len=128, dtype="float32")
    with record(llm) as trace:
        outs = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    assert token_ids(outs) == [reference_tokens[p] for p in PROMPTS]
    first_step = {s.request_id: s for s in trace.events[0].seqs}
    assert len(first_step) == len(PROMPTS), "the four prompts were meant to fit one step"
    hits = [o.num_cached_tokens for o in outs]
    assert hits[1] >= 32 and hits == [0, hits[1], hits[1], 0]
    computed = sum(s.prefill_tokens for s in first_step.values())
    assert computed == sum(len(o.prompt_token_ids) for o in outs) - 2 * hits[1]
    assert_no_blocks_held(llm)


@pytest.mark.parametrize("failure", [RuntimeError, KeyboardInterrupt])
def test_a_step_that_fails_leaves_no_uncomputed_block_in_the_prefix_cache(failure, monkeypatch, reference_tokens):
    """A step's prompt blocks are registered as it is scheduled; if the step then fails (or Ctrl-C stops
    it), they hold no K/V and must leave the cache, or the next request with that prompt reads garbage."""
    llm = LLM("tiny", max_model_len=128, dtype="float32")
    runner = llm.llm_engine.model_runner

    def fails(*args, **kwargs):
        raise failure("the step failed")

    monkeypatch.setattr(runner, "execute_model", fails)
    with pytest.raises(failure):
        llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    blocks = llm.llm_engine.block_manager
    assert blocks.num_cached_blocks == 0
    monkeypatch.undo()
    assert token_ids(llm.generate(PROMPTS, GREEDY, use_tqdm=False)) == [reference_tokens[p] for p in PROMPTS]
    assert_no_blocks_held(llm)


def test_triton_blocks_longer_than_a_decode_partition(reference_tokens):
    """Blocks of 1,024 tokens, the largest the pool takes: the decode kernel's partitions (512 tokens by
    default) must be whole blocks, so each is one block, eagerly and on the CUDA graphs' padded path."""
    pytest.importorskip("triton")
    llm = LLM("tiny", attention_backend="triton", block_size=1024, max_model_len=2048, dtype="float32")
    prompts = PROMPTS[2:]  # two prompts in one batch: the interpreter is slow
    want = [reference_tokens[p] for p in prompts]
    assert token_ids(llm.generate(prompts, GREEDY, use_tqdm=False)) == want
    llm.llm_engine.model_runner.capture_cuda_graphs(capture=False)
    assert token_ids(llm.generate(prompts, GREEDY, use_tqdm=False)) == want
    assert_no_blocks_held(llm)


def test_preemption_and_aborts_leave_outputs_unchanged_and_blocks_free(reference_tokens):
    # 28 blocks of 4 tokens: two of the ~52-token prompts fit (13 + 14 blocks), but not their growth,
    # so the scheduler must queue, preempt the most recent sequence when decodes run out of blocks,
    # and recompute it later.
    llm = LLM("tiny", block_size=4, num_kv_blocks=28, max_model_len=100, dtype="float32")
    engine = llm.llm_engine
    preempted = []
    engine.step_listeners.append(lambda event: preempted.extend(event.preempted))
    outs = llm.generate(PROMPTS * 2, GREEDY, use_tqdm=False)
    assert token_ids(outs) == [reference_tokens[p] for p in PROMPTS * 2]
    assert preempted, "the pool was meant to be small enough to force a preemption"
    assert_no_blocks_held(llm)

    for i, prompt in enumerate(PROMPTS):
        engine.add_request(f"r{i}", prompt, GREEDY)
    finished = {}
    for step in range(200):
        if step == 2:
            engine.abort_request("r1")
            engine.abort_request("r3")  # running or still queued: either way its blocks (if any) come back
        finished.update((o.request_id, o) for o in engine.step() if o.finished)
        if not engine.has_unfinished_requests():
            break
    assert sorted(finished) == ["r0", "r2"]
    assert [finished[r].outputs[0].token_ids for r in ("r0", "r2")] == [reference_tokens[PROMPTS[0]],
                                                                         reference_tokens[PROMPTS[2]]]
    assert_no_blocks_held(llm)


def test_pool_size_follows_the_arguments():
    llm = LLM("tiny", max_num_seqs=4, max_model_len=100)  # the cap: 4 sequences of 100 tokens
    engine = llm.llm_engine
    assert engine.block_manager.num_blocks == 4 * 7
    per_token = engine.model_config.kv_bytes_per_token(engine.dtype.itemsize)
    assert engine.kv_cache.reserved_bytes == engine.block_manager.num_blocks * 16 * per_token
    assert LLM("tiny", num_kv_blocks=40, max_model_len=64).llm_engine.block_manager.num_blocks == 40


@pytest.mark.parametrize("kwargs, message", [
    (dict(block_size=24), r"block_size must be a power of two in \[1, 1024\], got 24"),
    (dict(block_size=0), "block_size must be a power of two"),
    (dict(num_kv_blocks=3, max_model_len=64), r"the KV pool is too small: num_kv_blocks=3 gives 3 blocks of 16 "
                                              r"tokens, but one sequence of max_model_len=64 tokens needs 4"),
    (dict(num_kv_blocks=0), "num_kv_blocks must be an integer >= 1 or None"),
    (dict(gpu_memory_utilization=1.5), r"gpu_memory_utilization must be in \(0, 1\], got 1.5"),
    (dict(attention_backend="flash"), r"attention_backend must be one of \('auto', 'torch', 'triton'\)"),
    (dict(attention_backend="triton", block_size=8), "attention_backend='triton' needs block_size >= 16"),
    (dict(attention_backend="triton", kv_cache="contiguous"), "attention_backend='triton' needs kv_cache='paged'"),
])
def test_bad_cache_configuration_is_refused_at_construction(kwargs, message):
    if kwargs.get("attention_backend") == "triton":
        pytest.importorskip("triton")
    with pytest.raises(ValueError, match=message):
        LLM("tiny", **kwargs)


def test_triton_where_it_cannot_run_says_why(monkeypatch):
    pytest.importorskip("triton")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ValueError, match="attention_backend='triton' .*TRITON_INTERPRET=1"):
        LLM("tiny", attention_backend="triton", device="cpu")
