"""DraftAcceptance: the drafts x steps grid and the tokens-per-call lines drawn from a hand-made trace
(every square where the events put it, every number worked out by hand), and live on a real engine
once it speculates. Also run with Colab's widget versions (tests/course/test_widgets_colab.py)."""

from __future__ import annotations

from collections.abc import Iterator

import plotly.graph_objects as go
import pytest

from minillm import LLM, SamplingParams
from minillm.engine.trace import SeqState, StepEvent, Trace, TraceInfo
from minillm.spec_decode.acceptance import expected_tokens_per_call
from minillm.widgets import DraftAcceptance, acceptance_stats, draft_acceptance_figure, request_color
from minillm.widgets.draft_acceptance import (
    ACCEPTED_COLOR,
    FORMULA_NAME,
    REJECTED_COLOR,
    UNJUDGED_COLOR,
)

K = 3
INFO = TraceInfo(model="tiny", device="cpu", dtype="float32", kv_cache="paged", kv_bytes_per_token=100,
                 device_memory_bytes=10**9, max_model_len=64, max_num_seqs=4, block_size=4, num_kv_blocks=12,
                 speculative_method="draft_model", num_speculative_tokens=K)
NO_SPEC = TraceInfo(**{**vars(INFO), "speculative_method": None, "num_speculative_tokens": 0})
PITCH = K + 2  # rows per request band: k drafts, the bonus token, a gap


def seq(request_id: str, drafts: tuple[int, ...] = (), accepted: int = 0, target: int | None = None, *,
        prefill: int = 0, finish: str | None = None) -> SeqState:
    return SeqState(request_id, prefill_tokens=prefill, decode_tokens=0 if prefill else 1, kv_tokens=0,
                    kv_reserved_tokens=0, finish_reason=finish, spec_token_ids=drafts, num_accepted_tokens=accepted,
                    target_token_id=target)


def hand_trace() -> Trace:
    # Step 0 prefills both (no drafts). "0": all accepted (bonus 14), then none (50 recovered), and
    # finishes. "1": one accepted (99 recovered), two (77), all three (bonus 30). "2" never speculates.
    return Trace(INFO, [
        StepEvent(0, (seq("0", prefill=5), seq("1", prefill=6)), 1),
        StepEvent(1, (seq("0", (11, 12, 13), 3, 14), seq("1", (21, 22, 23), 1, 99)), 1),
        StepEvent(2, (seq("0", (15, 16, 17), 0, 50, finish="length"), seq("1", (24, 25, 26), 2, 77)), 1),
        StepEvent(3, (seq("1", (27, 28, 29), 3, 30), seq("2", prefill=4)), 0),
    ])


def marks(fig: go.Figure) -> dict[str, list[tuple[int, int]]]:
    """legend name -> (step, row) of each marker in the grid."""
    return {t.name: list(zip(t.x, t.y)) for t in fig.data if t.xaxis == "x"}


def running(fig: go.Figure) -> dict[str, tuple[list, list]]:
    """legend name -> (steps, values) of each line in the tokens-per-call panel."""
    return {t.name: (list(t.x), list(t.y)) for t in fig.data if t.xaxis == "x2"}


def test_stats_are_counted_by_hand() -> None:
    stats = acceptance_stats(hand_trace())
    # judged: 3 (all accepted) + 2 (one, then a rejection) + 1 + 3 + 3 = 12 of 15 proposed.
    assert stats == {"drafts": 5, "draft_tokens": 15, "accepted_tokens": 9, "judged_tokens": 12, "alpha": 0.75,
                     "acceptance_rate": 0.6, "tokens_per_target_call": 2.8,
                     "expected_tokens_per_target_call": pytest.approx(2.734375), "accepted_per_position": [4, 3, 2],
                     "judged_per_position": [5, 4, 3], "proposal_lengths": {3: 5}}
    early = acceptance_stats(hand_trace(), step=1)
    assert (early["drafts"], early["accepted_tokens"], early["judged_tokens"], early["alpha"]) == (2, 4, 5, 0.8)
    nothing = acceptance_stats(hand_trace(), step=0)
    assert nothing["alpha"] is None and nothing["tokens_per_target_call"] is None
    assert nothing["accepted_per_position"] == [0, 0, 0]


def test_formula_is_leviathans() -> None:
    assert expected_tokens_per_call(0, 4) == 1  # nothing accepted: the target's own token only
    assert expected_tokens_per_call(1, 4) == 5  # everything: k drafts and the bonus
    assert expected_tokens_per_call(0.5, 2) == pytest.approx(1 + 0.5 + 0.25)


def test_squares_and_target_tokens_sit_where_the_trace_puts_them() -> None:
    fig = draft_acceptance_figure(hand_trace())
    got = marks(fig)
    b = PITCH  # request "1"'s band starts here; "0"'s at row 0; "2" never speculated and has none
    assert got["accepted"] == [(1, 0), (1, 1), (1, 2), (1, b), (2, b), (2, b + 1), (3, b), (3, b + 1), (3, b + 2)]
    assert got["rejected"] == [(1, b + 1), (2, 0), (2, b + 2)]
    assert got["not judged"] == [(1, b + 2), (2, 1), (2, 2)]
    # On the rejected square (the token recovered there), or below a proposal accepted whole (the bonus).
    assert got["target's token"] == [(1, 3), (1, b + 1), (2, 0), (2, b + 2), (3, b + 3)]
    colors = {t.name: t.marker.color for t in fig.data if t.xaxis == "x"}
    assert (colors["accepted"], colors["rejected"], colors["not judged"]) == (
        ACCEPTED_COLOR, REJECTED_COLOR, UNJUDGED_COLOR)
    hover = {t.name: t.hovertext for t in fig.data if t.xaxis == "x"}
    assert hover["rejected"][0] == ("request 1 · step 1<br>draft position 2 of 3: token 22<br>rejected: the target "
                                    "disagrees, and puts its own token here")
    assert "not judged" in hover["not judged"][0] and "token 23" in hover["not judged"][0]
    assert hover["target's token"][0] == "request 0 · step 1<br>target's token 14<br>bonus: all 3 drafts accepted"
    assert "target's token 99<br>recovered in place of rejected draft 2" in hover["target's token"][1]
    yaxis = fig.layout.yaxis
    assert list(yaxis.tickvals) == [K / 2, PITCH + K / 2]
    assert list(yaxis.ticktext) == [f'<span style="color:{request_color(r)}">request {r}</span>' for r in "01"]


def test_running_line_and_formula_line() -> None:
    lines = running(draft_acceptance_figure(hand_trace()))
    steps, measured = lines["tokens per target call"]
    assert steps == [0, 1, 2, 3]
    # (accepted + 1 per proposal) / proposals so far: 6/2, 10/4, 14/5; nothing before the first draft.
    assert measured == [None, 3.0, 2.5, 2.8]
    _, formula = lines[FORMULA_NAME]
    alphas = [None, 4 / 5, 6 / 9, 9 / 12]  # accepted / judged so far
    assert formula == [None, *(pytest.approx(expected_tokens_per_call(a, K)) for a in alphas[1:])]
    assert formula[1] == pytest.approx(2.952)


def test_title_gives_k_alpha_and_tokens_per_call() -> None:
    title = draft_acceptance_figure(hand_trace()).layout.title.text
    assert title.startswith("Draft acceptance · draft_model, k=3")
    assert ("after step 3: α so far 0.75 (9 accepted of 12 judged) · 2.80 tokens per target call, formula 2.73 · "
            "vLLM's acceptance rate 60%") in title


def test_scrubbing_keeps_the_frame_and_is_deterministic() -> None:
    whole, early = draft_acceptance_figure(hand_trace()), draft_acceptance_figure(hand_trace(), step=1)
    assert {name: {x for x, _ in m} for name, m in marks(early).items()} == {
        "accepted": {1}, "rejected": {1}, "not judged": {1}, "target's token": {1}}
    assert running(early)["tokens per target call"] == ([0, 1], [None, 3.0])
    assert "after step 1: α so far 0.80" in early.layout.title.text
    for axis in ("xaxis", "yaxis", "xaxis2", "yaxis2"):
        assert early.layout[axis].range == whole.layout[axis].range
    assert early.layout.height == whole.layout.height
    assert [t.name for t in early.data] == [t.name for t in whole.data]  # so a live redraw restyles in place
    first = draft_acceptance_figure(hand_trace(), step=0)
    assert all(not m for m in marks(first).values()) and "after step 0: no drafts yet" in first.layout.title.text
    assert whole.to_json() == draft_acceptance_figure(hand_trace()).to_json()


def test_empty_and_non_speculating_traces_give_a_notice() -> None:
    cases = {"no steps yet": Trace(INFO, []),
             "no drafts yet": Trace(INFO, hand_trace().events[:1]),
             "does not speculate (speculative_method=None): pass speculative_config": Trace(NO_SPEC, [])}
    for notice, trace in cases.items():
        fig = draft_acceptance_figure(trace)
        assert not fig.data and notice in fig.layout.title.text
    assert acceptance_stats(Trace(NO_SPEC, []))["drafts"] == 0


def test_view_of_a_recorded_trace() -> None:
    view = DraftAcceptance(hand_trace())
    assert repr(view) == "DraftAcceptance(k=3, steps=4, alpha=0.75)"
    assert repr(DraftAcceptance(Trace(INFO, []))) == "DraftAcceptance(k=3, steps=0, alpha=None)"
    assert (view.step_slider.min, view.step_slider.max, view.step_slider.value) == (0, 3, 3)
    view.step_slider.value = 1
    assert {x for x, _ in marks(go.Figure(view.plot))["accepted"]} == {1}
    assert marks(view.figure()) == marks(draft_acceptance_figure(hand_trace()))


def test_needs_an_engine_that_speculates(tiny_llm: LLM) -> None:
    with pytest.raises(ValueError, match="does not speculate .*pass speculative_config"):
        DraftAcceptance(Trace(NO_SPEC, []))
    with pytest.raises(ValueError, match="pass speculative_config"):
        DraftAcceptance(tiny_llm)
    assert not tiny_llm.llm_engine.step_listeners  # refused before it started following


# ---- live, on an engine that speculates ----

SPECULATIVE_CONFIGS = {"draft_model": {"model": "tiny-draft", "num_speculative_tokens": 4},
                       "ngram": {"method": "ngram", "num_speculative_tokens": 4}}


@pytest.fixture(scope="module", params=sorted(SPECULATIVE_CONFIGS))
def speculative_llm(request: pytest.FixtureRequest) -> Iterator[LLM]:
    """The shipped model speculating each way; skips while the engine does not take speculative_config
    (it then raises TypeError: unexpected engine argument), so these tests start running once it does."""
    try:
        llm = LLM("tiny", speculative_config=SPECULATIVE_CONFIGS[request.param])
    except TypeError as e:
        if "unexpected engine argument" not in str(e):
            raise
        pytest.skip("the engine does not take speculative_config yet")
    yield llm


def test_live_on_a_speculating_engine(speculative_llm: LLM) -> None:
    # Repetitive prompts, so that the ngram proposer finds earlier occurrences to copy.
    prompts = ["def f(x):\n    return x\n\ndef g(x):\n    return x\n\ndef h(x):\n", "a b c a b c a b c a b"]
    with DraftAcceptance(speculative_llm, min_interval=0) as view:
        speculative_llm.generate(prompts, SamplingParams(max_tokens=24, temperature=0, ignore_eos=True),
                                 use_tqdm=False)
    info, trace = view.trace.info, view.trace
    assert not view.attached and info.num_speculative_tokens == 4 and info.speculative_method is not None
    drafted = [s for e in trace.events for s in e.seqs if s.spec_token_ids]
    assert drafted, "the engine speculated in no step"
    assert all(0 <= s.num_accepted_tokens <= len(s.spec_token_ids) <= 4 for s in drafted)
    stats = acceptance_stats(trace)
    fig = view.figure()
    got = marks(fig)
    assert sum(len(got[n]) for n in ("accepted", "rejected", "not judged")) == stats["draft_tokens"]
    assert len(got["accepted"]) == stats["accepted_tokens"]
    assert len(got["target's token"]) == sum(s.target_token_id is not None for s in drafted)
    assert running(fig)["tokens per target call"][1][-1] == pytest.approx(stats["tokens_per_target_call"])
    assert repr(view) == f"DraftAcceptance(k=4, steps={len(trace.events)}, alpha={stats['alpha']:.2f})"
