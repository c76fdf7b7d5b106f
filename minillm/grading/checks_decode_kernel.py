"""Checks for exercise 03, the paged decode kernel: the learner's `paged_decode` (a Triton kernel and
its launcher, with the signature of `reference.paged_decode_attention_ref`) against the reference
on random paged batches, then as the engine's decode attention.

The learner writes the loop over tiles of 16 tokens, so the cases are chosen to tell its usual
mistakes apart: a sequence of at most one tile is right as soon as the scores and the softmax are,
a longer one also needs the running values rescaled when the maximum grows, and a length that is
not a multiple of the tile needs the tail masked. Last, scores as large as a model's can be: exp()
overflows float32 unless it subtracts the running max, the max over every tile so far.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from minillm.grading.engine_check import check_generation
from minillm.grading.feedback import CheckFailed, call_learner, check_tensor
from minillm.kernels.attention_reference import paged_decode_attention_ref
from minillm.kernels.random_inputs import paged_batch
from minillm.llm import LLM

TILE = 16  # the tile of the exercise's kernel
TOLERANCE = 1e-4  # relative, fp32
# (query heads per KV head, head_dim, block_size, sequence lengths, scale of q): one tile, exact tiles,
# tails; then queries 100 times larger, whose scores (standard deviation 100) overflow exp() in float32
# unless every exp subtracts the running max: exp(scores) alone, or the max of one tile alone (whose
# exp(m_old - m_tile) overflows when a later tile's max is lower), give inf and NaN.
CASES = [(1, 64, 16, [16, 3, 1], 1.0), (2, 64, 16, [32, 48, 16], 1.0), (2, 80, 32, [40, 100, 7, 16], 1.0),
         (4, 128, 16, [200, 33, 64], 1.0), (8, 64, 32, [150, 1], 1.0), (2, 64, 16, [130, 64, 20], 100.0)]
OVERFLOW_HINT = ("scores this large overflow exp() in float32 (past 88.7): take p = exp(scores - m_new) and "
                 "alpha = exp(m - m_new), where m_new = max(m, this tile's max) is the running max of every tile "
                 "so far, so that no exp() sees a positive argument")


def _hint(lens: list[int], bad: list[bool], q_scale: float) -> str:
    if q_scale > 1:  # the earlier cases passed: the loop is right but for the size of its exp() arguments
        return OVERFLOW_HINT
    good_short = all(not b for n, b in zip(lens, bad) if n <= TILE)
    good_multiples = all(not b for n, b in zip(lens, bad) if n % TILE == 0)
    if good_short and any(b for n, b in zip(lens, bad) if n > TILE):
        return ("sequences of one tile are right and longer ones are not: when a tile raises the running max "
                "m, what was summed before (denom and acc) must be scaled by exp(m_old - m_new), and m must "
                "become the new max")
    if good_multiples:
        return ("lengths that fill whole tiles are right and the others are not: in the last tile, positions "
                "at or past seq_len are not keys; their scores must be -inf so that exp() gives them no weight")
    return ("even a single tile is wrong: the scores are q @ k^T times scale; p = exp(scores - m_new); "
            "denom adds the row sums of p and acc adds p @ v")


def check_decode_kernel(paged_decode: Callable) -> None:
    """The learner's kernel against the reference, sequence by sequence, on random paged batches."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    for case, (group, head_dim, block_size, lens, q_scale) in enumerate(CASES):
        kv_heads = 2
        k_cache, v_cache, tables, seq_lens = paged_batch(lens, kv_heads, head_dim, block_size, torch.float32,
                                                         seed=case, device=device)
        q = torch.randn(len(lens), kv_heads * group, head_dim, generator=torch.Generator().manual_seed(case))
        q = (q * q_scale).to(device)
        scale = head_dim ** -0.5
        described = (f"{len(lens)} sequences of {lens} tokens, {kv_heads * group} query heads over {kv_heads} KV "
                     f"heads, head_dim {head_dim}, blocks of {block_size} tokens")
        if q_scale > 1:
            described += f", queries scaled by {q_scale:g} (scores of standard deviation {q_scale:g})"
        expected = paged_decode_attention_ref(q, k_cache, v_cache, tables, seq_lens, scale)
        got = call_learner(paged_decode, "paged_decode", described, q, k_cache, v_cache, tables, seq_lens, scale)
        got = check_tensor(got, expected, "paged_decode", described, OVERFLOW_HINT if q_scale > 1 else
                           "exp(-inf - (-inf)) is NaN: is a tile's max taken over masked scores only?")
        errors = [((g - e).abs().max() / e.abs().max()).item() for g, e in zip(got, expected)]
        bad = [err > TOLERANCE for err in errors]
        if any(bad):
            worst = max(range(len(lens)), key=errors.__getitem__)
            raise CheckFailed(f"paged_decode differs from the reference on {described}\n"
                              f"  sequence {worst} ({lens[worst]} tokens): largest error {errors[worst]:.2g} of the "
                              f"largest output (tolerance {TOLERANCE}); wrong sequences: "
                              f"{[n for n, b in zip(lens, bad) if b]} tokens, right: "
                              f"{[n for n, b in zip(lens, bad) if not b]} tokens\n  hint: {_hint(lens, bad, q_scale)}")
    print(f"check_decode_kernel passed: {len(CASES)} random paged batches (GQA 1 to 8, head dims 64 to 128, "
          f"1 to 200 tokens, scores large enough to overflow exp()) within {TOLERANCE} of the reference")


def check_engine(paged_decode: Callable, llm: LLM) -> None:
    """Greedy generation with the learner's kernel as the engine's decode attention."""
    backend = llm.llm_engine.model_runner.attn_backend
    if backend.name != "paged":
        raise CheckFailed(f"this check plugs your kernel into the paged KV cache, but the LLM has "
                          f"kv_cache={backend.name!r}: create it with the default kv_cache='paged'")
    done = check_generation(llm, backend.ops, "paged_decode_attention", paged_decode_attention_ref, paged_decode,
                            "paged_decode")
    print(f"check_engine passed: with your kernel for every decode step, {done}")
