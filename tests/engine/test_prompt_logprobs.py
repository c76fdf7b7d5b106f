"""prompt_logprobs (vLLM's): the engine scores each prompt token after the first while it prefills the
prompt. Each entry must be what one full forward pass of the transformers model says, whatever the
scheduler did to the prompt (chunked it, found its beginning in the prefix cache, preempted it and
computed it again, padded its steps as a CUDA graph does), and asking for it must not change what is
generated."""

from __future__ import annotations

import pytest
import torch

from minillm import LLM, SamplingParams
from minillm.engine.trace import record

TOP_N = 3
# A 4-token budget cuts every longer prompt into chunks; blocks of 4 tokens let short prefixes be cached.
ENGINE = dict(skip_tokenizer_init=True, dtype="float32", device="cpu", max_model_len=64, block_size=4,
              max_num_seqs=4, max_num_batched_tokens=8, enforce_eager=True)


def prompts(vocab: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(3)
    return [torch.randint(0, vocab, (n,), generator=gen).tolist() for n in (1, 2, 9, 23, 30)]


def reference(hf, prompt: list[int]) -> torch.Tensor:
    """log_softmax of the transformers model's logits at every prompt position: [len(prompt), vocab]."""
    with torch.no_grad():
        return hf(torch.tensor([prompt])).logits[0].float().log_softmax(dim=-1)


def check_against_reference(hf, prompt: list[int], entries: list) -> None:
    assert len(entries) == len(prompt) and entries[0] is None, "one entry per prompt token, None first"
    ref = reference(hf, prompt)
    for position, (token, entry) in enumerate(zip(prompt[1:], entries[1:])):
        expected = ref[position]
        assert next(iter(entry)) == token, "the prompt's own token comes first"
        assert entry[token].logprob == pytest.approx(expected[token].item(), abs=1e-4)
        assert entry[token].rank == int((expected > expected[token]).sum()) + 1
        top_values, top_ids = expected.topk(TOP_N)
        alternatives = [(tid, lp) for tid, lp in entry.items() if lp.rank <= TOP_N]
        assert sorted(tid for tid, _ in alternatives) == sorted(top_ids.tolist())
        by_rank = sorted(alternatives, key=lambda item: item[1].rank)
        assert [lp.rank for _, lp in by_rank] == list(range(1, TOP_N + 1))
        assert [lp.logprob for _, lp in by_rank] == pytest.approx(top_values.tolist(), abs=1e-4)
        assert all(a[1].logprob >= b[1].logprob for a, b in zip(by_rank, by_rank[1:])), "sorted by likelihood"
        assert len(entry) <= TOP_N + 1


@pytest.fixture(scope="module")
def model(hf_checkpoint):
    return hf_checkpoint("llama_gqa_tied")


def generate(llm: LLM, token_ids: list[list[int]], prompt_logprobs: int | None, max_tokens: int = 5):
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True, logprobs=1,
                            prompt_logprobs=prompt_logprobs)
    return llm.generate([{"prompt_token_ids": p} for p in token_ids], params, use_tqdm=False)


@pytest.mark.parametrize("feature", ["chunked", "padded as a CUDA graph", "preemption", "async scheduling"])
def test_prompt_logprobs_match_a_full_forward_pass(model, feature):
    """Async scheduling prepares a prompt's next chunk before the scores of the chunk before it have
    been read: the tokens it scores follow from its positions (a chunk once scored the tokens just
    after the scores received so far, found by tests/engine/test_engine_properties.py)."""
    hf, path = model
    token_ids = prompts(hf.config.vocab_size)
    # Preemption: 16 blocks of 4 tokens cannot hold five prompts of up to 30 tokens and their outputs.
    # Padded: with 8 sequences, a graph has a logits row for each of its 8 tokens, so every step fits one.
    extra = {"preemption": {"num_kv_blocks": 16}, "padded as a CUDA graph": {"max_num_seqs": 8},
             "async scheduling": {"async_scheduling": True}}.get(feature, {})
    llm = LLM(str(path), **{**ENGINE, **extra})
    engine, padded_scoring, in_flight = llm.llm_engine, [], []
    runner = engine.model_runner
    if feature == "padded as a CUDA graph":
        runner.capture_cuda_graphs(capture=False)
        execute = runner.execute
        runner.execute = lambda model_input: padded_scoring.append(
            model_input.batch is not None and any(model_input.prompt_scored)) or execute(model_input)
    if feature == "async scheduling":  # watched without a step listener, which turns async scheduling off
        may_stay = engine._may_stay_in_flight
        engine._may_stay_in_flight = lambda batch: in_flight.append(may_stay(batch)) or in_flight[-1]
        outs, trace = generate(llm, token_ids, TOP_N, max_tokens=12), None
        assert sum(in_flight) > 5, "steps were not left in flight"
    else:
        with record(llm) as trace:
            outs = generate(llm, token_ids, TOP_N, max_tokens=12)
    for prompt, out in zip(token_ids, outs):
        check_against_reference(hf, prompt, out.prompt_logprobs)
    assert trace is None or any(0 < s.prefill_tokens < 30 for e in trace.events for s in e.seqs
                                if s.request_id == "4"), "the longest prompt was not cut into chunks"
    assert feature != "preemption" or any(event.preempted for event in trace.events)
    assert feature != "padded as a CUDA graph" or any(padded_scoring), "no padded step scored a prompt"
    blocks = llm.llm_engine.block_manager
    assert blocks.num_free_blocks == blocks.num_blocks, "KV blocks leaked"


def test_a_cached_prefix_is_computed_again_for_prompt_logprobs(model):
    """A prompt whose beginning is in the prefix cache: the cached tokens would get no logits, so the
    request that scores its prompt computes all of it; the others still hit the cache."""
    hf, path = model
    llm = LLM(str(path), **ENGINE, enable_prefix_caching=True)
    prefix = prompts(hf.config.vocab_size)[-1]
    prompt = prefix + [7, 8, 9]
    generate(llm, [prefix], None)  # caches the prefix's blocks
    scored = generate(llm, [prompt], TOP_N)[0]
    assert scored.num_cached_tokens == 0
    check_against_reference(hf, prompt, scored.prompt_logprobs)
    assert generate(llm, [prompt], None)[0].num_cached_tokens >= 24, "the prefix cache did not serve the others"


def test_generated_tokens_do_not_change_when_the_prompt_is_scored(model):
    hf, path = model
    token_ids = prompts(hf.config.vocab_size)
    plain = generate(LLM(str(path), **ENGINE), token_ids, None, max_tokens=8)
    scored = generate(LLM(str(path), **ENGINE), token_ids, 0, max_tokens=8)
    for a, b in zip(plain, scored):
        assert a.prompt_logprobs is None
        assert b.outputs[0].token_ids == a.outputs[0].token_ids
        logprobs = [e[t].logprob for e, t in zip(b.outputs[0].logprobs, b.outputs[0].token_ids)]
        assert logprobs == pytest.approx([e[t].logprob for e, t in zip(a.outputs[0].logprobs, a.outputs[0].token_ids)],
                                         abs=1e-5)
        # prompt_logprobs=0: the prompt's own token alone.
        assert all(len(entry) == 1 for entry in b.prompt_logprobs[1:])


@pytest.mark.parametrize("value", [-1, 21, 2**64, True, 1.0, "1"])
def test_bad_values_are_refused_naming_the_field(value):
    with pytest.raises((ValueError, TypeError), match="prompt_logprobs"):
        SamplingParams(prompt_logprobs=value)


def test_speculative_decoding_refuses_prompt_logprobs():
    llm = LLM("tiny", skip_tokenizer_init=True, dtype="float32", speculative_config={
        "method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 2})
    with pytest.raises(ValueError, match="prompt_logprobs"):
        llm.generate([{"prompt_token_ids": [1, 2, 3]}], SamplingParams(prompt_logprobs=1), use_tqdm=False)
