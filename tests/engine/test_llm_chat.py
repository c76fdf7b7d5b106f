"""LLM.chat: conversations rendered by the chat template (the tokenizer's, or one given) and generated,
as vLLM's LLM.chat does; what the template or the messages get wrong is a ValueError that says so."""

from __future__ import annotations

import pytest

from minillm import LLM, SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=6)
STORY = [{"role": "user", "content": "Tell me a story."}]


@pytest.fixture(scope="module")
def llm() -> LLM:
    return LLM("tiny", dtype="float32")


def generated(llm: LLM, text: str, params: SamplingParams = GREEDY) -> list[int]:
    """The tokens generate gives for the rendered text, tokenized without special tokens of its own."""
    ids = llm.get_tokenizer()(text, add_special_tokens=False)["input_ids"]
    return llm.generate({"prompt_token_ids": ids}, params, use_tqdm=False)[0].outputs[0].token_ids


def test_a_conversation_is_its_rendered_template_generated(llm):
    rendered = llm.get_tokenizer().apply_chat_template(STORY, tokenize=False, add_generation_prompt=True)
    out = llm.chat(STORY, GREEDY, use_tqdm=False)
    assert len(out) == 1 and out[0].prompt == rendered
    assert out[0].outputs[0].token_ids == generated(llm, rendered)


def test_several_conversations_each_with_its_parameters(llm):
    hello = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}]
    params = [GREEDY, SamplingParams(temperature=0, max_tokens=3)]
    outs = llm.chat([STORY, hello], params, use_tqdm=False)
    assert [len(o.outputs[0].token_ids) for o in outs] == [6, 3]
    assert outs[1].prompt.startswith("# system: Be brief.")


def test_a_template_of_ones_own_and_a_continued_message(llm):
    template = "{% for m in messages %}<{{ m.role }}>{{ m.content }}\n{% endfor %}"
    out = llm.chat(STORY, GREEDY, chat_template=template, add_generation_prompt=False, use_tqdm=False)[0]
    assert out.prompt == "<user>Tell me a story.\n"
    begun = STORY + [{"role": "assistant", "content": "Once upon"}]
    out = llm.chat(begun, GREEDY, add_generation_prompt=False, continue_final_message=True, use_tqdm=False)[0]
    assert out.prompt.endswith("Once upon")
    assert out.outputs[0].token_ids == generated(llm, out.prompt)


@pytest.mark.parametrize(("messages", "kwargs", "message"), [
    ([], {}, "messages must be a conversation"),
    ([{"role": "user"}], {}, "messages must be dicts with a string role and string content"),
    ([[{"role": "user", "content": 3}]], {}, "messages must be dicts with a string role and string content"),
    (STORY, {"continue_final_message": True}, "add_generation_prompt and continue_final_message exclude each other"),
    (STORY, {"chat_template": "{{ raise_exception('roles must alternate') }}"},
     "messages: the chat template refused them: roles must alternate"),
])
def test_bad_conversations_are_refused_by_name_before_anything_is_queued(llm, messages, kwargs, message):
    with pytest.raises(ValueError, match=message):
        llm.chat(messages, GREEDY, use_tqdm=False, **kwargs)
    assert not llm.llm_engine.has_unfinished_requests()


def test_chat_needs_a_tokenizer():
    llm = LLM("tiny", skip_tokenizer_init=True)
    with pytest.raises(ValueError, match="chat needs a tokenizer"):
        llm.chat(STORY)
