"""After sampling: append each token, turn tokens into text, decide where a sequence stops, and
make the outputs the user sees; and, for prompt_logprobs, join the prompt tokens each prefill chunk
scored to their sequence.

The engine's step calls `process_outputs` once, right after the model ran: it is the one place
where a step's tokens join their sequences and stops are decided, whether a step produced one
token per sequence or, verifying drafts, several. The scheduler's `update` comes next and only
follows what was decided here: it advances the cache and frees the sequences that finished.

Text is produced incrementally. Decoding only the newest token is wrong for byte-level BPE: one
character can span several tokens (the first tokens of an emoji decode to U+FFFD), and some
tokenizers decide a token's leading space from its neighbour. So a short window of recent tokens
is decoded twice, with and without the newest ones, and only the difference is appended, once it
no longer ends in an incomplete character.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from minillm.engine.runner_output import ModelRunnerOutput
from minillm.outputs import CompletionOutput, Logprob, RequestOutput
from minillm.sample.sampler import SamplerOutput
from minillm.sampling_params import RequestOutputKind
from minillm.sequence import Sequence


class OutputProcessor:
    def __init__(self, tokenizer) -> None:
        """tokenizer: None judges stops on tokens alone (text needs a tokenizer)."""
        self.tokenizer = tokenizer
        self._decode = rust_decode(tokenizer)

    def process_outputs(self, seqs: list[Sequence], output: ModelRunnerOutput) -> list[RequestOutput]:
        """Each sequence of the step takes the tokens the model produced for it, one at a time until
        one stops it: tokens after a stop are never shown. Returns the outputs of the sequences that
        received tokens: the finished ones, and every streamed one."""
        outputs = []
        row = 0  # of the sequence's first token in output.sampler_output
        for seq, tokens, scored in zip(seqs, output.sampled_token_ids, output.prompt_logprobs):
            if scored is not None:
                seq.prompt_logprobs.extend(self._logprob_entry(scored, i, token, seq.params.prompt_logprobs)
                                           for i, token in enumerate(scored.token_ids))
            for i, token in enumerate(tokens):
                self._append_token(seq, token, output.sampler_output, row + i)
                if seq.finish_reason is not None:
                    break
            row += len(tokens)
            if tokens and (seq.finish_reason is not None or seq.params.output_kind is RequestOutputKind.CUMULATIVE):
                outputs.append(self.make_output(seq))
        return outputs

    def _append_token(self, seq: Sequence, token: int, sampled: SamplerOutput | None, row: int) -> None:
        """One generated token into seq: its logprobs, its text, and whether seq stops at it."""
        now = time.time()
        seq.token_ids.append(token)
        if seq.metrics.first_token_time is None:
            seq.metrics.first_token_time = now
        seq.metrics.last_token_time = now
        if seq.logprobs is not None:
            self._append_logprobs(seq, sampled, row, token)
        self._check_stop_token(seq, token)
        # A token that stops the request (EOS, stop_token_ids) stays in token_ids but adds no text,
        # as in vLLM and OpenAI's API, unless include_stop_str_in_output asks for it.
        shown = seq.finish_reason is None or seq.params.include_stop_str_in_output
        new_chars = self._detokenize(seq) if shown and self._tracks_text(seq) else 0
        if seq.finish_reason is None:
            self._check_stop_text(seq, new_chars)
        if seq.finish_reason is not None:
            seq.metrics.finished_time = now
            self._finalize_text(seq, len(seq.token_ids) if shown else len(seq.token_ids) - 1)

    def decode(self, token_ids: list[int], seq: Sequence) -> str:
        # No clean-up of "tokenization spaces": it rewrites " ." to "." and would corrupt code.
        if self._decode is not None:
            return self._decode(token_ids, skip_special_tokens=seq.params.skip_special_tokens)
        return self.tokenizer.decode(token_ids, skip_special_tokens=seq.params.skip_special_tokens,
                                     clean_up_tokenization_spaces=False)

    def _tracks_text(self, seq: Sequence) -> bool:
        """Incremental text is needed to find stop strings and to stream; otherwise the text is
        decoded once, when the request finishes."""
        return self.tokenizer is not None and (
            bool(seq.params.stop_strings) or seq.params.output_kind is RequestOutputKind.CUMULATIVE)

    def _finalize_text(self, seq: Sequence, end: int) -> None:
        """The whole text of a finished sequence: that of its tokens before `end`."""
        if self.tokenizer is None or isinstance(seq.stop_reason, str):
            return  # no text at all, or already cut at the stop string
        if not self._tracks_text(seq):
            seq.output_text = self.decode(seq.token_ids[seq.num_prompt_tokens:end], seq)
        else:  # whatever the incremental window still held back (a character never completed)
            seq.output_text += self.decode(seq.token_ids[seq.prefix_offset:end], seq)[
                len(self.decode(seq.token_ids[seq.prefix_offset:seq.read_offset], seq)):]

    def _detokenize(self, seq: Sequence) -> int:
        ids = seq.token_ids
        before = self.decode(ids[seq.prefix_offset:seq.read_offset], seq)
        after = self.decode(ids[seq.prefix_offset:], seq)
        if after.endswith("\ufffd") or len(after) < len(before):
            return 0  # wait for the rest of the character
        # Tokens that add no text (skipped special tokens) move the window on too, not widen it.
        seq.prefix_offset, seq.read_offset = seq.read_offset, len(ids)
        seq.output_text += after[len(before):]
        return len(after) - len(before)

    @staticmethod
    def _check_stop_token(seq: Sequence, token: int) -> None:
        """Stops on the token itself: EOS, or one of stop_token_ids (its stop_reason), once
        min_tokens tokens exist."""
        if seq.num_output_tokens >= seq.params.min_tokens:
            if token in seq.eos_token_ids:
                seq.finish_reason = "stop"
            elif token in seq.params.stop_token_ids:
                seq.finish_reason, seq.stop_reason = "stop", token

    def _check_stop_text(self, seq: Sequence, new_chars: int) -> None:
        """Stops on the text (a stop string completed by the new characters) or the length."""
        params = seq.params
        if (seq.num_output_tokens >= params.min_tokens and params.stop_strings
                and (stop := self._find_stop_string(seq, new_chars))):
            seq.finish_reason, seq.stop_reason = "stop", stop
        elif seq.num_tokens >= seq.max_len:
            seq.finish_reason = "length"

    @staticmethod
    def _find_stop_string(seq: Sequence, new_chars: int) -> str | None:
        """The stop string that occurs first among those completed by the new characters; the
        text is cut before it (or after it, with include_stop_str_in_output)."""
        text = seq.output_text
        found = []
        for stop in seq.params.stop_strings:
            index = text.find(stop, max(0, len(text) - new_chars - len(stop) + 1))
            if index != -1:
                found.append((index, stop))
        if not found:
            return None
        index, stop = min(found)
        seq.output_text = text[: index + len(stop) if seq.params.include_stop_str_in_output else index]
        return stop

    def _append_logprobs(self, seq: Sequence, sampled: SamplerOutput, row: int, token: int) -> None:
        seq.logprobs.append(self._logprob_entry(sampled, row, token, seq.params.logprobs))
        seq.cumulative_logprob += sampled.sampled_logprobs[row]

    def _logprob_entry(self, sampled: SamplerOutput, row: int, token: int, top_n: int) -> dict[int, Logprob]:
        """Row `row` of sampled as an entry: the token itself first, then the top_n most likely."""
        entry = {token: Logprob(sampled.sampled_logprobs[row], sampled.sampled_ranks[row])}
        for rank, (tid, lp) in enumerate(zip(sampled.top_token_ids[row] if sampled.top_token_ids else [],
                                             sampled.top_logprobs[row] if sampled.top_logprobs else []), 1):
            if rank > top_n:
                break
            entry.setdefault(tid, Logprob(lp, rank))
        if self.tokenizer is not None:
            for tid, lp in entry.items():
                lp.decoded_token = self.tokenizer.decode([tid])
        return entry

    @staticmethod
    def make_output(seq: Sequence) -> RequestOutput:
        text = seq.output_text
        if seq.finish_reason is None and seq.params.stop_strings:
            # While streaming, hold back what could still turn out to be the start of a stop string.
            text = text[: max(0, len(text) - (max(map(len, seq.params.stop_strings)) - 1))]
        completion = CompletionOutput(
            index=0, text=text, token_ids=seq.output_token_ids, cumulative_logprob=seq.cumulative_logprob,
            logprobs=None if seq.logprobs is None else list(seq.logprobs),
            finish_reason=seq.finish_reason, stop_reason=seq.stop_reason)
        return RequestOutput(request_id=seq.request_id, prompt=seq.prompt,
                             prompt_token_ids=seq.prompt_token_ids, outputs=[completion],
                             finished=seq.finish_reason is not None, metrics=seq.metrics,
                             num_cached_tokens=seq.num_cached_tokens,
                             # Whole once the prompt is computed, and unchanged after: shared, not copied.
                             prompt_logprobs=None if seq.needs_prompt_logprobs else seq.prompt_logprobs)


# Where transformers defines a fast tokenizer's _decode as its backend's decode plus an optional clean-up
# of spaces (never asked for here): 5.x, then 4.x.
_PLAIN_FAST_DECODE = ("transformers.tokenization_utils_tokenizers", "transformers.tokenization_utils_fast")


def rust_decode(tokenizer) -> Callable[..., str] | None:
    """The decode of a fast tokenizer's Rust backend, where transformers' own adds nothing to it: the
    same text in a third of the time (transformers converts and checks each id in Python first),
    which counts when every streamed sequence decodes twice a step. None otherwise (a slow tokenizer,
    or a class whose decoding is its own)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    owner = next((cls for cls in type(tokenizer).__mro__ if "_decode" in vars(cls)), None)
    if backend is None or owner is None or owner.__module__ not in _PLAIN_FAST_DECODE:
        return None
    return backend.decode
