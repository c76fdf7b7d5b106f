"""Checks for exercise 03, part 3: the learner's `merge_partitions(part_out, lse)`, the second pass of
split-KV decode attention, on the partitions minillm's own kernel computes (`paged_decode_partitions`),
then as the engine's merge.

The kernel's first pass gives, for every (sequence, query head, partition), the partition's own
softmax-weighted values and the log-sum-exp of its scores (-inf where the partition holds no key).
The cases add one difficulty at a time, so that the first one to fail names the mistake: a single
partition; several, all holding keys; partitions past a sequence's end; scores so large that exp(lse)
overflows float32, in a batch whose sequences' lse lie far apart; a padding row with no key at all.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from minillm.grading.engine_check import check_generation
from minillm.grading.feedback import CheckFailed, call_learner, shape
from minillm.kernels.attention_reference import paged_decode_attention_ref, paged_decode_partitions_ref
from minillm.kernels.random_inputs import paged_batch
from minillm.llm import LLM

TOLERANCE = 1e-4  # relative to the largest output of a sequence, fp32
KV_HEADS, GROUP, HEAD_DIM, BLOCK_SIZE = 1, 4, 32, 16  # small: on a CPU the kernel runs in Triton's interpreter
ENGINE_PARTITION = 16  # one block: the engine's short prompts then span several partitions


@dataclass(frozen=True)
class Case:
    name: str
    lens: list[int]
    partition_size: int
    q_scales: tuple[float, ...]  # one per sequence: large queries give large, far-apart scores
    hint: str  # what this case adds, and the mistake it usually reveals


CASES = [
    Case("one partition per sequence", [5, 16, 30], 32, (1.0, 1.0, 1.0),
         "with one partition the merge must return that partition's output as it is: its weight is "
         "exp(lse - max) / sum = 1"),
    Case("several partitions, each holding keys", [64, 50, 61], 16, (1.0, 1.0, 1.0),
         "partition i holds exp(lse_i) of the softmax's total mass sum_j exp(lse_j): its output weighs "
         "exp(lse_i - m) / sum_j exp(lse_j - m), with m the largest lse of that sequence and head"),
    Case("partitions past a sequence's end (lse -inf, output 0)", [100, 7, 33, 1], 16, (1.0,) * 4,
         "a partition past the end of its sequence holds no key: its lse is -inf and it must weigh nothing. "
         "exp(-inf - m) is exactly 0 for any finite m, so leave -inf as it is"),
    Case("large scores, far apart between sequences", [40, 40, 25], 16, (100.0, 0.01, 30.0),
         "exp() of a float32 overflows to inf past 88.7; subtract each (sequence, head)'s own largest lse "
         "(the max over partitions, dim 2) before exp"),
    Case("a padding row with no key at all", [20, 0, 9], 16, (1.0, 1.0, 1.0),
         "a sequence of length 0 (the engine pads CUDA-graph batches with such rows) has every lse -inf: "
         "its max is -inf too and -inf - (-inf) is NaN. Its output must be 0, as the kernel's merge gives"),
]
FAR_APART = CASES[3]


def _case_inputs(case: Case, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, str]:
    """part_out and lse from the kernel's first pass (on the GPU, or in Triton's interpreter), the
    exact attention output they must merge into, and a description of the case."""
    from minillm.kernels.paged_decode import paged_decode_partitions  # needs triton

    device = "cuda" if torch.cuda.is_available() else "cpu"
    k_cache, v_cache, tables, lens = paged_batch(case.lens, KV_HEADS, HEAD_DIM, BLOCK_SIZE, torch.float32,
                                                 seed=seed, device=device)
    q = torch.randn(len(case.lens), KV_HEADS * GROUP, HEAD_DIM, generator=torch.Generator().manual_seed(seed))
    q = (q * torch.tensor(case.q_scales)[:, None, None]).to(device)
    scale = HEAD_DIM ** -0.5
    part_out, lse = paged_decode_partitions(q, k_cache, v_cache, tables, lens, scale,
                                            partition_size=case.partition_size)
    expected = torch.zeros_like(q)
    real = lens > 0
    expected[real] = paged_decode_attention_ref(q[real], k_cache, v_cache, tables[real], lens[real], scale)
    described = (f"{case.name}: {len(case.lens)} sequences of {case.lens} tokens, partitions of "
                 f"{case.partition_size} tokens, part_out {shape(part_out)}, lse {shape(lse)}")
    return part_out, lse, expected, described


def _named_mistake(got: torch.Tensor, part_out: torch.Tensor, lse: torch.Tensor) -> str | None:
    """The usual wrong merges, computed here: if the learner's output is one of them, say which."""
    top = lse.amax(2, keepdim=True).clamp(min=-1e30)
    weights = torch.exp(lse - top)
    wrong = {
        "the partitions' outputs were averaged: a partition's weight is its share of the softmax's mass, "
        "exp(lse_i - m) / sum_j exp(lse_j - m), not 1 / num_parts (and a partition past the end, all zeros, "
        "would count too)": part_out.mean(2),
        "the weights exp(lse_i - m) were not divided by their sum over partitions: each partition's output "
        "is already normalized by its own sum, so the weights must add up to 1": (weights[..., None] * part_out).sum(2),
        "the weights are reversed: a partition whose scores are larger (larger lse) holds more of the mass and "
        "must weigh more, exp(lse_i - m), not exp(m - lse_i)": _normalized(torch.exp(top - lse), part_out),
    }
    for hint, candidate in wrong.items():
        if torch.isfinite(candidate).all() and (got - candidate).abs().max() <= 1e-5 * (1 + candidate.abs().max()):
            return hint
    return None


def _normalized(weights: torch.Tensor, part_out: torch.Tensor) -> torch.Tensor:
    return (weights[..., None] * part_out).sum(2) / weights.sum(2)[..., None]


def _nonfinite_hint(case: Case, bad_seqs: list[int]) -> str:
    # Sequence 0 of that case holds the batch's largest lse: an overflow breaks it, a batch-wide max does not.
    if case is FAR_APART and 0 not in bad_seqs:
        return ("the sequences whose lse are far below the batch's largest went wrong: their exp(lse - m) "
                "underflows to 0 for every partition, and 0/0 is NaN. m must be the max over that sequence's "
                "own partitions (dim 2), not over the whole tensor")
    return case.hint


def check_merge(merge_partitions: Callable) -> None:
    """The learner's merge against exact attention, on the partitions of minillm's split-KV kernel."""
    for seed, case in enumerate(CASES):
        part_out, lse, expected, described = _case_inputs(case, seed)
        got = call_learner(merge_partitions, "merge_partitions", described, part_out.clone(), lse.clone())
        if not isinstance(got, torch.Tensor) or got.shape != expected.shape or got.dtype != torch.float32:
            raise CheckFailed(f"merge_partitions returned {shape(got)} {getattr(got, 'dtype', '')}; expected a "
                              f"float32 tensor of shape {shape(expected)} ([num_seqs, heads, head_dim]: the "
                              f"partitions, dim 2, merged away)\n  on input: {described}")
        got = got.detach().cpu()
        expected = expected.cpu()
        finite = torch.isfinite(got).flatten(1).all(1)
        if not finite.all():
            bad = [i for i, ok in enumerate(finite.tolist()) if not ok]
            lengths = [case.lens[i] for i in bad]
            raise CheckFailed(f"merge_partitions returned NaN or inf for sequence(s) {bad} of lengths {lengths}\n"
                              f"  on input: {described}\n  hint: {_nonfinite_hint(case, bad)}")
        errors = [((g - e).abs().max() / e.abs().max().clamp(min=1e-6)).item() for g, e in zip(got, expected)]
        if max(errors) > TOLERANCE:
            worst = max(range(len(errors)), key=errors.__getitem__)
            hint = _named_mistake(got, part_out.cpu(), lse.cpu()) or case.hint
            raise CheckFailed(f"merge_partitions differs from exact attention on {described}\n  sequence {worst} "
                              f"(length {case.lens[worst]}): largest error {errors[worst]:.2g} of its largest output "
                              f"(tolerance {TOLERANCE})\n  hint: {hint}")
    print(f"check_merge passed: {len(CASES)} batches of the split-KV kernel's partitions ("
          f"{'; '.join(c.name for c in CASES)}) merged within {TOLERANCE} of exact attention")


def check_merge_engine(merge_partitions: Callable, llm: LLM) -> None:
    """Greedy generation with the engine's decode attention split into partitions of ENGINE_PARTITION
    tokens and merged by the learner. The partitions come from the Triton kernel on a GPU and from its
    PyTorch reference on a CPU (the interpreter would take minutes for every layer of every step)."""
    backend = llm.llm_engine.model_runner.attn_backend
    if backend.name != "paged":
        raise CheckFailed(f"this check plugs your merge into the paged KV cache, but the LLM has "
                          f"kv_cache={backend.name!r}: create it with the default kv_cache='paged'")

    def split_kv_decode(q, k_cache, v_cache, block_tables, seq_lens, scale, max_seq_len=None, **scales):
        if q.is_cuda:
            from minillm.kernels.paged_decode import paged_decode_partitions as partitions
        else:
            partitions = paged_decode_partitions_ref
        part_out, lse = partitions(q, k_cache, v_cache, block_tables, seq_lens, scale, max_seq_len,
                                   partition_size=ENGINE_PARTITION, **scales)
        described = f"a decode step of the engine, part_out {shape(part_out)}, lse {shape(lse)}"
        out = call_learner(merge_partitions, "merge_partitions", described, part_out, lse)
        if not isinstance(out, torch.Tensor) or out.shape != q.shape:
            raise CheckFailed(f"merge_partitions returned {shape(out)} in the engine; expected {shape(q)}\n"
                              f"  on input: {described}")
        return out.to(q.dtype)

    done = check_generation(llm, backend.ops, "paged_decode_attention", paged_decode_attention_ref, split_kv_decode,
                            "merge_partitions")
    print(f"check_merge_engine passed: decode attention split into partitions of {ENGINE_PARTITION} tokens and "
          f"merged by your function, {done}")
