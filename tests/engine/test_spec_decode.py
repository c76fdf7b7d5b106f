"""Speculative decoding in the engine: greedy output token for token the plain engine's (draft model
and n-gram, several k, both attention backends, prefix caching, preemption), sampled output
distributed as the target's (chi-square against its exact next-token distribution), seeded
requests batch-invariant, stops inside an accepted run, counters and trace, no leaked blocks; drafts
that do not fit the target refused; prompt lookup and the acceptance counts worked out by hand."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from test_rejection_sampler import resample_from_p  # the tempting wrong rule, written out there

from minillm import LLM, SamplingParams
from minillm.engine.trace import record
from minillm.eval.heldout import eval_token_ids
from minillm.grading.checks_rejection_sampler_engine import second_token_p_value
from minillm.models.loader import load_tokenizer, resolve_model_path
from minillm.sample.rejection_sampler import stochastic_accept
from minillm.spec_decode.acceptance import (
    AcceptanceCounts,
    acceptance_stats,
    expected_tokens_from_rates,
    expected_tokens_per_call,
    modelled_tokens_per_call,
    position_rates,
)
from minillm.spec_decode.ngram import lookup

DRAFT = {"model": "tiny-draft"}
NGRAM = {"method": "ngram", "prompt_lookup_max": 4, "prompt_lookup_min": 2}
ENGINE = {"dtype": "float32", "max_model_len": 256}


def spec(config: dict, k: int) -> dict:
    return {**config, "num_speculative_tokens": k}


@pytest.fixture(scope="module")
def prompts() -> list[dict]:
    """32 held-out prompts of 4 to 66 tokens, from different places in the held-out modules."""
    ids = eval_token_ids(load_tokenizer(resolve_model_path("tiny")))
    return [{"prompt_token_ids": ids[i * 997:i * 997 + 4 + 2 * i]} for i in range(32)]


# Greedy, some requests stopping early on a token or at EOS, the rest at different lengths.
PARAMS = [SamplingParams(temperature=0, max_tokens=8 + (i % 5) * 6, ignore_eos=i % 3 == 0,
                         stop_token_ids=[13] if i % 4 == 1 else None) for i in range(32)]


@pytest.fixture(scope="module")
def plain(prompts) -> list[list[int]]:
    outs = LLM("tiny", **ENGINE).generate(prompts, PARAMS, use_tqdm=False)
    return [o.outputs[0].token_ids for o in outs]


def metrics(llm: LLM) -> dict:
    """get_metrics() as vLLM's spec_decode example reads it: short name -> value or values."""
    out: dict = {}
    for m in llm.get_metrics():
        name = m.name.removeprefix("vllm:").removeprefix("spec_decode_num_")
        out[name] = out.get(name, 0) + m.value if hasattr(m, "value") else getattr(m, "values", m)
    return out


def generate(llm: LLM, prompts, params=PARAMS) -> list[list[int]]:
    outs = llm.generate(prompts, params, use_tqdm=False)
    blocks = llm.llm_engine.block_manager
    assert blocks.num_free_blocks == blocks.num_blocks, "KV blocks leaked"
    return [o.outputs[0].token_ids for o in outs]


@pytest.mark.parametrize("k", [1, 4, 8])
@pytest.mark.parametrize("method", [DRAFT, NGRAM], ids=["draft", "ngram"])
def test_greedy_output_is_the_plain_engines(method, k, prompts, plain):
    llm = LLM("tiny", speculative_config=spec(method, k), **ENGINE)
    assert generate(llm, prompts) == plain
    m = metrics(llm)
    assert m["drafts"] > 0 and 0 < m["accepted_tokens"] < m["draft_tokens"]
    # Prefix caching: the same prompts again hit the cache, and the draft still proposes well.
    assert generate(llm, prompts) == plain


# As built (unpadded on a CPU, CUDA graphs on a GPU), and padded as the graphs pad, run eagerly.
@pytest.mark.parametrize("padded", [False, True], ids=["as-built", "padded"])
def test_the_target_as_its_own_draft_has_every_draft_accepted(prompts, padded):
    """Each draft step after the first feeds the token the step before drafted, which never leaves
    the device: with the target as its own draft, greedy, every draft is the target's own next token.
    Requests end at different lengths, so near its end a request drafts fewer tokens than the others
    of its step (the device's tokens then follow only the requests still drafting). Padded as CUDA
    graphs pad, a later step of the same sequences moves their positions, lengths and slots on on
    the device, padding rows included (7 requests, then fewer, in graphs of 8, 4 and 2 rows): a wrong
    position, length or slot there, or a padding row that stores K/V, makes drafts the target rejects."""
    params = [SamplingParams(temperature=0, max_tokens=12 + 6 * i, ignore_eos=True) for i in range(7)]
    llm = LLM("tiny", speculative_config=spec({"model": "tiny"}, 4), **ENGINE)
    padding_rows = []  # per step moved on on the device: its padding rows
    if padded:
        llm.llm_engine.model_runner.capture_cuda_graphs(capture=False)
        backend = llm.llm_engine.model_runner.proposer.attn_backend
        advance = backend.advance_decode

        def counted_advance(num_seqs: int) -> torch.Tensor:
            padding_rows.append(int((backend.seq_lens.tensor[:num_seqs] == 0).sum()))
            return advance(num_seqs)

        backend.advance_decode = counted_advance
    plain_tokens = [o.outputs[0].token_ids for o in LLM("tiny", **ENGINE).generate(prompts[:7], params,
                                                                                     use_tqdm=False)]
    assert generate(llm, prompts[:7], params) == plain_tokens
    m = metrics(llm)
    assert m["draft_tokens"] > 0 and m["accepted_tokens"] == m["draft_tokens"]
    assert not padded or any(padding_rows), padding_rows


@pytest.mark.parametrize("method", [DRAFT, NGRAM], ids=["draft", "ngram"])
def test_penalized_greedy_requests_give_the_plain_engines_tokens(method):
    """Penalties count a position's earlier drafts as output, so the rejection sampler reads the
    drafts before it decides (unpenalized greedy rows read them with the target's tokens). Prompts of
    one token repeated invite drafts that repeat a token, which a frequency penalty must then refuse
    at the draft's second position: counted without the drafts, the output changes."""
    prompts = [{"prompt_token_ids": [t] * 24} for t in (13, 262, 281, 290, 1000, 300)]
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, frequency_penalty=1.5)
    plain_tokens = [o.outputs[0].token_ids for o in LLM("tiny", **ENGINE).generate(prompts, params, use_tqdm=False)]
    llm = LLM("tiny", speculative_config=spec(method, 4), **ENGINE)
    assert generate(llm, prompts, [params] * len(prompts)) == plain_tokens
    m = metrics(llm)
    # Prompt lookup drafts only repeats here, which the penalty refuses; the draft model gets some kept.
    assert m["draft_tokens"] > 0 and (m["accepted_tokens"] > 0 or method is NGRAM)


@pytest.mark.parametrize("method", [DRAFT, NGRAM], ids=["draft", "ngram"])
def test_triton_backend(method, prompts, plain):
    pytest.importorskip("triton")
    llm = LLM("tiny", speculative_config=spec(method, 4), attention_backend="triton", **ENGINE)
    # Two prompts (a batch of verifications that still differ in length): the kernels run under
    # Triton's interpreter on a CPU.
    assert generate(llm, prompts[:2], PARAMS[:2]) == plain[:2]


@pytest.mark.parametrize("method", [DRAFT, NGRAM], ids=["draft", "ngram"])
def test_preemption_under_a_small_pool(method, prompts, plain):
    llm = LLM("tiny", speculative_config=spec(method, 4), num_kv_blocks=16, **{**ENGINE, "max_model_len": 128})
    with record(llm) as trace:
        assert generate(llm, prompts) == plain
    assert any(event.preempted for event in trace.events)


def test_quantized_target_and_int8_cache_agree_with_their_plain_engine(prompts):
    settings = {"quantization": "int8", "kv_cache_dtype": "int8", **ENGINE}
    reference = generate(LLM("tiny", **settings), prompts[:8], PARAMS[:8])
    assert generate(LLM("tiny", speculative_config=spec(DRAFT, 4), **settings), prompts[:8], PARAMS[:8]) == reference


def test_stops_inside_an_accepted_run_cut_where_plain_decoding_does():
    prompt = "def add(a, b):\n    return a + b\n\n\ndef add(a, b):\n"
    params = [SamplingParams(temperature=0, max_tokens=n, stop=stop, logprobs=2)
              for n in (1, 2, 3, 7, 40) for stop in (None, ["\n"], [" b"])]
    outs = {}
    for config in (None, spec(NGRAM, 8), spec(DRAFT, 8)):
        outs[str(config)] = LLM("tiny", speculative_config=config, **ENGINE).generate([prompt] * len(params), params,
                                                                                       use_tqdm=False)
    reference, *others = outs.values()
    for out in others:
        for a, b in zip(reference, out):
            a, b = a.outputs[0], b.outputs[0]
            assert (b.token_ids, b.text, b.finish_reason, b.stop_reason) == (
                a.token_ids, a.text, a.finish_reason, a.stop_reason)
            # The target's logprobs, whether a token was drafted or the target's own.
            assert [list(d) for d in b.logprobs] == [list(d) for d in a.logprobs]
            for x, y in zip(a.logprobs, b.logprobs):
                for t in x:
                    assert y[t].logprob == pytest.approx(x[t].logprob, abs=1e-4)


def test_min_tokens_ending_inside_a_verified_run_ban_the_stop_token_only_before_it(prompts):
    """A step that verifies k drafts samples k + 1 positions of one sequence: the stop token is banned
    at those before min_tokens and allowed from there, as plain decoding allows it one step at a time.
    The target is its own draft, so every draft is kept and a step emits tokens 1-5, 6-10, ..."""
    plain_llm = LLM("tiny", **ENGINE)
    free = [o.outputs[0].token_ids for o in plain_llm.generate(
        prompts, SamplingParams(temperature=0, max_tokens=24, ignore_eos=True), use_tqdm=False)]
    chosen, params = [], []
    for prompt, tokens in zip(prompts, free):
        # The first occurrence of a token, at a position inside a run: min_tokens lets it stop there.
        i = next((i for i in range(2, len(tokens)) if tokens.index(tokens[i]) == i and i % 5 != 1), None)
        if i is not None:
            chosen.append(prompt)
            params.append(SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, min_tokens=i,
                                         stop_token_ids=[tokens[i]]))
    plain = [o.outputs[0].token_ids for o in plain_llm.generate(chosen, params, use_tqdm=False)]
    assert len(plain) >= 4 and all(len(tokens) == p.min_tokens + 1 for tokens, p in zip(plain, params))
    llm = LLM("tiny", speculative_config=spec({"model": "tiny"}, 4), **ENGINE)
    assert generate(llm, chosen, params) == plain
    # The draft bans the stop token by the same rule at each of its steps: it drafts the stop token
    # where the target allows it, and the target keeps every draft.
    m = metrics(llm)
    assert m["draft_tokens"] > 0 and m["accepted_tokens"] == m["draft_tokens"], m


def test_counters_and_trace(prompts):
    llm = LLM("tiny", speculative_config=spec(DRAFT, 4), **ENGINE)
    with record(llm) as trace:
        llm.generate(prompts[:6], SamplingParams(temperature=0, max_tokens=20, ignore_eos=True), use_tqdm=False)
    m = metrics(llm)
    verified = [s for e in trace.events for s in e.seqs if s.spec_token_ids]
    assert trace.info.speculative_method == "draft_model" and trace.info.num_speculative_tokens == 4
    assert m["drafts"] == len(verified)
    assert m["draft_tokens"] == sum(len(s.spec_token_ids) for s in verified)
    assert m["accepted_tokens"] == sum(s.num_accepted_tokens for s in verified)
    assert m["accepted_tokens_per_pos"] == [sum(s.num_accepted_tokens > j for s in verified) for j in range(4)]
    assert all(s.decode_tokens == len(s.spec_token_ids) + 1 and s.target_token_id is not None for s in verified)
    # Acceptance falls with the position: a token is only judged when all before it were kept.
    assert m["accepted_tokens_per_pos"] == sorted(m["accepted_tokens_per_pos"], reverse=True)
    assert m["generation_tokens"] == 6 * 20 and m["request_success"] == 6


def test_seeded_requests_give_the_same_tokens_alone_and_in_a_batch(prompts):
    """Alone, and admitted while other requests (seeded or not, greedy or sampled) are speculating."""
    llm = LLM("tiny", speculative_config=spec(DRAFT, 4), **ENGINE)
    seeded = SamplingParams(temperature=0.8, top_p=0.95, seed=7, max_tokens=24, ignore_eos=True)
    alone = generate(llm, prompts[3:4], [seeded])
    engine = llm.llm_engine
    for i in range(6):
        engine.add_request(f"other-{i}", prompts[i], SamplingParams(temperature=i / 5, seed=i if i % 2 else None,
                                                                      max_tokens=40, ignore_eos=True))
    for _ in range(3):
        engine.step()
    engine.add_request("seeded", prompts[3], seeded)
    finished = {}
    while engine.has_unfinished_requests():
        finished.update((out.request_id, out) for out in engine.step() if out.finished)
    assert finished["seeded"].outputs[0].token_ids == alone[0]


# Three tokens: the step after the first verifies a draft for the second (a step never verifies
# drafts past max_tokens).
SAMPLED = [SamplingParams(temperature=1.0, max_tokens=3, ignore_eos=True),
           SamplingParams(temperature=1.0, top_p=0.8, max_tokens=3, ignore_eos=True)]


def wrong_accept_always(p, q, drafts, num, u, noise):
    return stochastic_accept(p, q, drafts, num, torch.full_like(u, -1.0), noise)


@pytest.fixture(scope="module")
def random_draft(tmp_path_factory) -> str:
    """A draft of tiny's vocabulary with random weights: its q is far from the target's p, so most
    drafts are rejected and the residual draws most tokens (no tokenizer files: only the
    vocabulary size is checked)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    # Wide weights: each q is peaked, on tokens of its own choosing.
    config = LlamaConfig(vocab_size=4096, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256,
                         initializer_range=0.5)
    path = tmp_path_factory.mktemp("random-draft")
    LlamaForCausalLM(config).save_pretrained(path)
    return str(path)


@pytest.mark.parametrize(("draft", "params", "rule"), [
    ("random", SAMPLED[0], None), ("random", SAMPLED[1], None), ("tiny-draft", SAMPLED[0], None),
    # Drawing from p after a rejection is biased by what the draft gets right: a draft close to the
    # target shows it, a random one (rejected almost always) does not.
    ("tiny-draft", SAMPLED[0], resample_from_p), ("random", SAMPLED[0], wrong_accept_always)],
    ids=["temperature-1", "top-p", "shipped-draft", "resample-from-p", "accept-always"])
def test_sampling_is_lossless(draft, params, rule, random_draft):
    """2000 seeded requests; the second tokens after each common first token, against the target's
    exact distribution there. The engine passes; broken rules plugged into it fail."""
    llm = LLM("tiny", speculative_config={"model": random_draft if draft == "random" else draft,
                                          "num_speculative_tokens": 2}, max_num_seqs=256, **ENGINE)
    if rule is not None:
        llm.llm_engine.model_runner.rejection_sampler.stochastic_accept = rule
    prompt = llm.get_tokenizer()("def fibonacci(n):\n")["input_ids"]
    p = second_token_p_value(llm, prompt, params, 2000)
    assert (p > 1e-3) if rule is None else (p < 1e-4), p


@pytest.mark.parametrize(("config", "match"), [
    ({"model": "tiny-draft"}, r"\['num_speculative_tokens'\] is required"),
    ({"model": "tiny-draft", "num_speculative_tokens": 0},
     r"\['num_speculative_tokens'\] must be an integer in \[1, 16\]"),
    ({"model": "tiny-draft", "num_speculative_tokens": 1000}, r"\['num_speculative_tokens'\] must be an integer in"),
    ({"method": "medusa", "num_speculative_tokens": 2}, r"\['method'\] must be one of \('draft_model', 'ngram'\)"),
    ({"num_speculative_tokens": 2}, r"\['method'\] must be one of"),
    ({"method": "ngram", "num_speculative_tokens": 2, "model": "tiny-draft"}, r"\['model'\] must be None"),
    ({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 5}, r"\['prompt_lookup_min'\]"),
    ({"model": "no/such-draft", "num_speculative_tokens": 2}, r"\['model'\]='no/such-draft' could not be loaded"),
    ({"model": "tiny-draft", "num_speculative_tokens": 2, "k": 3}, r"unknown key\(s\) \['k'\]"),
    ("tiny-draft", "speculative_config must be a dict or None"),
])
def test_bad_configurations_are_refused_by_name(config, match):
    with pytest.raises(ValueError, match=match):
        LLM("tiny", speculative_config=config)


def test_a_draft_of_another_vocabulary_is_refused(hf_checkpoint):
    _, path = hf_checkpoint("llama_gqa_tied")  # 512 tokens; tiny has 4096
    with pytest.raises(ValueError, match=r"\['model'\]=.* has a vocabulary of 512 tokens, the target 4096"):
        LLM("tiny", speculative_config={"model": str(path), "num_speculative_tokens": 2})


@pytest.fixture
def draft_copy(tmp_path):
    """A copy of tiny-draft, to change."""
    return shutil.copytree(resolve_model_path("tiny-draft"), tmp_path / "draft")


def test_a_draft_with_fewer_positions_than_max_model_len_is_refused(draft_copy):
    config = json.loads((draft_copy / "config.json").read_text())
    (draft_copy / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 64}))
    with pytest.raises(ValueError, match=r"supports 64 positions, fewer than max_model_len=128; lower max_model_len"):
        LLM("tiny", max_model_len=128, speculative_config={"model": str(draft_copy), "num_speculative_tokens": 2})
    LLM("tiny", max_model_len=64, speculative_config={"model": str(draft_copy), "num_speculative_tokens": 2})


def test_a_draft_whose_tokenizer_numbers_tokens_differently_is_refused(draft_copy):
    """The same vocabulary size is not enough: two tokens' ids swapped, a draft token would mean other
    text to the target."""
    tokenizer = json.loads((draft_copy / "tokenizer.json").read_text())
    vocab = tokenizer["model"]["vocab"]
    vocab["!"], vocab['"'] = vocab['"'], vocab["!"]
    (draft_copy / "tokenizer.json").write_text(json.dumps(tokenizer))
    with pytest.raises(ValueError, match=r"a different tokenizer from the target's \(same size, different tokens\)"):
        LLM("tiny", speculative_config={"model": str(draft_copy), "num_speculative_tokens": 2})


def test_speculation_needs_the_paged_cache():
    with pytest.raises(ValueError, match="speculative_config needs kv_cache='paged'"):
        LLM("tiny", kv_cache="contiguous", speculative_config=spec(NGRAM, 2))


def test_plain_engine_metrics(prompts):
    llm = LLM("tiny", **ENGINE)
    llm.generate(prompts[:3], SamplingParams(temperature=0, max_tokens=5, ignore_eos=True), use_tqdm=False)
    m = metrics(llm)
    assert m["generation_tokens"] == 15 and m["request_success"] == 3 and m["num_requests_running"] == 0
    assert m["prompt_tokens"] == sum(len(p["prompt_token_ids"]) for p in prompts[:3])
    assert "drafts" not in m  # no speculative counters without speculation
    ttft = next(x for x in llm.get_metrics() if x.name == "vllm:time_to_first_token_seconds")
    assert ttft.count == 3 and ttft.buckets["+Inf"] == 3


def test_acceptance_counts_worked_out_by_hand():
    """Three proposals, k = 4: 2 of 4 drafts kept, 0 of 2 (a short proposal: max_tokens was near), 4
    of 4. A proposal's judged positions end at its first rejection; the formula is applied to each
    proposal's own length, since a proposal of 2 can never yield 5 tokens."""
    counts = AcceptanceCounts(k=4)
    for proposed, accepted in ((4, 2), (2, 0), (4, 4)):
        counts.add(proposed, accepted)
    assert (counts.drafts, counts.draft_tokens, counts.accepted, counts.judged) == (3, 10, 6, 3 + 1 + 4)
    assert counts.per_position == [2, 2, 1, 1]
    assert counts.alpha == 0.75 and counts.tokens_per_call == (6 + 3) / 3
    # (1 - 0.75^5) / 0.25 = 3.05078125 for the two proposals of 4, (1 - 0.75^3) / 0.25 = 2.3125 for the one of 2.
    assert expected_tokens_per_call(0.75, 4) == pytest.approx(3.05078125)
    assert counts.expected_tokens_per_call == pytest.approx((2 * 3.05078125 + 2.3125) / 3)
    # Reached: position 1 by all three, 2 by the two that kept their first, 3 by the one that kept 2
    # (rejected at 3) and the one that kept all, 4 by the latter alone.
    assert counts.judged_per_position == [3, 2, 2, 1]
    # The positions' rates, 2/3, 1, 1/2, 1, give a proposal of 4 1 + 2/3 + 2/3 + 1/3 + 1/3 = 3 tokens
    # and one of 2 1 + 2/3 + 2/3: with the proposals' own lengths, 25/9 a call, where they gave 3.
    stats = {"drafts": counts.drafts, "accepted_per_position": counts.per_position,
             "judged_per_position": counts.judged_per_position, "proposal_lengths": counts.lengths}
    assert position_rates(stats) == pytest.approx([2 / 3, 1, 1 / 2, 1])
    assert modelled_tokens_per_call(stats, position_rates(stats)) == pytest.approx(25 / 9)
    assert modelled_tokens_per_call(stats, []) is None


def test_position_rates_count_what_one_rate_for_every_position_miscounts_both_ways():
    """The formula takes one acceptance rate for every position. Drafts right or wrong whole (4, 0, 4,
    0 kept of 4) give alpha = 8 / 10 and a formula of 3.36 tokens a call, where each call gave 3;
    drafts that always fail at their last token (3 of 4 kept, every time) give alpha = 12 / 16 and
    3.05 where each gave 4. Position by position, the rates count both exactly at k = 4, and predict
    a shorter draft: 1 + 1/2 + 1/2 = 2 tokens at k = 2 for the first, 3 for the second."""
    for kept, rates, alpha, tokens, at_2 in (((4, 0, 4, 0), [0.5, 1.0, 1.0, 1.0], 0.8, 3, 2),
                                             ((3, 3, 3, 3), [1.0, 1.0, 1.0, 0.0], 0.75, 4, 3)):
        counts = AcceptanceCounts(k=4)
        for accepted in kept:
            counts.add(4, accepted)
        stats = {"accepted_per_position": counts.per_position, "judged_per_position": counts.judged_per_position}
        assert position_rates(stats) == rates and counts.alpha == alpha
        assert counts.tokens_per_call == tokens == expected_tokens_from_rates(rates, 4)
        assert abs(counts.expected_tokens_per_call - tokens) > 0.3  # 3.36 and 3.05
        assert expected_tokens_from_rates(rates, 2) == at_2
    # Past the positions measured, the last rate holds; one rate everywhere is the formula.
    assert expected_tokens_from_rates([0.5], 3) == pytest.approx(expected_tokens_per_call(0.5, 3))
    with pytest.raises(ValueError, match="rates"):
        expected_tokens_from_rates([], 2)


@pytest.mark.parametrize(("tokens", "k", "min_n", "max_n", "drafts"), [
    ([5, 6, 1, 5, 6, 2, 7, 5, 6], 3, 1, 2, [2, 7, 5]),  # the latest earlier occurrence of [5, 6], not the first
    ([3, 4, 1, 2, 4, 9, 9, 3, 4], 3, 1, 2, [1, 2, 4]),  # the longest suffix that recurs: [3, 4], not [4]
    ([3, 4, 1, 2, 4, 9, 9, 3, 4], 3, 1, 1, [9, 9, 3]),  # ...unless max_n stops at [4]
    ([4, 8, 1, 4], 3, 2, 4, []),  # [4] recurs, but is shorter than min_n
    ([1, 2, 1], 5, 1, 3, [2, 1]),  # fewer than k where the sequence ends
    ([7, 8], 2, 1, 2, []),  # the suffix itself is no earlier occurrence
    ([5, 5, 5], 3, 2, 4, [5]),  # [5, 5] at the start: the longest possible n, len - 1, is tried
])
def test_prompt_lookup_copies_what_followed_the_longest_latest_match(tokens, k, min_n, max_n, drafts):
    """Prompt lookup's drafts, worked out by hand: the engine's output cannot show a worse lookup,
    which only proposes drafts the target rejects more often."""
    assert lookup(tokens, k, min_n, max_n) == drafts


def test_tokens_per_target_call_of_the_shipped_pair_match_the_formula(prompts):
    """tiny / tiny-draft, k = 4, greedy: at least 2.3 tokens per target call, within 10% of
    (1 - alpha^5) / (1 - alpha) at the alpha the run measured."""
    llm = LLM("tiny", speculative_config=spec(DRAFT, 4), **ENGINE)
    with record(llm) as trace:
        llm.generate(prompts[:16], SamplingParams(temperature=0, max_tokens=64, ignore_eos=True), use_tqdm=False)
    stats = acceptance_stats(trace)
    measured, expected = stats["tokens_per_target_call"], stats["expected_tokens_per_target_call"]
    assert measured >= 2.3 and abs(measured / expected - 1) < 0.1, stats
    # vLLM's accepted / proposed counts positions after a rejection as failures: lower than alpha.
    assert stats["acceptance_rate"] < stats["alpha"]
