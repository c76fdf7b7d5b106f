"""The decoder layer's fused kernels on any shape a model can give them: hypothesis draws the token
count, the widths (RMSNorm and SiLU rows of any length, head counts and head dims that are not powers
of two, MHA to MQA), rows of a wider tensor, positions anywhere in the rotary table, Qwen3's q/k
norm, and a paged pool (block size, int8 or not) whose slots are scattered, with padding tokens at
slot -1. Each must match its PyTorch reference and leave every slot it was not given as it was.
test_layer_kernels.py takes a few shapes by hand; this looks for the one they miss."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("triton")

from test_layer_kernels import DEVICE, DTYPES, check_stored, close, paged_pool, signed  # noqa: E402

from minillm.kernels.activation import silu_and_mul  # noqa: E402
from minillm.kernels.layer_reference import (  # noqa: E402
    fused_add_rms_norm_ref,
    fused_rotary_store_kvcache_ref,
    rms_norm_ref,
    silu_and_mul_ref,
)
from minillm.kernels.rms_norm import fused_add_rms_norm, rms_norm  # noqa: E402
from minillm.kernels.rotary_store import fused_rotary_store_kvcache  # noqa: E402
from minillm.layers.rotary import cos_sin_cache, rope_inv_freq  # noqa: E402

EXAMPLES = 60 if DEVICE == "cpu" else 15  # a GPU compiles each new shape: fewer there
MAX_POSITION = 1024


@settings(max_examples=EXAMPLES, deadline=None, derandomize=True)
@given(rows=st.integers(1, 24), dim=st.integers(1, 3000), margin=st.integers(0, 40), dtype=st.sampled_from(DTYPES),
       seed=st.integers(0, 2 ** 16))
def test_row_kernels_match_their_references_on_any_width(rows, dim, margin, dtype, seed):
    """RMSNorm on rows of a wider tensor, the fused residual add in place, SiLU-and-mul on 2 x dim."""
    x = signed(rows, dim + margin, dtype=dtype, seed=seed, scale=3.0)[:, margin:]
    weight = signed(dim, dtype=dtype, seed=seed + 1)
    close(rms_norm(x, weight, 1e-6), rms_norm_ref(x, weight, 1e-6), dtype)
    x, residual = signed(rows, dim, dtype=dtype, seed=seed + 2), signed(rows, dim, dtype=dtype, seed=seed + 3, scale=10)
    ref_out, ref_residual = fused_add_rms_norm_ref(x.clone(), residual.clone(), weight, 1e-5)
    fused_add_rms_norm(x, residual, weight, 1e-5)
    assert torch.equal(residual, ref_residual)
    close(x, ref_out, dtype)
    gate_up = signed(rows, 2 * dim, dtype=dtype, seed=seed + 4, scale=4.0)
    close(silu_and_mul(gate_up), silu_and_mul_ref(gate_up), dtype)


@st.composite
def attention_shapes(draw) -> dict:
    kv_heads = draw(st.integers(1, 6))
    return dict(kv_heads=kv_heads, heads=kv_heads * draw(st.sampled_from([1, 2, 3, 4, 8])),
                head_dim=draw(st.sampled_from([16, 32, 48, 64, 80, 96, 128])), qk_norm=draw(st.booleans()),
                int8=draw(st.booleans()), block_size=draw(st.sampled_from([1, 4, 16, 32])))


@settings(max_examples=EXAMPLES, deadline=None, derandomize=True)
@given(shape=attention_shapes(), tokens=st.integers(1, 24), padding=st.integers(0, 4), dtype=st.sampled_from(DTYPES),
       seed=st.integers(0, 2 ** 16))
def test_the_fused_rotary_store_matches_its_reference_on_any_shape(shape, tokens, padding, dtype, seed):
    """q, k and v as views of one qkv row, as the model has them; the last `padding` tokens are a CUDA
    graph's, at slot -1."""
    heads, kv_heads, head_dim = shape["heads"], shape["kv_heads"], shape["head_dim"]
    table = cos_sin_cache(rope_inv_freq(head_dim, 10000.0, {}), MAX_POSITION, dtype, torch.device(DEVICE))
    positions = torch.randint(0, MAX_POSITION, (tokens + padding,), generator=torch.Generator().manual_seed(seed))
    positions = positions.to(DEVICE)
    qkv = signed(tokens + padding, (heads + 2 * kv_heads) * head_dim, dtype=dtype, seed=seed, scale=2.0)
    q, k, v = (t.view(tokens + padding, -1, head_dim)
               for t in qkv.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1))
    norms = dict(q_norm_weight=signed(head_dim, dtype=dtype, seed=seed + 1) + 1,
                 k_norm_weight=signed(head_dim, dtype=dtype, seed=seed + 2) + 1, eps=1e-6) if shape["qk_norm"] else {}
    block_size = shape["block_size"]
    # Room for twice the tokens, so that their slots are scattered among untouched ones.
    caches, scales, slots = paged_pool(tokens + padding, kv_heads, head_dim, dtype, shape["int8"], seed,
                                       num_blocks=-(-(2 * (tokens + padding) + block_size) // block_size),
                                       block_size=block_size, padding=range(tokens, tokens + padding))
    before = [t.clone() for t in (*caches, *scales.values())]
    expected = [t.clone() for t in before]
    ref_q = fused_rotary_store_kvcache_ref(positions, q, k, v, table, expected[0], expected[1], slots,
                                           **norms, **dict(zip(scales, expected[2:])))
    out_q = fused_rotary_store_kvcache(positions, q, k, v, table, *caches, slots, **norms, **scales)
    close(out_q, ref_q, dtype)
    check_stored(caches, scales, expected, before, slots, shape["int8"], dtype)
