"""The text the output processor builds as tokens arrive, through the fast tokenizer's Rust decode
where transformers' own would add nothing: the same text, character for character, as transformers
decodes, streamed or whole, with special tokens kept or skipped, multi-token characters included."""

from __future__ import annotations

import copy

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minillm.engine.output_processor import OutputProcessor, rust_decode
from minillm.engine.runner_output import ModelRunnerOutput
from minillm.models.loader import load_tokenizer, resolve_model_path
from minillm.sampling_params import RequestOutputKind, SamplingParams
from minillm.sequence import Sequence

TEXT = "Ünïcödé, emoji 🙂🚀 and code:\ndef f(x):\n    return x  # done"


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(resolve_model_path("tiny"))


def streamed(processor: OutputProcessor, tokens: list[int], prompt: list[int], skip: bool) -> list[str]:
    """The sequence's text after each token, as a streamed request's outputs carry it."""
    seq = Sequence("r", prompt_token_ids=prompt, params=SamplingParams(
        max_tokens=len(tokens), ignore_eos=True, skip_special_tokens=skip, output_kind=RequestOutputKind.CUMULATIVE))
    texts = []
    for token in tokens:
        processor.process_outputs([seq], ModelRunnerOutput([[token]]))
        texts.append(seq.output_text)
    return texts


@pytest.mark.parametrize("skip", [True, False])
def test_streamed_text_is_transformers_text_step_by_step(tokenizer, skip):
    ids = tokenizer(TEXT, add_special_tokens=False)["input_ids"]
    # A character split over several tokens, and special tokens among the others.
    assert any("\ufffd" in tokenizer.decode([i]) for i in ids)
    special = tokenizer.all_special_ids[0]
    tokens = ids[:9] + [special] + ids[9:] + [special]
    fast = OutputProcessor(tokenizer)
    plain = OutputProcessor(tokenizer)
    plain._decode = None  # transformers' decode, as for a tokenizer without a plain Rust one
    assert fast._decode is not None
    texts = streamed(fast, tokens, ids[:5], skip)
    assert texts == streamed(plain, tokens, ids[:5], skip)
    whole = tokenizer.decode(tokens, skip_special_tokens=skip, clean_up_tokenization_spaces=False)
    assert texts[-1] == whole and (tokenizer.decode([special]) in whole) != skip


def test_only_a_fast_tokenizer_that_decodes_as_its_backend_gets_the_rust_decode(tokenizer):
    assert rust_decode(tokenizer) == tokenizer.backend_tokenizer.decode
    assert rust_decode(None) is None

    class OwnDecoding(type(tokenizer)):
        def _decode(self, token_ids, **kwargs) -> str:
            return "its own"

    own = copy.copy(tokenizer)
    own.__class__ = OwnDecoding
    assert rust_decode(own) is None
    assert OutputProcessor(own).decode([1, 2], Sequence("r")) == "its own"


def test_a_run_of_skipped_special_tokens_keeps_the_window_short(tokenizer):
    """Each step decodes the window twice: were it to keep every token that added no text, a run of
    special tokens would make each step's decode longer than the last."""
    ids = tokenizer("a run of padding, then text", add_special_tokens=False)["input_ids"]
    tokens = ids[:3] + [tokenizer.all_special_ids[0]] * 50 + ids[3:]
    seq = Sequence("r", prompt_token_ids=ids[:2], params=SamplingParams(
        max_tokens=len(tokens), ignore_eos=True, skip_special_tokens=True, output_kind=RequestOutputKind.CUMULATIVE))
    processor, widest = OutputProcessor(tokenizer), 0
    for token in tokens:
        processor.process_outputs([seq], ModelRunnerOutput([[token]]))
        widest = max(widest, len(seq.token_ids) - seq.prefix_offset)
    assert seq.output_text == tokenizer.decode(tokens, skip_special_tokens=True, clean_up_tokenization_spaces=False)
    assert widest <= 3


# Text that byte-level BPE splits in awkward places: accents, emoji, CJK, code, runs of spaces.
ALPHABET = st.sampled_from(list("ab e.\n\t(){}:=#") + ["é", "ü", "🙂", "🚀", "中", "文", "  ", "def ", "x1"])


@settings(max_examples=200, deadline=None, derandomize=True)
@given(pieces=st.lists(ALPHABET, min_size=1, max_size=30), specials=st.lists(st.integers(0, 40), max_size=3),
       stops=st.lists(st.tuples(st.integers(0, 60), st.integers(1, 4)), min_size=1, max_size=3),
       include=st.booleans(), streamed_kind=st.booleans())
def test_stop_strings_cut_the_text_where_the_first_completed_one_begins(tokenizer, pieces, specials, stops, include,
                                                                        streamed_kind):
    """Whatever the tokens and stop strings: the request stops at the first token whose text completes
    one, its text cut before the leftmost occurrence (after it with include_stop_str_in_output), and
    a stream never showed text past that cut. Stop strings are drawn from the text itself, so they
    occur, across token boundaries too."""
    tokens = tokenizer("".join(pieces), add_special_tokens=False)["input_ids"]
    for position in specials:  # special tokens, skipped in the text, in among the others
        tokens.insert(position % (len(tokens) + 1), tokenizer.all_special_ids[0])
    whole = [tokenizer.decode(tokens[:m], skip_special_tokens=True, clean_up_tokenization_spaces=False)
             for m in range(len(tokens) + 1)]
    strings = sorted({whole[-1][start % max(1, len(whole[-1])):][:length] or "x" for start, length in stops})
    strings = [s for s in strings if "\ufffd" not in s] or ["x"]  # a character not yet whole is never matched
    kind = RequestOutputKind.CUMULATIVE if streamed_kind else RequestOutputKind.FINAL_ONLY
    seq = Sequence("r", prompt_token_ids=tokenizer("Q:", add_special_tokens=False)["input_ids"], params=SamplingParams(
        max_tokens=len(tokens), ignore_eos=True, stop=strings, include_stop_str_in_output=include, output_kind=kind))
    processor, shown = OutputProcessor(tokenizer), []
    for token in tokens:
        shown += [out.outputs[0].text for out in processor.process_outputs([seq], ModelRunnerOutput([[token]]))]
        if seq.finish_reason is not None:
            break
    # Expected: the first prefix of the tokens whose text holds a stop string, cut at the leftmost one.
    stop_at = next((m for m in range(len(tokens) + 1) if any(s in whole[m] for s in strings)), None)
    if stop_at is None:
        assert (seq.finish_reason, seq.output_text) == ("length", whole[-1])
    else:
        index, stop = min((whole[stop_at].find(s), s) for s in strings if s in whole[stop_at])
        assert (seq.finish_reason, seq.stop_reason, seq.num_output_tokens) == ("stop", stop, stop_at)
        assert seq.output_text == whole[stop_at][:index + len(stop) if include else index]
    assert all(seq.output_text.startswith(s) for s in shown), shown
