"""A conversation made a prompt: the tokenizer's chat template (or another one) rendered, for
`LLM.chat` and the server's chat completions alike, as vLLM's chat_utils does for both."""

from __future__ import annotations

import jinja2

# What a chat template raises against the messages it renders: its own verdict (raise_exception:
# roles must alternate, ...), or what it cannot do with them (a TypeError: adding text to a list of
# content parts, ...).
REFUSALS = (jinja2.TemplateError, TypeError)


def apply_chat_template(tokenizer, conversation: list[dict], chat_template: str | None = None,
                        add_generation_prompt: bool = True, continue_final_message: bool = False) -> dict:
    """The prompt as {"prompt": text, "prompt_token_ids": ids}. The template writes any special tokens
    itself, so the tokenizer adds none. ValueError where there is no tokenizer or template, or where the
    template refuses the messages. continue_final_message: the last message (the assistant's, begun)
    is left open for the model to go on with, instead of a new one being opened."""
    if tokenizer is None:
        raise ValueError("chat needs a tokenizer; this engine was started with skip_tokenizer_init=True")
    if chat_template is None and not getattr(tokenizer, "chat_template", None):
        raise ValueError("this model's tokenizer has no chat template: pass chat_template (a Jinja template), "
                         "or give generate a prompt")
    if add_generation_prompt and continue_final_message:
        raise ValueError("add_generation_prompt and continue_final_message exclude each other: a new assistant "
                         "message or the last one continued; set one to False")
    try:
        text = tokenizer.apply_chat_template(conversation, chat_template=chat_template, tokenize=False,
                                             add_generation_prompt=add_generation_prompt,
                                             continue_final_message=continue_final_message)
    except REFUSALS as e:
        raise ValueError(f"messages: the chat template refused them: {e}") from None
    except ValueError as e:  # transformers' own checks (continue_final_message without a final message, ...)
        raise ValueError(f"messages: {e}") from None
    return {"prompt": text, "prompt_token_ids": tokenizer(text, add_special_tokens=False)["input_ids"]}
