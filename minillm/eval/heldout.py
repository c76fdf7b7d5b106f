"""Evaluation text as token ids: the tiny models' held-out modules, or any text file."""

from __future__ import annotations

from pathlib import Path

from minillm.eval.corpus import read_texts, stdlib_files


def eval_token_ids(tokenizer, text_file: str | Path | None = None) -> list[int]:
    """Each text followed by end-of-text, exactly as the training script builds its streams."""
    if text_file is not None:
        texts = [Path(text_file).read_text(encoding="utf-8", errors="replace")]
    else:
        texts = read_texts(stdlib_files("heldout"))
    ids: list[int] = []
    for encoded in tokenizer(texts, add_special_tokens=False, verbose=False)["input_ids"]:
        ids += encoded
        if tokenizer.eos_token_id is not None:
            ids.append(tokenizer.eos_token_id)
    return ids
