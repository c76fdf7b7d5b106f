"""LLM.generate / LLM.stream on the shipped model: stopping rules, logprobs, seeds, metrics,
streaming, aborts, bad input that is refused without disturbing the engine, a scheduling policy of
one's own, and the engine's step."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import json
import math
import shutil
import textwrap

import pytest

from minillm import LLM, SamplingParams
from minillm.engine.llm_engine import LLMEngine
from minillm.engine.output_processor import OutputProcessor
from minillm.engine.policy import SchedulingPolicy
from minillm.engine.runner_output import ModelRunnerOutput
from minillm.sampling_params import RequestOutputKind
from minillm.sequence import Sequence

GREEDY = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
PROMPTS = ["def fib(n):", "import os\n", "class Stack:\n    def __init__(self):"]


@pytest.fixture(scope="module")
def greedy_outputs(tiny_llm):
    return tiny_llm.generate(PROMPTS, GREEDY, use_tqdm=False)


def assert_engine_idle(llm: LLM) -> None:
    engine = llm.llm_engine
    assert not engine.has_unfinished_requests()
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks, "KV blocks leaked"


def test_outputs_come_back_in_prompt_order_and_batching_does_not_change_them(tiny_llm, greedy_outputs):
    assert [o.prompt for o in greedy_outputs] == PROMPTS
    for prompt, batched in zip(PROMPTS, greedy_outputs):
        alone = tiny_llm.generate(prompt, GREEDY, use_tqdm=False)[0]
        assert alone.outputs[0].token_ids == batched.outputs[0].token_ids
        assert batched.outputs[0].finish_reason == "length" and len(batched.outputs[0].token_ids) == 24
    assert_engine_idle(tiny_llm)


def test_token_id_prompts_equal_text_prompts(tiny_llm, greedy_outputs):
    ids = greedy_outputs[0].prompt_token_ids
    out = tiny_llm.generate({"prompt_token_ids": ids}, GREEDY, use_tqdm=False)[0]
    assert out.outputs[0].token_ids == greedy_outputs[0].outputs[0].token_ids
    assert out.prompt is None and out.outputs[0].text == greedy_outputs[0].outputs[0].text


def test_stop_string_cuts_the_text_before_it(tiny_llm, greedy_outputs):
    full = greedy_outputs[1].outputs[0]
    stop = full.text[5:8]  # a string that greedy decoding is known to produce
    out = tiny_llm.generate(PROMPTS[1], SamplingParams(temperature=0.0, max_tokens=24, stop=[stop, "never"]),
                            use_tqdm=False)[0].outputs[0]
    assert (out.finish_reason, out.stop_reason) == ("stop", stop)
    assert out.text == full.text[: full.text.index(stop)]
    assert out.token_ids == full.token_ids[: len(out.token_ids)]
    kept = tiny_llm.generate(PROMPTS[1], SamplingParams(temperature=0.0, max_tokens=24, stop=stop,
                                                        include_stop_str_in_output=True), use_tqdm=False)[0]
    assert kept.outputs[0].text == full.text[: full.text.index(stop) + len(stop)]


def test_stop_token_ids_and_min_tokens(tiny_llm, greedy_outputs):
    full = greedy_outputs[0].outputs[0].token_ids
    stop_id = full[2]
    out = tiny_llm.generate(PROMPTS[0], SamplingParams(temperature=0.0, max_tokens=24, stop_token_ids=[stop_id]),
                            use_tqdm=False)[0].outputs[0]
    first = full.index(stop_id)
    assert out.token_ids == full[: first + 1] and (out.finish_reason, out.stop_reason) == ("stop", stop_id)
    # The stop token's own text is left out, as vLLM does, unless include_stop_str_in_output asks for it:
    # decoded whole at the end, incrementally while streaming, and alongside stop strings.
    texts = decoded_prefixes(tiny_llm, full)
    assert texts[first] != texts[first + 1] and out.text == texts[first]
    for include in (False, True):
        for stop in ([], ["never"]):
            params = SamplingParams(temperature=0.0, max_tokens=24, stop_token_ids=[stop_id], stop=stop,
                                    include_stop_str_in_output=include)
            assert tiny_llm.generate(PROMPTS[0], params, use_tqdm=False)[0].outputs[0].text == texts[first + include]
        assert "".join(tiny_llm.stream(PROMPTS[0], params)) == texts[first + include]
    # The stop token is banned until min_tokens tokens exist, so the output cannot stop before.
    late = tiny_llm.generate(PROMPTS[0], SamplingParams(temperature=0.0, max_tokens=24, min_tokens=first + 3,
                                                        stop_token_ids=[stop_id]), use_tqdm=False)[0].outputs[0]
    assert len(late.token_ids) >= first + 3 and stop_id not in late.token_ids[: first + 2]


def test_a_stop_on_the_last_allowed_token_is_a_stop_not_the_length(tiny_llm, greedy_outputs):
    """max_tokens is reached by the very token that stops the request: the stop is the reason."""
    full = greedy_outputs[0].outputs[0].token_ids
    stop_id = full[2]
    first = full.index(stop_id)
    out = tiny_llm.generate(PROMPTS[0], SamplingParams(temperature=0.0, max_tokens=first + 1, ignore_eos=True,
                                                       stop_token_ids=[stop_id]), use_tqdm=False)[0].outputs[0]
    assert out.token_ids == full[: first + 1] and (out.finish_reason, out.stop_reason) == ("stop", stop_id)


def decoded_prefixes(llm: LLM, token_ids: list[int]) -> list[str]:
    """The text of the first i tokens, for every i: what the output processor has after i tokens."""
    tokenizer = llm.llm_engine.tokenizer
    return [tokenizer.decode(token_ids[:i], skip_special_tokens=True, clean_up_tokenization_spaces=False)
            for i in range(len(token_ids) + 1)]


def test_a_stop_string_completed_by_the_min_tokens_th_token_stops_there(tiny_llm, greedy_outputs):
    """min_tokens holds stops back until that many tokens exist, and not one token longer."""
    full = greedy_outputs[0].outputs[0]
    texts = decoded_prefixes(tiny_llm, full.token_ids)
    # A 3-character stop string that the m-th token completes, found nowhere else in the output.
    m, stop = next((m, texts[m][-3:]) for m in range(4, len(texts)) if len(texts[m]) > len(texts[m - 1]) >= 3
                   and full.text.count(texts[m][-3:]) == 1 and texts[m].endswith(texts[m][-3:]))
    out = tiny_llm.generate(PROMPTS[0], SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, min_tokens=m,
                                                       stop=stop), use_tqdm=False)[0].outputs[0]
    assert (out.token_ids, out.text, out.stop_reason) == (full.token_ids[:m], texts[m][:-3], stop)


def test_of_two_stop_strings_completed_by_one_token_the_earlier_in_the_text_wins(tiny_llm, greedy_outputs):
    """Both end in the same step's new characters; the text is cut at the one that starts first,
    whatever their order in `stop`."""
    candidates = []
    for prompt, output in zip(PROMPTS, greedy_outputs):
        texts = decoded_prefixes(tiny_llm, output.outputs[0].token_ids)
        for i in range(2, len(texts)):
            before, text = texts[i - 1], texts[i]
            if not before or len(text) - len(before) < 2:
                continue
            # Token i brings 2 or more characters: `late` is its text, `early` straddles its start.
            early, late = before[-1] + text[len(before)], text[len(before):]
            if text.find(early) == len(before) - 1 and text.find(late) == len(before):
                candidates.append((prompt, before, early, late))
    prompt, before, early, late = candidates[0]
    out = tiny_llm.generate(prompt, SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True,
                                                   stop=[late, early]), use_tqdm=False)[0].outputs[0]
    assert (out.text, out.stop_reason) == (before[:-1], early)


def test_eos_stops_unless_ignored(hf_checkpoint, tmp_path):
    _, path = hf_checkpoint("llama_mha")
    shutil.copytree(path, tmp_path / "m")
    prompt = {"prompt_token_ids": [3, 1, 4, 1, 5]}
    free = LLM(str(tmp_path / "m"), skip_tokenizer_init=True).generate(
        prompt, SamplingParams(temperature=0, max_tokens=10), use_tqdm=False)[0].outputs[0].token_ids
    eos = free[3]
    (tmp_path / "m" / "generation_config.json").write_text(json.dumps({"eos_token_id": [eos, 99999]}))
    llm = LLM(str(tmp_path / "m"), skip_tokenizer_init=True)
    stopped = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=10), use_tqdm=False)[0].outputs[0]
    assert stopped.token_ids == free[: free.index(eos) + 1] and stopped.finish_reason == "stop"
    # End of sequence as the last token max_tokens allows: still a stop, not the length.
    last = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=free.index(eos) + 1), use_tqdm=False)
    assert (last[0].outputs[0].token_ids, last[0].outputs[0].finish_reason) == (stopped.token_ids, "stop")
    ignored = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=10, ignore_eos=True), use_tqdm=False)
    assert ignored[0].outputs[0].token_ids == free


def test_logprobs_hold_the_sampled_token_and_the_top_n(tiny_llm):
    out = tiny_llm.generate(PROMPTS[0], SamplingParams(temperature=0.8, seed=3, max_tokens=8, logprobs=3),
                            use_tqdm=False)[0].outputs[0]
    assert len(out.logprobs) == len(out.token_ids)
    for token, entry in zip(out.token_ids, out.logprobs):
        assert token in entry and 3 <= len(entry) <= 4
        assert sorted(lp.rank for lp in entry.values())[:3] == [1, 2, 3]
        assert all(lp.logprob <= 0 and lp.decoded_token is not None for lp in entry.values())
    assert out.cumulative_logprob == pytest.approx(sum(e[t].logprob for t, e in zip(out.token_ids, out.logprobs)))


def test_a_seeded_request_is_independent_of_its_batch(tiny_llm):
    seeded = SamplingParams(temperature=1.0, top_p=0.9, seed=42, max_tokens=16)
    alone = tiny_llm.generate(PROMPTS[0], seeded, use_tqdm=False)[0].outputs[0].token_ids
    companions = [SamplingParams(temperature=1.0, max_tokens=3), seeded,
                  SamplingParams(temperature=0.7, seed=1, max_tokens=30)]
    with_others = tiny_llm.generate([PROMPTS[2], PROMPTS[0], PROMPTS[1]], companions, use_tqdm=False)
    assert with_others[1].outputs[0].token_ids == alone
    unseeded = {tuple(tiny_llm.generate(PROMPTS[0], SamplingParams(temperature=1.0, max_tokens=16),
                                        use_tqdm=False)[0].outputs[0].token_ids) for _ in range(3)}
    assert len(unseeded) > 1, "sampling without a seed should vary between calls"


def test_metrics_are_ordered(tiny_llm):
    m = tiny_llm.generate(PROMPTS[0], GREEDY, use_tqdm=False)[0].metrics
    assert m.arrival_time <= m.first_scheduled_time <= m.first_token_time <= m.last_token_time <= m.finished_time
    assert m.time_in_queue >= 0


def test_stream_yields_the_same_text_and_never_leaks_a_stop_string(tiny_llm, greedy_outputs):
    pieces = list(tiny_llm.stream(PROMPTS[2], GREEDY))
    assert len(pieces) > 3 and "".join(pieces) == greedy_outputs[2].outputs[0].text
    full = greedy_outputs[2].outputs[0].text
    stop = full[10:14]
    params = SamplingParams(temperature=0.0, max_tokens=24, stop=stop)
    streamed = ""
    for piece in tiny_llm.stream(PROMPTS[2], params):
        streamed += piece
        assert stop not in streamed
    assert streamed == full[: full.index(stop)]
    assert_engine_idle(tiny_llm)


def feed(processor: OutputProcessor, text: str, params: SamplingParams) -> tuple[Sequence, list[str]]:
    """text's tokens handed to the output processor one step at a time, as a model would produce them;
    returns the sequence and the text of each step's output."""
    token_ids = processor.tokenizer.encode(text, add_special_tokens=False)
    seq = Sequence("r", prompt_token_ids=[1], params=dataclasses.replace(params, max_tokens=len(token_ids)))
    texts = []
    for token in token_ids:
        texts += [out.outputs[0].text for out in processor.process_outputs([seq], ModelRunnerOutput([[token]]))]
    return seq, texts


def test_streamed_text_never_shows_half_a_character(tiny_llm):
    """A byte-level tokenizer spells é and 🙂 over several tokens, the first ones decoding to U+FFFD:
    the text waits for the character's last byte instead."""
    processor = OutputProcessor(tiny_llm.llm_engine.tokenizer)
    text = "caf\u00e9 \U0001F642 ok"
    seq, texts = feed(processor, text, SamplingParams(output_kind=RequestOutputKind.CUMULATIVE))
    assert texts[-1] == text and seq.finish_reason == "length"
    assert all(text.startswith(t) for t in texts), texts


def test_streamed_text_holds_back_only_what_could_still_begin_a_stop_string(tiny_llm):
    """With stop strings of at most L characters, the last L - 1 characters could be the start of
    one: those, and no more, wait for the next step."""
    processor = OutputProcessor(tiny_llm.llm_engine.tokenizer)
    text = "def fib(n): return n if n < 2 else fib(n - 1) + fib(n - 2)"
    seq, texts = feed(processor, text, SamplingParams(stop=["~~~", "@"], output_kind=RequestOutputKind.CUMULATIVE))
    assert texts[-1] == text
    decoded = decoded_prefixes(tiny_llm, seq.output_token_ids)[1:]
    assert texts[:-1] == [t[:max(0, len(t) - 2)] for t in decoded[:-1]]


def test_a_final_only_request_has_one_output_when_it_finishes(tiny_llm):
    """What LLM.generate asks for: no output for the steps before, unlike a streamed request."""
    engine = tiny_llm.llm_engine
    engine.add_request("final", PROMPTS[0], SamplingParams(temperature=0, max_tokens=5,
                                                             output_kind=RequestOutputKind.FINAL_ONLY))
    engine.add_request("streamed", PROMPTS[0], SamplingParams(temperature=0, max_tokens=5))
    outputs = []
    while engine.has_unfinished_requests():
        outputs += [(out.request_id, out.finished) for out in engine.step()]
    assert [o for o in outputs if o[0] == "final"] == [("final", True)]
    assert [o for o in outputs if o[0] == "streamed"] == [("streamed", False)] * 4 + [("streamed", True)]
    assert_engine_idle(tiny_llm)


def test_a_stream_abandoned_midway_is_aborted(tiny_llm):
    stream = tiny_llm.stream(PROMPTS[0], SamplingParams(max_tokens=50))
    next(stream)
    stream.close()
    assert_engine_idle(tiny_llm)


def test_abort_frees_the_cache_and_leaves_others_unchanged(tiny_llm, greedy_outputs):
    engine = tiny_llm.llm_engine
    engine.add_request("keep", PROMPTS[1], GREEDY)
    engine.add_request("drop", PROMPTS[2], GREEDY)
    outputs = []
    for step in range(30):
        if step == 3:
            keep = engine.scheduler.find("keep")
            engine.abort_request("drop")
            blocks = engine.block_manager
            assert blocks.num_free_blocks == blocks.num_blocks - len(keep.block_table)
        outputs += [o for o in engine.step() if o.finished]
        if not engine.has_unfinished_requests():
            break
    assert [o.request_id for o in outputs] == ["keep"]
    assert outputs[0].outputs[0].token_ids == greedy_outputs[1].outputs[0].token_ids
    assert_engine_idle(tiny_llm)


@pytest.mark.parametrize("prompt, message", [
    ("", "prompt must not be empty"),
    ({"prompt_token_ids": []}, "prompt must not be empty"),
    ({"prompt_token_ids": [1] * 2048}, "prompt has 2048 tokens, but max_model_len is 2048"),
    ({"prompt_token_ids": [1, 99999]}, r"prompt_token_ids must be in \[0, 4096\), got 99999"),
    ({"prompt_token_ids": "abc"}, "prompt_token_ids must be a list of ints"),
    (42, "prompt must be a string"),
])
def test_bad_prompts_are_refused_and_the_engine_keeps_serving(tiny_llm, greedy_outputs, prompt, message):
    with pytest.raises(ValueError, match=message):
        tiny_llm.generate([PROMPTS[0], prompt], GREEDY, use_tqdm=False)
    assert_engine_idle(tiny_llm)  # the valid prompt of the rejected call was not queued either
    again = tiny_llm.generate(PROMPTS[0], GREEDY, use_tqdm=False)[0]
    assert again.outputs[0].token_ids == greedy_outputs[0].outputs[0].token_ids


def test_parameters_changed_after_construction_are_refused_before_anything_is_queued(tiny_llm, greedy_outputs):
    bad = SamplingParams(max_tokens=4)
    bad.temperature = math.nan  # past __post_init__'s checks
    with pytest.raises(ValueError, match="temperature must be finite"):
        tiny_llm.generate(PROMPTS[:2], [GREEDY, bad], use_tqdm=False)
    assert_engine_idle(tiny_llm)  # the first prompt, whose parameters were good, was not queued either
    again = tiny_llm.generate(PROMPTS[0], GREEDY, use_tqdm=False)[0]
    assert again.outputs[0].token_ids == greedy_outputs[0].outputs[0].token_ids


@pytest.mark.parametrize("prompts, params, message", [
    (5, None, "prompts must be a prompt or a list of them, got int"),
    (None, None, "prompts must be a prompt or a list of them, got NoneType"),
    ("hi", {"temperature": 0}, "sampling_params must be SamplingParams or a list of them, got dict"),
])
def test_arguments_of_the_wrong_type_name_themselves(tiny_llm, prompts, params, message):
    with pytest.raises(TypeError, match=message):
        tiny_llm.generate(prompts, params, use_tqdm=False)


def test_a_prompt_with_a_lone_surrogate_is_refused(tiny_llm):
    with pytest.raises(ValueError, match="prompt must be valid Unicode text: it holds a lone surrogate at 0"):
        tiny_llm.generate("\ud800abc", GREEDY, use_tqdm=False)
    assert_engine_idle(tiny_llm)


def test_bad_engine_arguments_name_the_argument():
    with pytest.raises(ValueError, match="kv_cache must be one of"):
        LLM("tiny", kv_cache="paged-ish")
    with pytest.raises(ValueError, match="max_num_seqs must be an integer >= 1"):
        LLM("tiny", max_num_seqs=0)
    with pytest.raises(ValueError, match=r"max_model_len must be an integer in \[2, 2048\]"):
        LLM("tiny", max_model_len=4096)
    with pytest.raises(ValueError, match="dtype must be 'auto'"):
        LLM("tiny", dtype="float8")
    with pytest.raises(ValueError, match=r"scheduling_policy must be one of \('fcfs',\) .*got 'priority'"):
        LLM("tiny", scheduling_policy="priority")
    with pytest.raises(ValueError, match="sampling_params must be one SamplingParams or one per prompt"):
        LLM("tiny").generate(PROMPTS, [GREEDY], use_tqdm=False)
    with pytest.raises(ValueError, match=r"seed must be an integer in \[-9223372036854775808, 18446744073709551615\]"):
        LLM("tiny", seed=2**70)  # refused before the model loads, not by torch.Generator after


def test_max_model_len_caps_generation(tiny_llm):
    llm = LLM("tiny", max_model_len=16)
    out = llm.generate(PROMPTS[0], SamplingParams(max_tokens=100, ignore_eos=True), use_tqdm=False)[0]
    assert out.outputs[0].finish_reason == "length"
    assert len(out.prompt_token_ids) + len(out.outputs[0].token_ids) == 16


def test_generate_reports_a_request_aborted_from_outside(tiny_llm):
    engine = tiny_llm.llm_engine
    engine.step_listeners.append(lambda event: engine.abort_request(event.seqs[0].request_id))
    try:
        with pytest.raises(RuntimeError, match=r"requests \['\d+'\] were aborted"):
            tiny_llm.generate(PROMPTS[0], GREEDY, use_tqdm=False)
    finally:
        engine.step_listeners.clear()
    assert_engine_idle(tiny_llm)


def test_a_scheduling_policy_of_ones_own_schedules_the_engine_and_changes_no_token(greedy_outputs):
    budgets = []

    def small_budget(scheduler) -> int:
        budgets.append(scheduler.max_num_batched_tokens)
        return 5  # prompts prefilled in chunks of a few tokens, beside the decodes

    policy = SchedulingPolicy(token_budget=small_budget)
    llm = LLM("tiny", scheduling_policy=policy)
    assert llm.llm_engine.scheduler.policy is policy
    outputs = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outputs] == [o.outputs[0].token_ids for o in greedy_outputs]
    assert len(budgets) == llm.llm_engine.num_steps > 24  # asked once a step, and steps were small
    assert_engine_idle(llm)


def test_each_step_hands_its_tokens_to_the_output_processor_once_and_then_to_the_scheduler(tiny_llm, monkeypatch):
    engine = tiny_llm.llm_engine
    calls = []
    for owner, name in ((engine.output_processor, "process_outputs"), (engine.scheduler, "update")):
        method = getattr(owner, name)
        monkeypatch.setattr(owner, name, lambda *args, method=method, name=name: calls.append(name) or method(*args))
    steps = engine.num_steps
    tiny_llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    assert calls == ["process_outputs", "update"] * (engine.num_steps - steps) and calls


def test_the_engine_step_reads_in_twelve_lines_at_most():
    step = ast.parse(textwrap.dedent(inspect.getsource(LLMEngine.step))).body[0]
    body = step.body[1:] if ast.get_docstring(step) else step.body
    assert body[-1].end_lineno - body[0].lineno + 1 <= 12
