"""The attention kernels on any batch the engine can hand them: hypothesis draws the batch (decode
rows, verification rows, prompt chunks on a cached prefix that ends anywhere in a block, empty
sequence rows and a CUDA graph's padding tokens), the model's shape (GQA groups that are not powers
of two, head dims that are not either), the pool (block size, int8 or not), the scale, the dtype,
and the GPU whose tiles the launcher picks. Each must match its PyTorch reference element by element,
and give zeros where there are no keys. The other kernel tests take hand-picked batches; this one
looks for the batch whose tile boundaries, block boundaries and masks meet in a way they miss."""

from __future__ import annotations

import contextlib

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("triton")

from test_kernels import DEVICE, DTYPES  # noqa: E402

from minillm.kernels.attention_reference import (  # noqa: E402
    dequantize_kv,
    paged_decode_attention_ref,
    paged_prefill_attention_ref,
    quantize_kv,
)
from minillm.kernels.paged_decode import paged_decode_attention  # noqa: E402
from minillm.kernels.paged_prefill import paged_prefill_attention  # noqa: E402
from minillm.kernels.random_inputs import paged_batch  # noqa: E402
from minillm.kernels.targets import TARGETS, aot_target  # noqa: E402

# The interpreter's own tiles (None), and each GPU's (the launchers size their tiles by the target).
GPUS = [None, *TARGETS] if DEVICE == "cpu" else [None]
# Element-wise: fp32 sums in another order; 16-bit inputs against the fp32 reference on the same
# values (the kernels round probabilities to the inputs' dtype before multiplying the values: 2^-11
# of each for fp16, 2^-8 for bf16).
TOLERANCE = {torch.float32: dict(atol=2e-5, rtol=1e-4), torch.float16: dict(atol=4e-3, rtol=4e-3),
             torch.bfloat16: dict(atol=2.5e-2, rtol=2.5e-2)}

shapes = st.fixed_dictionaries({
    "group": st.sampled_from([1, 2, 3, 4, 6, 8, 16]),
    "num_kv_heads": st.integers(1, 2),
    "head_dim": st.sampled_from([16, 40, 64, 80, 96, 128]),
    "block_size": st.sampled_from([4, 8, 16, 32]),
    "dtype": st.sampled_from(DTYPES),
    "int8": st.booleans(),
    "large_scale": st.booleans(),  # scale 1, not 1/√d: scores √d times larger, for the running maximum
    "gpu": st.sampled_from(GPUS),
    "seed": st.integers(0, 2 ** 16),
})


@st.composite
def sequence_rows(draw) -> list[tuple[int, int]]:
    """(cached context, new queries) per sequence row, as a step of the engine may mix them, the last
    possibly a CUDA graph's padding tokens: queries with no keys at all (context -n)."""
    kinds = {
        "decode": st.tuples(st.integers(1, 140), st.just(1)),
        "verification": st.tuples(st.integers(1, 90), st.integers(2, 6)),
        "prompt chunk": st.tuples(st.integers(0, 90), st.integers(1, 70)),
        "padding row": st.just((0, 0)),
    }
    rows = draw(st.lists(st.sampled_from(list(kinds)).flatmap(kinds.get), min_size=1, max_size=6))
    padding_tokens = draw(st.integers(0, 9))
    return rows + [(-padding_tokens, padding_tokens)] if padding_tokens else rows


def pool(seq_lens: list[int], shape: dict) -> tuple:
    """A random pool: (k_cache, v_cache, the int8 scales as keywords or none), the block tables and
    seq_lens, and the pool as the kernels see it, in fp32 for the reference: an int8 pool's values
    dequantized to the queries' dtype, as the kernels dequantize them."""
    k_cache, v_cache, tables, lens = paged_batch([max(n, 1) for n in seq_lens], shape["num_kv_heads"],
                                                 shape["head_dim"], shape["block_size"], torch.float32,
                                                 shape["seed"], DEVICE)
    lens = torch.tensor(seq_lens, dtype=torch.int32, device=DEVICE)
    if not shape["int8"]:
        k_cache, v_cache = k_cache.to(shape["dtype"]), v_cache.to(shape["dtype"])
        return (k_cache, v_cache, {}), tables, lens, (k_cache.float(), v_cache.float())
    (k_q, k_s), (v_q, v_s) = quantize_kv(k_cache), quantize_kv(v_cache)
    seen = tuple(dequantize_kv(x, s, shape["dtype"]).float() for x, s in ((k_q, k_s), (v_q, v_s)))
    return (k_q, v_q, dict(k_scales=k_s, v_scales=v_s)), tables, lens, seen


def queries(tokens: int, shape: dict) -> tuple[torch.Tensor, float]:
    heads = shape["group"] * shape["num_kv_heads"]
    q = torch.randn(tokens, heads, shape["head_dim"], generator=torch.Generator().manual_seed(shape["seed"] + 1))
    scale = 1.0 if shape["large_scale"] else shape["head_dim"] ** -0.5
    return q.to(DEVICE, shape["dtype"]), scale


def launched_on(gpu: int | None) -> contextlib.AbstractContextManager:
    return aot_target(TARGETS[gpu]) if gpu is not None else contextlib.nullcontext()


# A GPU compiles each new shape (a second or two each): fewer examples there, in the GPU check's time.
@settings(max_examples=40 if DEVICE == "cpu" else 12, deadline=None, derandomize=True)
@given(shape=shapes, rows=sequence_rows(), query_bound=st.sampled_from(["exact", "bucket"]))
def test_the_ragged_kernel_matches_the_reference_on_any_mix(shape, rows, query_bound):
    """max_query_len is the longest row's count, or a bound the engine knows without reading the batch
    (a padded step passes its token count): it picks the tiles, never what they compute."""
    new = [n for _, n in rows]
    seq_lens = [c + n for c, n in rows]
    (k_cache, v_cache, scales), tables, lens, (k_seen, v_seen) = pool(seq_lens, shape)
    cu = torch.tensor([0, *torch.tensor(new).cumsum(0).tolist()], dtype=torch.int32, device=DEVICE)
    q, scale = queries(sum(new), shape)
    max_query_len = max(new) if query_bound == "exact" else sum(new)
    with launched_on(shape["gpu"]):
        out = paged_prefill_attention(q, k_cache, v_cache, cu, lens, tables, scale, max_query_len=max_query_len,
                                      **scales)
    ref = paged_prefill_attention_ref(q.float(), k_seen, v_seen, cu, lens, tables, scale)
    torch.testing.assert_close(out.float(), ref, **TOLERANCE[shape["dtype"]])
    if rows[-1][0] < 0:  # the padding tokens: no keys, zeros
        assert not out[cu[-2]:].any()


@settings(max_examples=30 if DEVICE == "cpu" else 10, deadline=None, derandomize=True)
@given(shape=shapes, seq_lens=st.lists(st.integers(0, 300), min_size=1, max_size=6),
       partition_blocks=st.integers(1, 8), graph_len=st.sampled_from([None, 512]))
def test_the_split_kv_decode_kernel_matches_the_reference_on_any_batch(shape, seq_lens, partition_blocks,
                                                                       graph_len):
    """Partitions of any whole number of blocks and of 16-key tiles (the kernel's least), rows of
    length 0 (a graph's padding), and max_seq_len the longest row or a graph's bound: partitions
    past a row's end, or past every row's, hold no key and must not disturb the merge."""
    partition_size = max(shape["block_size"], 16) * partition_blocks
    (k_cache, v_cache, scales), tables, lens, (k_seen, v_seen) = pool(seq_lens, shape)
    q, scale = queries(len(seq_lens), shape)
    max_seq_len = graph_len or max(max(seq_lens), 1)
    with launched_on(shape["gpu"]):
        out = paged_decode_attention(q, k_cache, v_cache, tables, lens, scale, max_seq_len=max_seq_len,
                                     partition_size=partition_size, **scales)
    real = [i for i, n in enumerate(seq_lens) if n]
    if real:
        ref = paged_decode_attention_ref(q[real].float(), k_seen, v_seen, tables[real], lens[real], scale)
        torch.testing.assert_close(out[real].float(), ref, **TOLERANCE[shape["dtype"]])
    assert not out[[i for i, n in enumerate(seq_lens) if not n]].any()
