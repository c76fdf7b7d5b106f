"""Property: any values given to SamplingParams are refused with an error naming the field, or are
served by the engine without failing it."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minillm import LLM, SamplingParams

EXTREME_INTS = st.sampled_from([0, 1, -1, -2, 2**31 - 1, 2**31, 2**63 - 1, 2**63, 2**64 - 1, 2**64, -2**63, 10**30])
EXTREME_FLOATS = st.sampled_from([0.0, 1e-320, 0.5, 1.0, 2.0, 3e38, 1e300, -0.5, math.nan, math.inf, -math.inf])
ODD_TYPES = st.sampled_from([True, False, "1", None, [1], 1.5])
ANY_INT = st.one_of(EXTREME_INTS, st.integers(), ODD_TYPES)
ANY_FLOAT = st.one_of(EXTREME_FLOATS, st.floats(), EXTREME_INTS, ODD_TYPES)
FIELDS = {"temperature": ANY_FLOAT, "top_p": ANY_FLOAT, "min_p": ANY_FLOAT, "top_k": ANY_INT, "seed": ANY_INT,
          "max_tokens": ANY_INT, "min_tokens": ANY_INT, "logprobs": ANY_INT, "prompt_logprobs": ANY_INT,
          "presence_penalty": ANY_FLOAT, "frequency_penalty": ANY_FLOAT, "repetition_penalty": ANY_FLOAT,
          "stop_token_ids": st.lists(ANY_INT, max_size=2)}
# One or two fields at a time, so that an accepted extreme value is not hidden behind another refused one.
KWARGS = st.lists(st.sampled_from(sorted(FIELDS)), min_size=1, max_size=2, unique=True).flatmap(
    lambda names: st.fixed_dictionaries({name: FIELDS[name] for name in names}))


@pytest.fixture(scope="module")
def llm() -> LLM:
    return LLM("tiny", dtype="float32", max_model_len=24, max_num_seqs=2)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(KWARGS)
def test_extreme_sampling_params_are_refused_by_name_or_served(llm, kwargs):
    try:
        params = SamplingParams(**kwargs)
    except (ValueError, TypeError) as e:
        assert any(name in str(e) for name in kwargs), f"{e} names none of {sorted(kwargs)}"
        return
    # The context is short, so even the largest max_tokens generates a few tokens.
    out = llm.generate(["x"], params, use_tqdm=False)[0].outputs[0]
    assert out.finish_reason in ("stop", "length") and all(0 <= t < 4096 for t in out.token_ids)
