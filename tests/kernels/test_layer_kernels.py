"""The decoder layer's fused Triton kernels (RMSNorm alone and after the residual add, rotary
embedding from the cos/sin table, SiLU-and-mul) against their PyTorch references, on random signed
inputs of ragged sizes and in the layouts the model hands them (rows of a wider tensor, q and k as
views of the qkv projection's output). Under the CPU interpreter: fp32 and fp16."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from minillm.kernels.activation import silu_and_mul  # noqa: E402
from minillm.kernels.layer_reference import (  # noqa: E402
    fused_add_rms_norm_ref,
    rms_norm_ref,
    rotary_embedding_ref,
    silu_and_mul_ref,
)
from minillm.kernels.rms_norm import fused_add_rms_norm, rms_norm  # noqa: E402
from minillm.kernels.rotary import rotary_embedding  # noqa: E402
from minillm.layers.rotary import cos_sin_cache, rope_inv_freq  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if DEVICE == "cuda" else [])


def close(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype) -> None:
    """fp32: the same function up to rounding; half precision: within one unit in the last place of
    the larger values (the kernel and the reference may round an fp32 intermediate differently)."""
    assert out.dtype == ref.dtype and out.shape == ref.shape
    tol = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}[dtype]
    torch.testing.assert_close(out.float(), ref.float(), rtol=tol, atol=tol)


def signed(*shape, dtype, seed, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * scale).to(dtype).to(DEVICE)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,dim", [(1, 64), (7, 96), (33, 256)])
def test_rms_norm_matches_reference(dtype, rows, dim):
    wide = signed(rows, dim + 32, dtype=dtype, seed=rows, scale=3.0)
    x = wide[:, 16:16 + dim]  # a row stride wider than the row
    weight = signed(dim, dtype=dtype, seed=1)
    close(rms_norm(x, weight, 1e-6), rms_norm_ref(x, weight, 1e-6), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,dim", [(1, 64), (5, 160), (19, 512)])
def test_fused_add_rms_norm_matches_reference_and_returns_the_sum(dtype, rows, dim):
    x, residual = signed(rows, dim, dtype=dtype, seed=2), signed(rows, dim, dtype=dtype, seed=3, scale=10.0)
    weight = signed(dim, dtype=dtype, seed=4)
    out, new_residual = fused_add_rms_norm(x, residual, weight, 1e-5)
    ref_out, ref_residual = fused_add_rms_norm_ref(x, residual, weight, 1e-5)
    assert torch.equal(new_residual, ref_residual)  # one rounding of one sum: exactly the reference's
    close(out, ref_out, dtype)
    assert torch.equal(residual, signed(rows, dim, dtype=dtype, seed=3, scale=10.0))  # inputs untouched


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tokens,d", [(1, 48), (6, 1000), (3, 2816)])  # 2816: several blocks a row
def test_silu_and_mul_matches_reference(dtype, tokens, d):
    x = signed(tokens, 2 * d, dtype=dtype, seed=d, scale=4.0)
    close(silu_and_mul(x), silu_and_mul_ref(x), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads,kv_heads,head_dim", [(4, 2, 64), (15, 5, 64), (6, 2, 80), (8, 8, 128)])
def test_rotary_embedding_matches_reference(dtype, heads, kv_heads, head_dim):
    tokens = 9
    cache = cos_sin_cache(rope_inv_freq(head_dim, 10000.0, {}), 4096, dtype, torch.device(DEVICE))
    positions = torch.tensor([0, 1, 2, 3, 4095, 17, 17, 600, 0], device=DEVICE)  # repeats; the last row
    qkv = signed(tokens, (heads + 2 * kv_heads) * head_dim, dtype=dtype, seed=heads, scale=2.0)
    q, k, _ = qkv.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
    q, k = q.view(tokens, heads, head_dim), k.view(tokens, kv_heads, head_dim)  # views, as the model has them
    out_q, out_k = rotary_embedding(positions, q, k, cache)
    ref_q, ref_k = rotary_embedding_ref(positions, q, k, cache)
    close(out_q, ref_q, dtype)
    close(out_k, ref_k, dtype)
    # Position 0 is the identity rotation; a wrong pairing of channels would move it.
    torch.testing.assert_close(out_q[0], q[0])


def test_the_table_gives_the_angles_of_each_position():
    inv_freq = rope_inv_freq(8, 10000.0, {})
    cache = cos_sin_cache(inv_freq, 100, torch.float32, torch.device("cpu"))
    angles = 37 * inv_freq
    torch.testing.assert_close(cache[37], torch.cat((angles.cos(), angles.sin())))
