"""Exercise 09, the capstone: the end-to-end check passes the solution's pieces assembled by the
solution's seams, and fails when any one piece is wrong (each broken in a way a learner plausibly
breaks it); missing and unfinished pieces are named one by one; the cost table decides with a margin.

For speed the two Triton kernels run as the engine's PyTorch references here, except where the piece
under test is one of them (the grading test in test_grading_marks.py runs the learner's kernels)."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest
import torch

from minillm.bench.verdict import NOISY_NOTE
from minillm.grading import checks_capstone
from minillm.grading.capstone_costs import cost_line
from minillm.grading.capstone_pieces import Pieces, load_pieces, notebook_answers
from minillm.grading.feedback import CheckFailed
from minillm.kernels.attention_reference import paged_decode_attention_ref
from minillm.kernels.layer_reference import fused_add_rms_norm_ref

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def capstone():
    pieces = dataclasses.replace(load_pieces(REPO / "solutions"), paged_decode=paged_decode_attention_ref,
                                 fused_add_rms_norm=fused_add_rms_norm_ref)
    seams = notebook_answers(REPO / "solutions" / "09_your_engine.ipynb")[0]["seams"]
    return pieces, seams, checks_capstone.capstone_llm("tiny", "tiny-draft")


# One wrong piece each: what a learner plausibly writes, given the solution's piece `s`.

def sample_draws_with_multinomial(s: Pieces):
    def sample(logits, temperature, top_k, top_p, min_p, generator):
        if temperature == 0:
            return s.sample(logits, temperature, top_k, top_p, min_p, generator)
        return torch.multinomial((logits / temperature).softmax(-1), 1, generator=generator).squeeze(-1)
    return {"sample": sample}


def append_slots_leaves_the_block_on_the_free_list(s: Pieces):
    def append_slots(blocks, seq, num_tokens):
        while len(seq.block_table) < blocks.blocks_needed(num_tokens):
            block_id = next(iter(blocks.free_block_ids))  # handed out again by the next call
            blocks.evict(block_id)
            blocks.blocks[block_id].ref_count += 1
            seq.block_table.append(block_id)
    return {"append_slots": append_slots}


def free_keeps_the_blocks(s: Pieces):
    def free(blocks, seq):
        for block_id in seq.block_table:
            blocks.blocks[block_id].ref_count -= 1
        seq.block_table = []
    return {"free": free}


def allocate_counts_a_hit_twice(s: Pieces):
    def allocate(blocks, seq):
        hit = s.allocate(blocks, seq)
        for block_id in seq.block_table[:hit // blocks.block_size]:
            blocks.blocks[block_id].ref_count += 1
        return hit
    return {"allocate": allocate}


def paged_decode_forgets_the_scale(s: Pieces):
    return {"paged_decode": lambda q, k_cache, v_cache, tables, lens, scale, max_seq_len=None:
            paged_decode_attention_ref(q, k_cache, v_cache, tables, lens, 1.0, max_seq_len)}


def admit_ignores_a_failed_allocate(s: Pieces):
    def admit(scheduler, batch, budget):
        while scheduler.waiting and budget > 0 and len(scheduler.running) < scheduler.max_num_seqs:
            seq = scheduler.waiting.popleft()
            scheduler.allocate(seq)  # False when the pool is short: the sequence then runs without blocks
            scheduler.running.append(seq)
            budget -= batch.add(seq, scheduler.num_new_tokens(seq, budget))
    return {"admit": admit}


def greedy_accept_keeps_every_draft(s: Pieces):
    def greedy_accept(target_token_ids, draft_token_ids, num_draft_tokens):
        out = s.greedy_accept(target_token_ids, draft_token_ids, num_draft_tokens)
        real = torch.arange(draft_token_ids.shape[1]) < num_draft_tokens[:, None]
        out[:, :-1] = torch.where(real, draft_token_ids, out[:, :-1])
        return out
    return {"greedy_accept": greedy_accept}


def stochastic_accept_keeps_the_residual_p(s: Pieces):
    def stochastic_accept(target_probs, draft_probs, draft_token_ids, num_draft_tokens, uniforms, noise):
        return s.stochastic_accept(target_probs, torch.zeros_like(draft_probs), draft_token_ids, num_draft_tokens,
                                   uniforms, noise)
    return {"stochastic_accept": stochastic_accept}


def quantize_floors(s: Pieces):
    def quantize_int4(weight, group_size):
        q, scales, zeros = s.quantize_int4(weight, group_size)
        w = weight.view(weight.shape[0], -1, group_size) / scales[..., None]
        return (w.floor() + zeros[..., None]).clamp(0, 15).view_as(q).to(torch.uint8), scales, zeros
    return {"quantize_int4": quantize_int4}


def pack_swaps_nibbles(s: Pieces):
    return {"pack_int4": lambda q: q[:, 1::2] | (q[:, 0::2] << 4)}


def dequantize_forgets_the_zero_point(s: Pieces):
    def dequantize_int4(packed, scales, zeros, group_size):
        return s.dequantize_int4(packed, scales, torch.zeros_like(zeros), group_size)
    return {"dequantize_int4": dequantize_int4}


def token_budget_in_milliseconds(s: Pieces):
    def token_budget(scheduler, cost, tpot_slo):
        if not any(seq.num_tokens - seq.num_computed_tokens == 1 for seq in scheduler.running):
            return scheduler.max_num_batched_tokens
        return int((tpot_slo - cost.fixed) / (cost.per_token * 1e3))  # 0: no floor of one token per decode
    return {"token_budget": token_budget}


def plan_kv_blocks_counts_k_only(s: Pieces):
    return {"plan_kv_blocks": lambda config, free_bytes, block_size, dtype, kv_cache_dtype="auto":
            2 * s.plan_kv_blocks(config, free_bytes, block_size, dtype, kv_cache_dtype)}


def norm_forgets_the_weight(s: Pieces):
    def fused_add_rms_norm(x, residual, weight, eps):
        return s.fused_add_rms_norm(x, residual, torch.ones_like(weight), eps)
    return {"fused_add_rms_norm": fused_add_rms_norm}


BROKEN = [sample_draws_with_multinomial, append_slots_leaves_the_block_on_the_free_list, free_keeps_the_blocks,
          allocate_counts_a_hit_twice, paged_decode_forgets_the_scale, admit_ignores_a_failed_allocate,
          greedy_accept_keeps_every_draft, stochastic_accept_keeps_the_residual_p, quantize_floors,
          pack_swaps_nibbles, dequantize_forgets_the_zero_point, token_budget_in_milliseconds,
          plan_kv_blocks_counts_k_only, norm_forgets_the_weight]


def test_every_piece_is_broken_once():
    broken = {name for mistake in BROKEN for name in mistake(load_pieces(REPO / "solutions"))}
    assert broken == {f.name for f in dataclasses.fields(Pieces) if f.name != "problems"}


def test_the_solution_passes(capstone, capsys):
    pieces, seams, llm = capstone
    checks_capstone.check_engine(seams, pieces, llm)
    assert "check_engine passed" in capsys.readouterr().out


@pytest.mark.parametrize("mistake", BROKEN, ids=lambda f: f.__name__)
def test_one_wrong_piece_fails_the_engine_check(capstone, mistake):
    pieces, seams, llm = capstone
    with pytest.raises(CheckFailed):
        checks_capstone.check_engine(seams, dataclasses.replace(pieces, **mistake(pieces)), llm)
    blocks = llm.llm_engine.block_manager
    assert blocks.num_free_blocks == blocks.num_blocks  # the check leaves the engine as it found it


def test_missing_and_unfinished_pieces_are_named_one_by_one(tmp_path):
    shutil.copy(REPO / "solutions" / "00_welcome.ipynb", tmp_path)
    shutil.copy(REPO / "exercises" / "06_quantization.ipynb", tmp_path)
    problems = load_pieces(tmp_path).problems
    assert not any("sample" in p for p in problems)
    assert sum("is not implemented yet" in p for p in problems) == 3  # exercise 06's three pieces
    assert sum("no 0" in p for p in problems) == 6  # exercises 02, 03, 04, 05, 07, 08: no notebook
    with pytest.raises(CheckFailed, match="is not implemented yet"):
        checks_capstone.check_pieces(load_pieces(REPO / "exercises"))


def test_a_piece_costs_what_its_rounds_say_with_a_margin():
    engine = [1.0, 1.02, 0.98, 1.0, 1.01]
    assert cost_line("slow", [3.0, 3.1, 2.9, 3.0, 3.05], engine).endswith("slower")
    assert cost_line("same", [1.0, 1.01, 0.99, 1.0, 1.0], engine).endswith("the same, within 10%")
    assert cost_line("noisy", [0.5, 2.0, 1.0, 3.0, 0.7], engine).endswith(NOISY_NOTE)
