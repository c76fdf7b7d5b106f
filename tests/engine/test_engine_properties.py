"""Any mix of the engine's features on any small workload: hypothesis draws the engine (block size,
pool size, sequences and tokens a step, prefix caching, speculation by n-gram or draft model, async
scheduling, the CUDA graphs' padded path run eagerly) and the workload (prompts sharing a beginning,
arrivals over the first steps, stop tokens, penalties, aborts, n completions). Each completion of a
request that is not aborted must get, in fp32, the greedy tokens it gets alone, with the same finish
reason and log-probabilities (its prompt's scores too), and the pool must be whole afterwards. The
other engine tests take the features one or two at a time, on workloads chosen by hand; this one
looks for what their combinations break."""

from __future__ import annotations

import dataclasses
import functools
import math

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from minillm import LLM, RequestOutput, SamplingParams
from minillm.engine.parallel_sampling import child_params
from minillm.engine.trace import record
from minillm.outputs import CompletionOutput

MAX_MODEL_LEN = 64
VOCAB = 1000  # ids under tiny's vocabulary, from which the prompts are drawn


@functools.cache
def alone_llm() -> LLM:
    return LLM("tiny", skip_tokenizer_init=True, dtype="float32", max_model_len=MAX_MODEL_LEN, max_num_seqs=1,
               enable_prefix_caching=False)


def summary(out: RequestOutput, completion: CompletionOutput | None = None) -> tuple:
    """The completion's (default: the first one's) tokens, finish reason, the tokens' logprobs, and the
    prompt's scores: each position's (token, logprob) pairs, the first position unscored."""
    completion = completion or out.outputs[0]
    logprobs = [entry[token].logprob for entry, token in zip(completion.logprobs or [], completion.token_ids)]
    scored = [sorted((token, lp.logprob) for token, lp in entry.items()) for entry in (out.prompt_logprobs or [])[1:]]
    return completion.token_ids, completion.finish_reason, logprobs, scored


_ALONE: dict[tuple[tuple[int, ...], str], tuple] = {}


def alone(prompt: tuple[int, ...], params: SamplingParams) -> tuple:
    """The summary of a prompt served alone (kept: a workload asks again and again)."""
    key = (prompt, repr(params))
    if key not in _ALONE:
        _ALONE[key] = summary(alone_llm().generate({"prompt_token_ids": list(prompt)}, params, use_tqdm=False)[0])
    return _ALONE[key]


def assert_same(got: tuple, want: tuple, what: str) -> None:
    """Tokens and finish reasons equal, log-probabilities within fp32 rounding of another batch."""
    assert got[:2] == want[:2], what
    assert got[2] == pytest.approx(want[2], abs=1e-4), what
    assert [[t for t, _ in pos] for pos in got[3]] == [[t for t, _ in pos] for pos in want[3]], what
    assert [lp for pos in got[3] for _, lp in pos] == pytest.approx([lp for pos in want[3] for _, lp in pos],
                                                                    abs=1e-4), what


@st.composite
def engines(draw, attention_backend: str = "torch") -> dict:
    # The Triton kernels' tiles of keys take blocks of at least 16 (`kernels/ops.py` refuses fewer); the
    # largest block the pool takes, 1,024 tokens, is longer than the decode kernel's partition.
    block_size = draw(st.sampled_from([4, 8, 16] if attention_backend == "torch" else [16, 32, 1024]))
    k = draw(st.integers(1, 4))
    speculative = draw(st.sampled_from([None, "ngram", "draft"]))
    max_num_seqs = draw(st.integers(1, 4))
    args = dict(skip_tokenizer_init=True, dtype="float32", max_model_len=MAX_MODEL_LEN, block_size=block_size,
                attention_backend=attention_backend,
                # From one request at full length (what the engine guarantees) to room for several.
                num_kv_blocks=math.ceil(MAX_MODEL_LEN / block_size) + draw(st.integers(0, 12)),
                max_num_seqs=max_num_seqs,
                # A verification of every sequence must fit one step: (k + 1) tokens each.
                max_num_batched_tokens=max_num_seqs * (k + 1) + draw(st.sampled_from([0, 7, 32])),
                enable_prefix_caching=draw(st.booleans()), async_scheduling=draw(st.booleans()))
    if speculative == "ngram":
        args["speculative_config"] = {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": 3}
    elif speculative == "draft":
        args["speculative_config"] = {"model": "tiny-draft", "num_speculative_tokens": k}
    return {"args": args, "padded": draw(st.booleans())}


@st.composite
def workloads(draw) -> list[dict]:
    # Repetitive beginnings, so that prompt lookup finds matches and prompts share cached blocks.
    prefix = draw(st.lists(st.integers(0, 9), min_size=0, max_size=24))
    requests = []
    for i in range(draw(st.integers(1, 6))):
        shared = draw(st.integers(0, len(prefix)))
        requests.append({
            "beginning": prefix[:shared],
            # A follow-up turn: an earlier request's prompt and answer come first (a chat's next turn).
            "follows": draw(st.none() | st.integers(0, i - 1)) if i else None,
            "own": draw(st.lists(st.integers(0, VOCAB - 1), min_size=0 if shared else 1, max_size=20)),
            "max_tokens": draw(st.integers(1, 14)),
            "arrival": draw(st.integers(0, 12)),  # the step before which it is added
            # Stop on the token that its run alone makes at this index (None: run to max_tokens), not
            # before min_tokens tokens.
            "stop_index": draw(st.none() | st.integers(0, 13)),
            "min_tokens": draw(st.sampled_from([0, 0, 2])),
            # Penalties change greedy choices with what the sequence holds, drafts verified included.
            "presence_penalty": draw(st.sampled_from([0.0, 0.0, 1.0])),
            "repetition_penalty": draw(st.sampled_from([1.0, 1.0, 1.5])),
            "logprobs": draw(st.sampled_from([None, 1])),
            "prompt_logprobs": draw(st.sampled_from([None, None, 2])),  # not with speculation
            "abort_step": draw(st.none() | st.none() | st.integers(0, 8)),
            "n": draw(st.sampled_from([1, 1, 2, 3])),  # greedy: n times the same tokens
        })
    return requests


def prompt(workload: list[dict], i: int) -> tuple[int, ...]:
    request = workload[i]
    if request["follows"] is None:
        return tuple(request["beginning"] + request["own"])
    before = prompt(workload, request["follows"])
    turn = before + tuple(expected(workload, request["follows"], False)[0]) + tuple(request["own"])
    return turn[:MAX_MODEL_LEN - 14]  # room for the longest answer


def params_of(workload: list[dict], i: int, prompt_scores: bool) -> SamplingParams:
    """Request i's greedy parameters (its prompt scored where prompt_scores allows); its stop token is
    the one its run without it makes at stop_index."""
    request = workload[i]
    params = SamplingParams(temperature=0, max_tokens=request["max_tokens"], ignore_eos=True,
                            min_tokens=min(request["min_tokens"], request["max_tokens"]),
                            presence_penalty=request["presence_penalty"],
                            repetition_penalty=request["repetition_penalty"], logprobs=request["logprobs"],
                            prompt_logprobs=request["prompt_logprobs"] if prompt_scores else None)
    free = alone(prompt(workload, i), params)[0]
    stop = request["stop_index"]
    if stop is not None and stop < len(free):
        params = dataclasses.replace(params, stop_token_ids=[free[stop]])
    return params


def expected(workload: list[dict], i: int, prompt_scores: bool) -> tuple:
    return alone(prompt(workload, i), params_of(workload, i, prompt_scores))


def serve(llm: LLM, requests: list[tuple[tuple[int, ...], SamplingParams, int, int | None]]) -> tuple[dict, set]:
    """Requests (prompt, parameters, arrival step, abort step or None) stepped through llm's engine as
    generate steps it, each added before its arrival step and aborted before its abort step if still
    there: the summaries of the completions of those that finished, and the ones aborted, by index."""
    core, finished, aborted = llm.llm_engine, {}, set()
    completions: dict[int, dict[int, tuple]] = {}  # request -> completion index -> summary, once finished
    for step in range(10_000):
        for i, (prompt_ids, params, arrival, abort_step) in enumerate(requests):
            if arrival == step:
                core.add_request(str(i), {"prompt_token_ids": list(prompt_ids)}, params)
            if abort_step == step and i not in finished and (core.scheduler.find(str(i))
                                                             or core.parallel_sampling.knows(str(i))):
                core.abort_request(str(i))
                aborted.add(i)
        if step > max(arrival for _, _, arrival, _ in requests) and not core.has_unfinished_requests():
            return finished, aborted
        for out in core.step():
            # Streamed, an output holds the completion that moved; whole, all of them.
            i = int(out.request_id)
            for completion in out.outputs:
                if completion.finished():
                    assert completion.index not in completions.setdefault(i, {}), \
                        f"request {i}'s completion {completion.index} finished twice"
                    completions[i][completion.index] = summary(out, completion)
            if out.finished:
                assert i not in finished, f"request {i} finished twice"
                finished[i] = [completions[i][j] for j in sorted(completions[i])]
    raise AssertionError("not done after 10,000 steps")


@pytest.mark.slow
@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
# A follow-up turn whose prompt fills a block with the token that ended the turn before: that token was
# sampled, never computed, so its block must not be cached (found by hypothesis, with the block cached
# once its tokens existed rather than once they were computed).
@example(engine={"args": dict(skip_tokenizer_init=True, dtype="float32", max_model_len=MAX_MODEL_LEN, block_size=4,
                              num_kv_blocks=16, max_num_seqs=1, max_num_batched_tokens=32, enable_prefix_caching=True,
                              async_scheduling=False), "padded": False},
         workload=[{"beginning": [], "follows": None, "own": [0, 0, 0], "max_tokens": 1, "arrival": 0,
                    "stop_index": None, "min_tokens": 0, "presence_penalty": 0.0, "repetition_penalty": 1.0,
                    "logprobs": None, "prompt_logprobs": None, "abort_step": None, "n": 1},
                   {"beginning": [], "follows": 0, "own": [0], "max_tokens": 1, "arrival": 0, "stop_index": None,
                    "min_tokens": 0, "presence_penalty": 0.0, "repetition_penalty": 1.0, "logprobs": None,
                    "prompt_logprobs": None, "abort_step": None, "n": 1}])
# A prompt scored in two chunks with async scheduling: the second chunk's step, prepared before the
# first one's scores were read, scored the tokens after those received so far (found by hypothesis).
@example(engine={"args": dict(skip_tokenizer_init=True, dtype="float32", max_model_len=MAX_MODEL_LEN, block_size=4,
                              num_kv_blocks=16, max_num_seqs=1, max_num_batched_tokens=2, enable_prefix_caching=False,
                              async_scheduling=True), "padded": False},
         workload=[{"beginning": [], "follows": None, "own": [0, 0, 0, 1], "max_tokens": 1, "arrival": 0,
                    "stop_index": None, "min_tokens": 0, "presence_penalty": 0.0, "repetition_penalty": 1.0,
                    "logprobs": None, "prompt_logprobs": 2, "abort_step": None, "n": 1}])
@given(engine=engines(), workload=workloads())
def test_any_mix_of_features_gives_each_request_its_tokens_alone_and_frees_every_block(engine, workload):
    check_against_alone(engine, workload)


@pytest.mark.slow
@settings(max_examples=8, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(engine=engines("triton"), workload=workloads())
def test_the_triton_kernels_under_any_mix_of_features(engine, workload):
    """The same on the Triton kernels, run by the interpreter (some 20 s an example, so only a few),
    against the PyTorch backend's tokens alone. The kernels' own property tests draw many more
    batches, at a fraction of the cost (tests/kernels/test_kernel_properties.py)."""
    check_against_alone(engine, workload)


def check_against_alone(engine: dict, workload: list[dict]) -> None:
    llm = LLM("tiny", **engine["args"])
    if engine["padded"]:
        llm.llm_engine.model_runner.capture_cuda_graphs(capture=False)
    prompt_scores = "speculative_config" not in engine["args"]  # which refuses prompt_logprobs
    finished, aborted = serve(llm, [(prompt(workload, i), dataclasses.replace(
        params_of(workload, i, prompt_scores), n=request["n"]), request["arrival"], request["abort_step"])
        for i, request in enumerate(workload)])
    for i, request in enumerate(workload):
        if i not in aborted:
            assert len(finished[i]) == request["n"], f"request {i}: {request}"
            for completion in finished[i]:
                assert_same(completion, expected(workload, i, prompt_scores), f"request {i}: {request}")
    assert not aborted & finished.keys()
    blocks = llm.llm_engine.block_manager
    assert blocks.num_free_blocks == blocks.num_blocks, "KV blocks leaked"


@st.composite
def seeded_requests(draw) -> list[tuple[tuple[int, ...], SamplingParams, int]]:
    """(prompt, sampling parameters, arrival step): seeded draws through every filter and penalty, of one
    completion or two."""
    prefix = draw(st.lists(st.integers(0, 9), min_size=0, max_size=16))
    requests = []
    for _ in range(draw(st.integers(2, 5))):
        own = draw(st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=16))
        params = SamplingParams(
            temperature=draw(st.sampled_from([0.0, 0.7, 1.0, 1.5])), seed=draw(st.integers(0, 2**32)),
            top_k=draw(st.sampled_from([0, 1, 5, 50])), top_p=draw(st.sampled_from([1.0, 0.9, 0.5])),
            min_p=draw(st.sampled_from([0.0, 0.05])), presence_penalty=draw(st.sampled_from([0.0, 0.5])),
            repetition_penalty=draw(st.sampled_from([1.0, 1.2])), max_tokens=draw(st.integers(1, 12)),
            ignore_eos=True, logprobs=draw(st.sampled_from([None, 0, 2])), n=draw(st.sampled_from([1, 1, 2])))
        requests.append((tuple(prefix[:draw(st.integers(0, len(prefix)))]) + tuple(own), params,
                         draw(st.integers(0, 6))))
    return requests


@pytest.mark.slow
@settings(max_examples=30, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
# A prompt whose last chunk is one token: it must not carry drafts, or its first token is drawn by
# verification rather than as alone (found by hypothesis).
@example(engine={"args": dict(skip_tokenizer_init=True, dtype="float32", max_model_len=MAX_MODEL_LEN, block_size=4,
                              num_kv_blocks=16, max_num_seqs=3, max_num_batched_tokens=6, enable_prefix_caching=False,
                              async_scheduling=False, speculative_config={
                                  "method": "ngram", "num_speculative_tokens": 1, "prompt_lookup_max": 3}),
                 "padded": False},
         requests=[((0,) * 6, SamplingParams(temperature=0.7, seed=0, max_tokens=2, ignore_eos=True), 1),
                   ((0,), SamplingParams(temperature=0, max_tokens=2, ignore_eos=True), 0)])
@given(engine=engines(), requests=seeded_requests())
def test_a_seeded_request_draws_the_same_tokens_whatever_runs_beside_it(engine, requests):
    """A seeded request draws from a generator of its own (sample/sampler.py), so its tokens depend on
    its seed, not on the batch it shares, however the engine runs it: beside others, and alone in the
    same engine, give the same tokens (and logprobs to fp32 rounding); its completion j, those of the
    request alone with seed + j. One exception, as in vLLM: with speculative decoding, a preempted
    request's recompute samples its next token without drafts, where its decode step alone verified
    some, so its draws part from there (greedy ones do not)."""
    llm = LLM("tiny", **engine["args"])
    if engine["padded"]:
        llm.llm_engine.model_runner.capture_cuda_graphs(capture=False)
    with record(llm) as trace:
        together, _ = serve(llm, [(prompt_ids, params, arrival, None) for prompt_ids, params, arrival in requests])
    # (a completion's request id is "j_i": request i's completion j)
    preempted = {int(r.split("_")[-1]) for e in trace.events for r in e.preempted} \
        if "speculative_config" in engine["args"] else ()
    for i, (prompt_ids, params, _) in enumerate(requests):
        if i not in preempted or params.greedy:
            for j, completion in enumerate(together[i]):  # completion j: the request alone with seed + j
                alone_j = serve(llm, [(prompt_ids, child_params(params, j), 0, None)])[0][0][0]
                assert_same(completion, alone_j, f"request {i}, completion {j}: {params}")
    blocks = llm.llm_engine.block_manager
    assert blocks.num_free_blocks == blocks.num_blocks, "KV blocks leaked"
