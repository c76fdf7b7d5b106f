"""Every Triton kernel against its PyTorch reference, on random signed inputs laid out the way the
engine lays them out: block tables drawn at random from a pool much larger than needed, sequences
of mixed lengths in one batch. Without a GPU the kernels run in Triton's CPU interpreter (conftest
sets TRITON_INTERPRET=1), where fp32 and fp16 work and bf16 does not."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from minillm.kernels import random_inputs  # noqa: E402
from minillm.kernels.attention_reference import (  # noqa: E402
    paged_decode_attention_ref,
    paged_decode_partitions_ref,
    paged_prefill_attention_ref,
    store_kvcache_ref,
)
from minillm.kernels.ops import load_ops  # noqa: E402
from minillm.kernels.paged_decode import paged_decode_attention, paged_decode_partitions  # noqa: E402
from minillm.kernels.paged_prefill import paged_prefill_attention  # noqa: E402
from minillm.kernels.store_kv import store_kvcache  # noqa: E402
from minillm.kernels.targets import TARGETS, aot_target  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if DEVICE == "cuda" else [])
TOLERANCE = {torch.float32: 1e-4, torch.float16: 2e-3, torch.bfloat16: 2e-2}  # relative, against fp32


def paged_batch(seq_lens, num_kv_heads, head_dim, block_size, dtype, seed):
    return random_inputs.paged_batch(seq_lens, num_kv_heads, head_dim, block_size, dtype, seed, DEVICE)


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.float() - ref.float()).norm() / ref.float().norm()).item()


def as_fp32(*tensors):
    return [t.float() for t in tensors]


# Every GQA ratio meets every head dim; block sizes alternate so that both meet both.
SHAPES = [(group, head_dim, (16, 32)[(i + j) % 2])
          for i, group in enumerate((1, 2, 4, 8)) for j, head_dim in enumerate((64, 80, 128))]


@pytest.mark.parametrize("group,head_dim,block_size", SHAPES)
def test_paged_decode_matches_reference(group, head_dim, block_size):
    seq_lens = [1, 17, 95, 300]
    num_kv_heads = 2
    k_cache, v_cache, tables, lens = paged_batch(seq_lens, num_kv_heads, head_dim, block_size, torch.float32,
                                                 seed=group * 1000 + head_dim)
    q = torch.randn(len(seq_lens), num_kv_heads * group, head_dim, generator=torch.Generator().manual_seed(1))
    q = q.to(DEVICE)
    scale = head_dim ** -0.5
    ref = paged_decode_attention_ref(q, k_cache, v_cache, tables, lens, scale)
    # One partition per sequence, and several (the split-KV path with its log-sum-exp merge).
    for partition_size in (512, 4 * block_size):
        out = paged_decode_attention(q, k_cache, v_cache, tables, lens, scale, partition_size=partition_size)
        assert relative_error(out, ref) < 1e-4, partition_size


def test_padding_rows_of_a_decode_batch_give_zeros():
    """A CUDA graph's batch is padded with rows of length 0: they must not turn into NaN (a softmax
    over no keys) and must leave the real rows as they are. The graph is captured for a long
    max_seq_len, so most partitions of every row are empty too."""
    seq_lens = [40, 0, 7, 0]
    k_cache, v_cache, tables, lens = paged_batch(seq_lens, 2, 64, 16, torch.float32, seed=5)
    q = torch.randn(4, 4, 64, generator=torch.Generator().manual_seed(6)).to(DEVICE)
    out = paged_decode_attention(q, k_cache, v_cache, tables, lens, 0.125, max_seq_len=1024, partition_size=64)
    real = [0, 2]
    ref = paged_decode_attention_ref(q[real], k_cache, v_cache, tables[real], lens[real], 0.125)
    assert relative_error(out[real], ref) < 1e-4
    assert torch.equal(out[[1, 3]], torch.zeros_like(out[[1, 3]]))


def test_the_split_kv_pass_matches_its_reference():
    """The first of the decode kernel's two passes on its own (exercise 03 merges its outputs): every
    partition's output and log-sum-exp, with partitions past a sequence's end and a padding row."""
    seq_lens = [100, 7, 0, 33]
    k_cache, v_cache, tables, lens = paged_batch(seq_lens, 2, 80, 16, torch.float32, seed=7)
    q = torch.randn(4, 8, 80, generator=torch.Generator().manual_seed(8)).to(DEVICE)
    part_out, lse = paged_decode_partitions(q, k_cache, v_cache, tables, lens, 0.1, partition_size=32)
    ref_out, ref_lse = paged_decode_partitions_ref(q, k_cache, v_cache, tables, lens, 0.1, partition_size=32)
    assert part_out.shape == ref_out.shape == (4, 8, 4, 80) and lse.shape == ref_lse.shape == (4, 8, 4)
    empty = ref_lse == float("-inf")
    assert torch.equal(lse == float("-inf"), empty) and empty[1, :, 1:].all() and empty[2].all()
    assert (lse - ref_lse)[~empty].abs().max() < 1e-4
    assert relative_error(part_out, ref_out) < 1e-4 and not part_out[empty].any()


@pytest.mark.parametrize("group,head_dim,block_size", SHAPES)
def test_paged_prefill_matches_reference(group, head_dim, block_size):
    # (cached prefix, new tokens) per sequence: a plain prompt, a decode-like single token, prompts
    # extending a prefix-cache hit that ends mid-block and on a block boundary; and a first query at
    # position 62, whose key tile 0..63 ends one key past what it may see (the kernel's key tiles
    # are 64 wide: only tiles wholly visible to a query tile may skip the causal mask).
    context, new = [0, 120, 37, 2 * block_size, 62], [70, 1, 45, 33, 40]
    seq_lens = [c + n for c, n in zip(context, new)]
    k_cache, v_cache, tables, lens = paged_batch(seq_lens, 1, head_dim, block_size, torch.float32,
                                                 seed=group * 1000 + head_dim)
    cu = torch.tensor([0, *torch.tensor(new).cumsum(0).tolist()], dtype=torch.int32, device=DEVICE)
    q = torch.randn(sum(new), group, head_dim, generator=torch.Generator().manual_seed(2)).to(DEVICE)
    scale = head_dim ** -0.5
    out = paged_prefill_attention(q, k_cache, v_cache, cu, lens, tables, scale)
    ref = paged_prefill_attention_ref(q, k_cache, v_cache, cu, lens, tables, scale)
    assert relative_error(out, ref) < 1e-4


@pytest.mark.parametrize("capability", [75, 90])
@pytest.mark.parametrize("dtype", DTYPES[:2], ids=["fp32", "fp16"])
def test_the_tiles_each_gpu_gets_compute_the_same(capability, dtype):
    """The tile sizes the launchers pick for a T4 and an H100 (tests/kernels/test_aot.py checks that they
    fit), run here, where the interpreter would otherwise pick its own."""
    seq_lens, group, head_dim = [5, 130, 70], 4, 128
    k_cache, v_cache, tables, lens = paged_batch(seq_lens, 2, head_dim, 16, dtype, seed=capability)
    gen = torch.Generator().manual_seed(capability)
    q = torch.randn(3, 2 * group, head_dim, generator=gen).to(DEVICE, dtype)
    qp = torch.randn(75, 2 * group, head_dim, generator=gen).to(DEVICE, dtype)
    cu = torch.tensor([0, 5, 65, 75], dtype=torch.int32, device=DEVICE)
    with aot_target(TARGETS[capability]):
        decode = paged_decode_attention(q, k_cache, v_cache, tables, lens, 0.1)
        prefill = paged_prefill_attention(qp, k_cache, v_cache, cu, lens, tables, 0.1)
    fp32 = as_fp32(q, k_cache, v_cache)
    assert relative_error(decode, paged_decode_attention_ref(*fp32, tables, lens, 0.1)) < TOLERANCE[dtype]
    ref = paged_prefill_attention_ref(*as_fp32(qp, k_cache, v_cache), cu, lens, tables, 0.1)
    assert relative_error(prefill, ref) < TOLERANCE[dtype]


@pytest.mark.parametrize("dtype", DTYPES[1:])
def test_half_precision_kernels_stay_close_to_fp32(dtype):
    seq_lens, group, head_dim, block_size = [5, 130], 4, 64, 16
    k_cache, v_cache, tables, lens = paged_batch(seq_lens, 2, head_dim, block_size, dtype, seed=7)
    q = torch.randn(2, 2 * group, head_dim, generator=torch.Generator().manual_seed(3)).to(DEVICE, dtype)
    ref = paged_decode_attention_ref(*as_fp32(q, k_cache, v_cache), tables, lens, 0.125)
    out = paged_decode_attention(q, k_cache, v_cache, tables, lens, 0.125, partition_size=64)
    assert out.dtype == dtype and relative_error(out, ref) < TOLERANCE[dtype]

    cu = torch.tensor([0, 5, 35], dtype=torch.int32, device=DEVICE)  # the second extends a 100-token prefix
    qp = torch.randn(35, 2 * group, head_dim, generator=torch.Generator().manual_seed(4)).to(DEVICE, dtype)
    ref = paged_prefill_attention_ref(*as_fp32(qp, k_cache, v_cache), cu, lens, tables, 0.125)
    out = paged_prefill_attention(qp, k_cache, v_cache, cu, lens, tables, 0.125)
    assert out.dtype == dtype and relative_error(out, ref) < TOLERANCE[dtype]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("num_kv_heads,head_dim", [(1, 64), (2, 80), (4, 128)])
def test_store_kvcache_matches_reference(dtype, num_kv_heads, head_dim):
    gen = torch.Generator().manual_seed(head_dim)
    shape = (12, 16, num_kv_heads, head_dim)
    k_cache, v_cache = (torch.randn(shape, generator=gen).to(DEVICE, dtype) for _ in range(2))
    k, v = (torch.randn(9, num_kv_heads, head_dim, generator=gen).to(DEVICE, dtype) for _ in range(2))
    # Scattered slots; -1 marks a token that has no slot and must not be written.
    slots = torch.randperm(12 * 16, generator=gen)[:9].to(DEVICE)
    slots[4] = -1
    before = k_cache.clone()
    expected_k, expected_v = k_cache.clone(), v_cache.clone()
    store_kvcache_ref(k, v, expected_k, expected_v, slots)
    store_kvcache(k, v, k_cache, v_cache, slots.to(torch.int32))
    assert torch.equal(k_cache, expected_k) and torch.equal(v_cache, expected_v)
    flat, keep = k_cache.view(-1, num_kv_heads, head_dim), slots >= 0
    assert torch.equal(flat[slots[keep]], k[keep])
    untouched = torch.ones(12 * 16, dtype=torch.bool, device=DEVICE)
    untouched[slots[keep]] = False
    assert torch.equal(flat[untouched], before.view(-1, num_kv_heads, head_dim)[untouched])


@pytest.mark.parametrize("block_size,partition_size", [(16, 24), (8, 24), (16, 0)])
def test_decode_rejects_partitions_its_tiles_cannot_cut(block_size, partition_size):
    """Partitions are whole blocks (24 tokens are not, in blocks of 16) and whole tiles of at least 16
    keys (24 tokens in blocks of 8 are three blocks, but not whole tiles), and hold some."""
    k_cache, v_cache, tables, lens = paged_batch([20], 1, 64, block_size, torch.float32, seed=0)
    with pytest.raises(ValueError, match=f"partition_size must be a positive multiple of block_size={block_size} "
                                         "and of 16"):
        paged_decode_attention(torch.zeros(1, 1, 64, device=DEVICE), k_cache, v_cache, tables, lens, 1.0,
                               partition_size=partition_size)


def test_blocks_longer_than_the_default_partition_are_a_partition_each():
    """The pool's blocks may hold up to 1,024 tokens; the decode kernel's partitions (512 tokens by
    default) must be whole blocks, so a longer block is one partition."""
    k_cache, v_cache, tables, lens = paged_batch([1500, 3, 1024], 1, 64, 1024, torch.float32, seed=4)
    q = torch.randn(3, 2, 64, generator=torch.Generator().manual_seed(5)).to(DEVICE)
    part_out, lse = paged_decode_partitions(q, k_cache, v_cache, tables, lens, 0.125)
    assert lse.shape == (3, 2, 2)  # two partitions of 1,024 tokens
    ref = paged_decode_attention_ref(q, k_cache, v_cache, tables, lens, 0.125)
    assert relative_error(paged_decode_attention(q, k_cache, v_cache, tables, lens, 0.125), ref) < 1e-4


def test_load_ops_gives_each_caller_its_own_namespace_of_the_same_ops():
    torch_ops, triton_ops = load_ops("torch"), load_ops("triton")
    assert vars(torch_ops).keys() == vars(triton_ops).keys() == {
        "kernel", "store_kvcache", "paged_decode_attention", "paged_prefill_attention", "int8_matmul", "int4_matmul",
        "rms_norm", "fused_add_rms_norm", "rotary_embedding", "fused_rotary_store_kvcache", "silu_and_mul"}
    # Every op has a Triton kernel of its own (the dense matmuls are torch's, outside the ops).
    assert all(getattr(triton_ops, name) is not getattr(torch_ops, name) for name in vars(torch_ops))
    assert (torch_ops.kernel, triton_ops.kernel) == ("torch", "triton")
    assert triton_ops.paged_decode_attention is paged_decode_attention
    assert torch_ops.paged_decode_attention is paged_decode_attention_ref
    # An exercise swaps an op in one engine's namespace; nobody else's changes.
    torch_ops.paged_decode_attention = None
    assert load_ops("torch").paged_decode_attention is paged_decode_attention_ref
    with pytest.raises(ValueError, match=r"kernel must be one of \('torch', 'triton'\), got 'cuda'"):
        load_ops("cuda")
