"""The text the output processor builds as tokens arrive, through the fast tokenizer's Rust decode
where transformers' own would add nothing: the same text, character for character, as transformers
decodes, streamed or whole, with special tokens kept or skipped, multi-token characters included."""

from __future__ import annotations

import copy

import pytest

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
