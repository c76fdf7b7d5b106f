"""Checks for exercise 01, the KV cache: `append_kv`, `attend`, `append_and_attend`, and the
learner's function inside the real engine.

Expected values come from the engine's own reference (minillm.attention.per_sequence). When an
answer is wrong, it is also compared with the answers that common mistakes produce, so that the
message can name the mistake rather than only report a difference.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from minillm.attention import ContiguousAttention, per_sequence
from minillm.grading.engine_check import check_generation
from minillm.grading.feedback import CheckFailed, call_learner, check_tensor, mismatch, shape, spans
from minillm.llm import LLM


@dataclass(frozen=True)
class Case:
    """One input: n new tokens at positions start .. start+n-1 of one sequence."""

    label: str
    n: int
    start: int
    heads: int
    kv_heads: int
    head_dim: int = 8
    capacity: int = 12

    @property
    def end(self) -> int:
        return self.start + self.n

    def __str__(self) -> str:
        where = f"position {self.start}" if self.n == 1 else f"positions {self.start}..{self.end - 1}"
        return (f"{self.label}: n={self.n} new tokens at {where} (start={self.start}), "
                f"{self.heads} query heads, {self.kv_heads} KV heads, head_dim={self.head_dim}")

    def tensors(self, seed: int) -> dict[str, torch.Tensor]:
        """Signed random q, k, v for this step, and caches whose first `start` rows hold earlier
        tokens and whose unwritten rows are NaN, as uninitialised engine memory may be."""
        g = torch.Generator().manual_seed(seed)
        kv = (self.capacity, self.kv_heads, self.head_dim)
        caches = [torch.full(kv, float("nan")) for _ in range(2)]
        for c in caches:
            c[:self.start] = torch.randn((self.start, *kv[1:]), generator=g)
        return dict(q=torch.randn((self.n, self.heads, self.head_dim), generator=g),
                    k=torch.randn((self.n, *kv[1:]), generator=g),
                    v=torch.randn((self.n, *kv[1:]), generator=g),
                    k_cache=caches[0], v_cache=caches[1])


APPEND_CASES = (
    Case("a prompt (prefill)", n=5, start=0, heads=2, kv_heads=2),
    Case("one decode step", n=1, start=5, heads=2, kv_heads=2),
    Case("a chunk after cached tokens", n=3, start=4, heads=1, kv_heads=1, head_dim=16),
)
ATTEND_CASES = (
    Case("a prompt (prefill)", n=6, start=0, heads=2, kv_heads=2),
    Case("one decode step", n=1, start=6, heads=2, kv_heads=2),
    Case("a chunk after cached tokens", n=3, start=4, heads=3, kv_heads=3, head_dim=16),
)
GQA_CASES = (
    Case("grouped-query prefill, 2 query heads per KV head", n=4, start=0, heads=4, kv_heads=2),
    Case("grouped-query chunk, 3 query heads per KV head", n=3, start=5, heads=6, kv_heads=2),
    Case("grouped-query decode, 4 query heads per KV head", n=1, start=9, heads=8, kv_heads=2, head_dim=16),
    Case("multi-query chunk, one KV head for all", n=2, start=3, heads=3, kv_heads=1),
)
CACHE_CASES = (
    Case("a prompt (prefill)", n=4, start=0, heads=4, kv_heads=2),
    Case("one decode step", n=1, start=6, heads=4, kv_heads=2),
    Case("a chunk after cached tokens", n=3, start=3, heads=2, kv_heads=1, head_dim=16),
)


def check_append_kv(append_kv: Callable) -> None:
    """Rows start..end-1 of both caches hold the new keys and values, nothing else changed, and
    the return value is end."""
    for seed, case in enumerate(APPEND_CASES):
        t = case.tensors(seed)
        before = t["k_cache"].clone(), t["v_cache"].clone()
        end = call_learner(append_kv, "append_kv", str(case), t["k_cache"], t["v_cache"], t["k"], t["v"],
                           case.start)
        if end != case.end:
            raise CheckFailed(f"append_kv returned {end!r}; expected end = start + n = {case.end}, the "
                              f"number of positions cached once the new tokens are in (the caller "
                              f"attends over cache[:end])\n  on input: {case}")
        _check_cache("append_kv", case, t["k_cache"], before[0], t["k"], "k_cache")
        _check_cache("append_kv", case, t["v_cache"], before[1], t["v"], "v_cache")
    print(f"check_append_kv passed: {len(APPEND_CASES)} inputs (prefill, decode, chunk)")


def check_attend(attend: Callable) -> None:
    """Causal attention with one KV head per query head."""
    _check_attend(attend, ATTEND_CASES)
    print(f"check_attend passed: {len(ATTEND_CASES)} inputs (prefill, decode, chunk)")


def check_attend_gqa(attend: Callable) -> None:
    """Causal attention where groups of query heads share a KV head."""
    _check_attend(attend, GQA_CASES, seed=100)
    print(f"check_attend_gqa passed: {len(GQA_CASES)} inputs (2, 3 and 4 query heads per KV head, MQA)")


def check_append_and_attend(append_and_attend: Callable) -> None:
    """The caches as append_kv leaves them, and attention over their first end rows."""
    for seed, case in enumerate(CACHE_CASES, start=200):
        t = case.tensors(seed)
        before = t["k_cache"].clone(), t["v_cache"].clone()
        k_ref, v_ref = before[0].clone(), before[1].clone()
        expected = per_sequence.append_and_attend(t["q"], t["k"], t["v"], k_ref, v_ref, case.start)
        got = call_learner(append_and_attend, "append_and_attend", str(case), t["q"], t["k"], t["v"],
                           t["k_cache"], t["v_cache"], case.start)
        _check_cache("append_and_attend", case, t["k_cache"], before[0], t["k"], "k_cache")
        _check_cache("append_and_attend", case, t["v_cache"], before[1], t["v"], "v_cache")
        check_tensor(got, expected, "append_and_attend", str(case),
                     nan_hint="rows of the cache past end were never written (NaN here, whatever "
                     "was in memory in the engine): attend over k_cache[:end] and v_cache[:end]")
        if not mismatch(got, expected).any():
            continue
        k_seen, v_seen = k_ref[:case.end], v_ref[:case.end]
        mistakes = {
            "it attends over this step's new keys only, not the cache: the queries must also see the "
            "start positions cached before": per_sequence.attend(t["q"], t["k"], t["v"], q_start=0),
            "it passes q_start=0 to attend: the queries sit at positions start .. start+n-1, after "
            "the cached tokens": per_sequence.attend(t["q"], k_seen, v_seen, q_start=0),
            **_attention_mistakes(t["q"], k_seen, v_seen, case.start),
        }
        raise CheckFailed(_attention_message("append_and_attend", case, got, expected, mistakes)
                          + "\n  (if check_attend passes, look at how append_and_attend calls it)")
    print(f"check_append_and_attend passed: {len(CACHE_CASES)} inputs (prefill, decode, chunk)")


def check_engine(append_and_attend: Callable, llm: LLM) -> None:
    """Greedy generation with the learner's append_and_attend in every layer of the engine."""
    backend = llm.llm_engine.model_runner.attn_backend
    if not isinstance(backend, ContiguousAttention):
        raise CheckFailed(f"this check plugs your function into the contiguous KV cache, but the LLM uses "
                          f"{backend.name!r}: create it with LLM(model, kv_cache='contiguous')")
    compared = check_generation(llm, backend, "cache_attention", per_sequence.append_and_attend,
                                append_and_attend, "append_and_attend")
    print(f"check_engine passed: with your append_and_attend in the engine, {compared}")


def _check_attend(attend: Callable, cases: tuple[Case, ...], seed: int = 0) -> None:
    for i, case in enumerate(cases, start=seed):
        t = case.tensors(i)
        k, v = t["k"], t["v"]
        if case.start:  # attend sees the whole history: cached keys first, then this step's
            k = torch.cat([t["k_cache"][:case.start], k])
            v = torch.cat([t["v_cache"][:case.start], v])
        inputs = (f"{case}; q {shape(t['q'])}, k and v {shape(k)}, q_start={case.start}")
        expected = per_sequence.attend(t["q"], k, v, q_start=case.start)
        got = check_tensor(call_learner(attend, "attend", inputs, t["q"].clone(), k.clone(), v.clone(),
                                        case.start), expected, "attend", inputs,
                           nan_hint="a softmax row is all -inf: every query must see its own key (mask "
                           "keys j > q_start + i, not j >= q_start + i)")
        if mismatch(got, expected).any():
            mistakes = _attention_mistakes(t["q"], k, v, case.start)
            raise CheckFailed(_attention_message("attend", case, got, expected, mistakes))


_ATTENTION_MISTAKES = (
    ("there is no causal mask: query i sits at position q_start + i and may only see keys "
     "0 .. q_start + i; set the scores of later keys to -inf before the softmax", dict(mask="none")),
    ("the causal mask ignores q_start, as if the queries sat at positions 0 .. n-1: this step's "
     "tokens come after the q_start cached ones", dict(mask="from_zero")),
    ("the scores are not scaled by 1/sqrt(head_dim)", dict(scale=False)),
    ("query head h reads KV head h % kv_heads; the convention (Llama, Hugging Face's repeat_kv) is "
     "h // (heads // kv_heads): neighbouring query heads share a KV head, so expand K and V with "
     "repeat_interleave, not repeat", dict(grouped=False)),
)


def _attention_mistakes(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_start: int
                        ) -> dict[str, torch.Tensor]:
    return {text: _attention_variant(q, k, v, q_start, **variant) for text, variant in _ATTENTION_MISTAKES}


def _attention_variant(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_start: int, *,
                       mask: str = "causal", scale: bool = True, grouped: bool = True) -> torch.Tensor:
    """Attention as a particular mistake computes it (the defaults give the right answer)."""
    n, heads, head_dim = q.shape
    length, kv_heads, _ = k.shape
    h = torch.arange(heads)
    kv_head = h // (heads // kv_heads) if grouped else h % kv_heads
    scores = torch.einsum("nhd,lhd->hnl", q, k[:, kv_head]) * (head_dim ** -0.5 if scale else 1.0)
    if mask != "none":
        q_pos = torch.arange(n) + (q_start if mask == "causal" else 0)
        scores = scores.masked_fill(torch.arange(length) > q_pos[:, None], float("-inf"))
    return torch.einsum("hnl,lhd->nhd", scores.softmax(-1), v[:, kv_head])


def _attention_message(name: str, case: Case, got: torch.Tensor, expected: torch.Tensor,
                       mistakes: dict[str, torch.Tensor]) -> str:
    wrong = mismatch(got, expected)
    positions = [case.start + i for i in wrong.any(dim=(1, 2)).nonzero().flatten().tolist()]
    heads = wrong.any(dim=(0, 2)).nonzero().flatten().tolist()
    error = (got.detach().float() - expected).abs().max().item()
    text = (f"{name} gives the wrong output on {case}\n"
            f"  wrong for query positions {spans(positions)} (of {case.start}..{case.end - 1}) and query "
            f"heads {spans(heads)} (of 0..{case.heads - 1}); largest error {error:.3g}")
    for diagnosis, answer in mistakes.items():
        if not mismatch(got, answer).any():
            return f"{text}\n  your output is exactly what you get when {diagnosis}"
    return (f"{text}\n  hint: output[i, h] = softmax(q[i, h] . k[j, g] / sqrt(head_dim) over keys "
            f"j <= q_start + i) weighted sum of v[j, g], with g = h // (heads // kv_heads)")


def _check_cache(name: str, case: Case, after: torch.Tensor, before: torch.Tensor, new: torch.Tensor,
                 which: str) -> None:
    """Rows start..end-1 hold the new values; every other row is as it was (NaN included)."""
    expected = before.clone()
    expected[case.start:case.end] = new
    wrong = _differing_rows(after, expected)
    if not wrong:
        return
    text = f"{name} left {which} wrong on {case}\n  rows {spans(wrong)} are not what they should be: rows " \
           f"{case.start}..{case.end - 1} hold the new values, every other row stays as it was"
    if not _differing_rows(after, before):
        hint = (f"{which} was not written at all. Write into the tensor you were given, in place "
                f"({which}[start:end] = ...): the engine keeps only that buffer, so assigning a new "
                "tensor to a local name is lost")
    else:
        offsets = [o for o in range(-case.start, after.shape[0] - case.end + 1)
                   if o and torch.equal(after[case.start + o:case.end + o], new)]
        hint = (f"the new values landed at rows {case.start + offsets[0]}..{case.end - 1 + offsets[0]}, "
                f"off by {offsets[0]:+d}: row p holds the token at position p, and the new tokens sit "
                f"at positions start .. start+n-1" if offsets else
                "row p of the cache holds the key (or value) of the token at position p")
    raise CheckFailed(f"{text}\n  hint: {hint}")


def _differing_rows(a: torch.Tensor, b: torch.Tensor) -> list[int]:
    same = (a == b) | (a.isnan() & b.isnan())
    return (~same).flatten(1).any(dim=1).nonzero().flatten().tolist()
