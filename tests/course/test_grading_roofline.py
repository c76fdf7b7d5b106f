"""Exercise 08's checks: the engine's references agree with the modules they describe, a correct
answer passes, and each typical mistake is caught and named."""

from __future__ import annotations

import pytest
import torch

from minillm.bench.decode import decode_step_bytes, step_flops, weight_bytes
from minillm.grading import roofline_cases
from minillm.grading.checks_decode_step_bytes import check_decode_step_bytes
from minillm.grading.checks_kv_planner_engine import check_engine
from minillm.grading.checks_plan_kv_blocks import check_plan_kv_blocks
from minillm.grading.checks_step_flops import check_step_flops
from minillm.grading.feedback import CheckFailed
from minillm.kv.pool import kv_bytes_per_token, plan_kv_blocks
from minillm.models.registry import model_class

# ---- what a learner might write: right, and with one mistake each ----

def make_bytes(kv_heads_from_attention=False, only_k=False, tied_twice=False, no_scales=False, bits=False,
               untied_table=False, one_sequence=False, hidden_head_dim=False, mlp_matrices=3):
    def fn(config, batch, context, dtype, kv_cache_dtype="auto"):
        hidden = config.hidden_size
        d = hidden // config.num_attention_heads if hidden_head_dim else config.head_dim
        q, kv = config.num_attention_heads * d, config.num_key_value_heads * d
        per_layer = hidden * (q + 2 * kv) + q * hidden + mlp_matrices * hidden * config.intermediate_size + 2 * hidden
        embedding = config.vocab_size * hidden
        weights = config.num_hidden_layers * per_layer + hidden + embedding
        if (tied_twice and config.tie_word_embeddings) or (untied_table and not config.tie_word_embeddings):
            weights += embedding
        size = torch.finfo(dtype).bits if bits else dtype.itemsize
        if kv_cache_dtype == "int8":
            per_head = d + (0 if no_scales else 4)
        else:
            per_head = d * size
        heads = config.num_attention_heads if kv_heads_from_attention else config.num_key_value_heads
        per_token = (1 if only_k else 2) * config.num_hidden_layers * heads * per_head
        return weights * size + (1 if one_sequence else batch) * context * per_token
    return fn


def make_flops(kv_heads=False, one_flop=False, square=False, tied_twice=False, no_attention=False,
               attention_layers=None, mlp_matrices=3):
    def fn(config, num_tokens, context):
        hidden, d = config.hidden_size, config.head_dim
        q, kv = config.num_attention_heads * d, config.num_key_value_heads * d
        per_layer = hidden * (q + 2 * kv) + q * hidden + mlp_matrices * hidden * config.intermediate_size
        matmul = config.num_hidden_layers * per_layer + config.vocab_size * hidden
        if tied_twice and config.tie_word_embeddings:
            matmul += config.vocab_size * hidden
        n = num_tokens
        keys = n * context + (n * n if square else n * (n + 1) // 2)
        heads = config.num_key_value_heads if kv_heads else config.num_attention_heads
        layers = attention_layers or config.num_hidden_layers
        attention = 0 if no_attention else 4 * heads * d * layers * keys
        return (1 if one_flop else 2) * matmul * n + attention
    return fn


def make_plan(kv_heads_from_attention=False, only_k=False, no_scales=False, ceil=False, tokens=False, bits=False,
              true_division=False, one_layer=False):
    def fn(config, free_bytes, block_size, dtype, kv_cache_dtype="auto"):
        size = torch.finfo(dtype).bits if bits else dtype.itemsize
        per_head = config.head_dim + (0 if no_scales else 4) if kv_cache_dtype == "int8" else config.head_dim * size
        heads = config.num_attention_heads if kv_heads_from_attention else config.num_key_value_heads
        per_token = (1 if only_k else 2) * (1 if one_layer else config.num_hidden_layers) * heads * per_head
        per_block = per_token if tokens else block_size * per_token
        if true_division:
            return free_bytes / per_block
        return -(-free_bytes // per_block) if ceil else free_bytes // per_block
    return fn


# ---- the references describe the engine ----

def test_the_references_count_what_the_loaded_modules_hold() -> None:
    """decode_step_bytes and step_flops from the config agree with weight_bytes on the model built from it
    (on the meta device: shapes, no memory), for every family flag; plan_kv_blocks fits the pool's bytes."""
    for case in roofline_cases.cases(num_random=6):
        config = case.config
        with torch.device("meta"):
            model = model_class(config.architecture)(config).to(torch.bfloat16)
        read, linear = weight_bytes(model)
        kv = kv_bytes_per_token(config, torch.bfloat16)
        assert decode_step_bytes(config, 3, 10, torch.bfloat16) == read + 30 * kv
        assert step_flops(config, 1, 0) == 2 * linear + 4 * config.num_attention_heads * config.head_dim * \
            config.num_hidden_layers
        blocks = plan_kv_blocks(config, 10**8, 16, torch.bfloat16, "int8")
        assert blocks * 16 * kv_bytes_per_token(config, torch.bfloat16, "int8") <= 10**8
        assert (blocks + 1) * 16 * kv_bytes_per_token(config, torch.bfloat16, "int8") > 10**8


def test_prefill_flops_are_the_sum_of_its_tokens_decodes() -> None:
    config = roofline_cases.cases()[1].config
    assert step_flops(config, 5, 0) == sum(step_flops(config, 1, p) for p in range(5))
    assert step_flops(config, 3, 7) == sum(step_flops(config, 1, 7 + p) for p in range(3))


# ---- a correct answer passes ----

def test_a_correct_answer_passes(capsys: pytest.CaptureFixture) -> None:
    check_decode_step_bytes(make_bytes())
    check_step_flops(make_flops())
    check_plan_kv_blocks(make_plan())
    out = capsys.readouterr().out
    assert "check_decode_step_bytes passed" in out and "check_step_flops passed" in out
    assert "check_plan_kv_blocks passed" in out


def test_the_engine_sizes_its_pool_with_the_learners_planner(capsys: pytest.CaptureFixture) -> None:
    check_engine(make_plan(), "tiny", "cpu")
    out = capsys.readouterr().out
    assert "check_engine passed: the engine sized its pool with your plan_kv_blocks (40 blocks" in out


def test_the_engine_check_refuses_a_wrong_planner() -> None:
    with pytest.raises(CheckFailed, match="its own planner gives 40"):
        check_engine(make_plan(only_k=True), "tiny", "cpu")


def test_stubs_are_reported_as_not_implemented() -> None:
    def stub(*args):
        raise NotImplementedError()

    for check in (check_decode_step_bytes, check_step_flops, check_plan_kv_blocks):
        with pytest.raises(CheckFailed, match="not implemented yet"):
            check(stub)


# ---- each typical mistake is caught and named ----

@pytest.mark.parametrize("mistake, message", [
    (dict(kv_heads_from_attention=True), "K and V of num_attention_heads heads"),
    (dict(only_k=True), "only K"),
    (dict(tied_twice=True), "tied embedding twice"),
    (dict(no_scales=True), "leave out the int8 cache's scales"),
    (dict(bits=True), "bits, not bytes"),
    (dict(untied_table=True), "whole untied embedding table"),
    (dict(one_sequence=True), "KV cache of one sequence"),
    (dict(hidden_head_dim=True), "hidden_size // num_attention_heads as the head dimension"),
    (dict(mlp_matrices=2), "two MLP matrices"),
])
def test_decode_step_bytes_mistakes(mistake: dict, message: str) -> None:
    with pytest.raises(CheckFailed, match=message):
        check_decode_step_bytes(make_bytes(**mistake))


@pytest.mark.parametrize("mistake, message", [
    (dict(kv_heads=True), "attention with num_key_value_heads"),
    (dict(one_flop=True), "one flop per weight"),
    (dict(square=True), "attention is causal"),
    (dict(tied_twice=True), "tied embedding twice"),
    (dict(no_attention=True), "leave attention out"),
    (dict(attention_layers=1), "attention in one layer"),
    (dict(mlp_matrices=2), "two MLP matrices"),
])
def test_step_flops_mistakes(mistake: dict, message: str) -> None:
    with pytest.raises(CheckFailed, match=message):
        check_step_flops(make_flops(**mistake))


@pytest.mark.parametrize("mistake, message", [
    (dict(kv_heads_from_attention=True), "K and V of num_attention_heads heads"),
    (dict(only_k=True), "only K"),
    (dict(no_scales=True), "leave out the int8 cache's scales"),
    (dict(ceil=True), "round up"),
    (dict(tokens=True), "return tokens, not blocks"),
    (dict(bits=True), "bits, not bytes"),
    (dict(true_division=True), "return an int"),
    (dict(one_layer=True), "K and V of one layer"),
])
def test_plan_kv_blocks_mistakes(mistake: dict, message: str) -> None:
    with pytest.raises(CheckFailed, match=message):
        check_plan_kv_blocks(make_plan(**mistake))


def test_a_wrong_answer_shows_the_expected_breakdown() -> None:
    def off_by_one(config, batch, context, dtype, kv_cache_dtype="auto"):
        return make_bytes()(config, batch, context, dtype, kv_cache_dtype) + 1

    with pytest.raises(CheckFailed, match=r"expected = weights read [\d,]+ \+ 1 sequences x 0 tokens") as error:
        check_decode_step_bytes(off_by_one)
    assert "your answer is what you get if" not in str(error.value)
