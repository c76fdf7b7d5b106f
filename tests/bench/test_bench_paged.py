"""The prefix-cache benchmark's rounds: each round sends the group again with suffixes of its own, to
both engines, and every round counts; a burst arrives at an empty cache and still shares its prefix."""

from __future__ import annotations

from minillm.bench.paged import bench_prefix_cache


def test_every_round_sends_a_new_group_to_both_engines():
    args = dict(model="tiny", num_requests=3, prefix_len=32, max_tokens=2, seed=0, device="cpu", dtype="float32",
                max_model_len=128, num_kv_blocks=32)
    (off1, on1), one = bench_prefix_cache(rounds=1, **args)
    (off3, on3), three = bench_prefix_cache(rounds=3, **args)
    assert one["rounds"] == 1 and three["rounds"] == 3 and three["all_outputs_identical"]
    # The first request and the first round are the same prompts either way; the next two rounds are
    # two more groups of 2 requests, each prompt the 32-token prefix and 8 to 32 tokens of its own.
    assert 2 * 2 * (32 + 8) <= off3["prefill_tokens"] - off1["prefill_tokens"] <= 2 * 2 * (32 + 32)
    assert on3["cached_tokens"] - on1["cached_tokens"] == 2 * 2 * 32  # the prefix's 2 full blocks of 16, per request
    assert on3["prefill_tokens"] - on1["prefill_tokens"] <= 2 * 2 * 32


def test_a_burst_shares_its_prefix_within_its_first_step_every_round():
    """All three requests of a round arrive together at an empty cache (emptied between rounds): one
    computes the prefix, the two others find its 2 full blocks, registered in that very step."""
    (off, on), summary = bench_prefix_cache("tiny", num_requests=3, prefix_len=32, max_tokens=2, seed=0, rounds=2,
                                            together=True, device="cpu", dtype="float32", max_model_len=128,
                                            num_kv_blocks=32)
    assert summary["together"] and summary["all_outputs_identical"] and on["arrival"] == "all together"
    assert off["cached_tokens"] == 0 and on["cached_tokens"] == 2 * 2 * 32
    assert on["prefill_tokens"] == off["prefill_tokens"] - 2 * 2 * 32
