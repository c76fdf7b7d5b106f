"""The decoder layer's fused Triton kernels (RMSNorm alone and after the residual add, in place;
rotary embedding from the cos/sin table, alone and with Qwen3's q/k norm and the paged KV store;
SiLU-and-mul) against their PyTorch references, on random signed inputs of ragged sizes and in the
layouts the model hands them (rows of a wider tensor, q, k and v as views of the qkv projection's
output). Under the CPU interpreter: fp32 and fp16."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import torch

pytest.importorskip("triton")

from minillm.kernels.activation import silu_and_mul  # noqa: E402
from minillm.kernels.layer_reference import (  # noqa: E402
    fused_add_rms_norm_ref,
    fused_rotary_store_kvcache_ref,
    rms_norm_ref,
    rotary_embedding_ref,
    silu_and_mul_ref,
)
from minillm.kernels.rms_norm import fused_add_rms_norm, rms_norm  # noqa: E402
from minillm.kernels.rotary import rotary_embedding  # noqa: E402
from minillm.kernels.rotary_store import fused_rotary_store_kvcache  # noqa: E402
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
def test_fused_add_rms_norm_updates_both_inputs_in_place_as_the_reference(dtype, rows, dim):
    x, residual = signed(rows, dim, dtype=dtype, seed=2), signed(rows, dim, dtype=dtype, seed=3, scale=10.0)
    weight = signed(dim, dtype=dtype, seed=4)
    ref_out, ref_residual = fused_add_rms_norm_ref(x.clone(), residual.clone(), weight, 1e-5)
    out, new_residual = fused_add_rms_norm(x, residual, weight, 1e-5)
    assert out is x and new_residual is residual  # the sum over the residual, the norm over x
    assert torch.equal(residual, ref_residual)  # one rounding of one sum: exactly the reference's
    close(x, ref_out, dtype)
    # The reference is in place too, with transformers' rounding: the sum, then the norm of the sum.
    x0, r0 = signed(rows, dim, dtype=dtype, seed=2), signed(rows, dim, dtype=dtype, seed=3, scale=10.0)
    assert torch.equal(ref_residual, x0 + r0)
    assert torch.equal(ref_out, rms_norm_ref(x0 + r0, weight, 1e-5))


def test_fused_add_rms_norm_refuses_an_input_it_cannot_update_in_place():
    x = signed(4, 128, dtype=torch.float32, seed=5)
    with pytest.raises(ValueError, match="updates x in place: it must be contiguous"):
        fused_add_rms_norm(x[:, :64], x[:, 64:], torch.ones(64, device=DEVICE), 1e-5)


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


def paged_pool(tokens: int, kv_heads: int, head_dim: int, dtype: torch.dtype, int8: bool, seed: int, *,
               num_blocks: int = 6, block_size: int = 16, padding: Sequence[int] = (2,)):
    """A pool of num_blocks blocks of block_size slots filled with noise, its scales if int8, and slots for
    `tokens` tokens in scattered places, those at the indices `padding` padding rows (slot -1)."""
    g = torch.Generator().manual_seed(seed)
    shape = (num_blocks, block_size, kv_heads, head_dim)
    if int8:
        caches = [torch.randint(-127, 128, shape, generator=g, dtype=torch.int8).to(DEVICE) for _ in range(2)]
        scales = {name: torch.rand(shape[:-1], generator=g).to(DEVICE) for name in ("k_scales", "v_scales")}
    else:
        caches, scales = [torch.randn(shape, generator=g).to(dtype).to(DEVICE) for _ in range(2)], {}
    slots = torch.randperm(num_blocks * block_size, generator=g)[:tokens].to(torch.int32).to(DEVICE)
    slots[list(padding)] = -1
    return caches, scales, slots


def check_stored(caches: list[torch.Tensor], scales: dict, expected: list[torch.Tensor], before: list[torch.Tensor],
                 slots: torch.Tensor, int8: bool, dtype: torch.dtype) -> None:
    """The pool (caches, then scales) as the reference left `expected`, and slots of no token, the padding
    rows' included, as they were `before`."""
    # A scale is a head's largest |k| over 127: a last-place difference in a rotated k (the GPU's fused
    # multiply-adds) moves it by up to one ulp of the dtype.
    for got, want in zip(scales.values(), expected[2:]):
        torch.testing.assert_close(got, want, rtol=max(torch.finfo(dtype).eps, 1e-5), atol=1e-7)
    for got, want in zip(caches, expected[:2]):
        if int8:  # rounding ties (and a last-place difference in a rotated k) may move a value one level
            assert (got.int() - want.int()).abs().max() <= 1
        else:
            close(got, want, dtype)
    untouched = torch.ones(caches[0].shape[0] * caches[0].shape[1], dtype=torch.bool, device=DEVICE)
    untouched[slots[slots >= 0].long()] = False
    for got, old in zip((*caches, *scales.values()), before):
        assert torch.equal(got.flatten(0, 1)[untouched], old.flatten(0, 1)[untouched])


# (tokens, heads, kv_heads, head_dim, int8 cache, Qwen3's q/k norm): ragged counts, GQA and MHA, a head
# dim that is not a power of two.
FUSED_CASES = [(3, 4, 2, 64, False, False), (11, 6, 2, 80, False, True), (5, 8, 8, 64, True, False),
               (7, 4, 1, 128, True, True)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tokens,heads,kv_heads,head_dim,int8,qk_norm", FUSED_CASES)
def test_fused_rotary_store_kvcache_matches_the_reference(dtype, tokens, heads, kv_heads, head_dim, int8, qk_norm):
    table = cos_sin_cache(rope_inv_freq(head_dim, 10000.0, {}), 2048, dtype, torch.device(DEVICE))
    positions = torch.randint(0, 2048, (tokens,), generator=torch.Generator().manual_seed(tokens)).to(DEVICE)
    qkv = signed(tokens, (heads + 2 * kv_heads) * head_dim, dtype=dtype, seed=head_dim, scale=2.0)
    q, k, v = qkv.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
    q, k, v = (t.view(tokens, -1, head_dim) for t in (q, k, v))  # views, as the model has them
    norms = dict(q_norm_weight=signed(head_dim, dtype=dtype, seed=7) + 1, k_norm_weight=signed(
        head_dim, dtype=dtype, seed=8) + 1, eps=1e-6) if qk_norm else {}
    (k_cache, v_cache), scales, slots = paged_pool(tokens, kv_heads, head_dim, dtype, int8, seed=heads)
    expected = [t.clone() for t in (k_cache, v_cache, *scales.values())]
    ref_q = fused_rotary_store_kvcache_ref(positions, q, k, v, table, expected[0], expected[1], slots, **norms,
                                           **dict(zip(scales, expected[2:])))
    before = [t.clone() for t in (k_cache, v_cache, *scales.values())]
    out_q = fused_rotary_store_kvcache(positions, q, k, v, table, k_cache, v_cache, slots, **norms, **scales)
    close(out_q, ref_q, dtype)
    check_stored([k_cache, v_cache], scales, expected, before, slots, int8, dtype)
