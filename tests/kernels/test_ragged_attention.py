"""The ragged paged-attention kernel (kernels/paged_prefill.py) on what a step of the engine mixes in
one launch: decode rows, verification rows, prompt chunks on a cached prefix, and a CUDA graph's
padding (sequence rows with no queries, and one that owns the padding tokens and has no keys); and
its launch, which must not depend on how a bucket's tokens are shared out."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from minillm.kernels import paged_prefill, random_inputs  # noqa: E402
from minillm.kernels.attention_reference import paged_prefill_attention_ref  # noqa: E402
from minillm.kernels.paged_prefill import paged_prefill_attention  # noqa: E402
from minillm.kernels.targets import TARGETS, aot_target  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

# (cached context, new queries) per sequence row: two decodes, a verification of k = 4, a prompt's
# first chunk, a chunk extending a prefix-cache hit that ends mid-block, a zero-length padding row,
# and the last row, a graph's padding tokens with no keys.
MIX = [(37, 1), (100, 1), (20, 5), (0, 40), (35, 19), (0, 0), (-3, 3)]


def ragged_batch(mix, group, head_dim, block_size, dtype, seed):
    seq_lens = [c + n for c, n in mix]
    k_cache, v_cache, tables, lens = random_inputs.paged_batch([max(n, 1) for n in seq_lens], 2, head_dim,
                                                               block_size, dtype, seed, DEVICE)
    lens = torch.tensor(seq_lens, dtype=torch.int32, device=DEVICE)
    new = [n for _, n in mix]
    cu = torch.tensor([0, *torch.tensor(new).cumsum(0).tolist()], dtype=torch.int32, device=DEVICE)
    q = torch.randn(sum(new), 2 * group, head_dim, generator=torch.Generator().manual_seed(seed)).to(DEVICE, dtype)
    return q, k_cache, v_cache, cu, lens, tables


def relative_error(out, ref):
    return ((out.float() - ref.float()).norm() / ref.float().norm()).item()


@pytest.mark.parametrize("group,head_dim,block_size", [(1, 64, 16), (4, 80, 16), (3, 32, 32), (8, 128, 16)])
def test_a_ragged_mix_matches_the_reference(group, head_dim, block_size):
    q, k_cache, v_cache, cu, lens, tables = ragged_batch(MIX, group, head_dim, block_size, torch.float32, group)
    out = paged_prefill_attention(q, k_cache, v_cache, cu, lens, tables, head_dim ** -0.5, max_query_len=40)
    ref = paged_prefill_attention_ref(q, k_cache, v_cache, cu, lens, tables, head_dim ** -0.5)
    assert relative_error(out, ref) < 1e-5
    assert not out[-3:].any()  # the padding tokens: no keys, zeros


@pytest.mark.parametrize("capability", [75, 90])
def test_the_tiles_of_each_gpu_compute_the_same(capability):
    """Big tiles for a bucket that may hold a prompt, small ones for decode and verification rows,
    as a T4 and an H100 get them (test_aot.py compiles them), in fp16."""
    q, k_cache, v_cache, cu, lens, tables = ragged_batch(MIX, 4, 128, 16, torch.float16, capability)
    ref = paged_prefill_attention_ref(q.float(), k_cache.float(), v_cache.float(), cu, lens, tables, 0.1)
    for max_query_len in (40, 128):
        with aot_target(TARGETS[capability]):
            out = paged_prefill_attention(q, k_cache, v_cache, cu, lens, tables, 0.1, max_query_len=max_query_len)
        assert relative_error(out, ref) < 2e-3, max_query_len
    short = MIX[:3]  # decodes and a verification: at most 5 queries each
    q, k_cache, v_cache, cu, lens, tables = ragged_batch(short, 4, 128, 16, torch.float16, capability)
    with aot_target(TARGETS[capability]):
        out = paged_prefill_attention(q, k_cache, v_cache, cu, lens, tables, 0.1, max_query_len=5)
    ref = paged_prefill_attention_ref(q.float(), k_cache.float(), v_cache.float(), cu, lens, tables, 0.1)
    assert relative_error(out, ref) < 2e-3


@pytest.mark.skipif(DEVICE == "cpu", reason="the interpreter runs no software pipeline: stages change nothing there")
@pytest.mark.parametrize("stages", [3, 5])
def test_deeper_pipelines_compute_the_same(stages, monkeypatch):
    """The pipelines the GPU check times (`bench attention --tilings MxNxWxS`), exact on the GPU before
    one becomes the launcher's: more stages are another schedule of the same loop, compiled anew."""
    monkeypatch.setattr(paged_prefill, "STAGES", stages)
    # The whole mix in a prompt's tiles, then decodes and a verification in the small ones.
    for mix, max_query_len in ((MIX, 40), (MIX[:3], 5)):
        q, k_cache, v_cache, cu, lens, tables = ragged_batch(mix, 4, 128, 16, torch.float16, stages)
        out = paged_prefill_attention(q, k_cache, v_cache, cu, lens, tables, 0.1, max_query_len=max_query_len)
        ref = paged_prefill_attention_ref(q.float(), k_cache.float(), v_cache.float(), cu, lens, tables, 0.1)
        assert relative_error(out, ref) < 2e-3, max_query_len


def test_the_int8_cache_in_a_ragged_mix():
    q, k_cache, v_cache, cu, lens, tables = ragged_batch(MIX, 4, 64, 16, torch.float32, 5)
    k_q, v_q = (cache.mul(40).round().clamp(-127, 127).to(torch.int8) for cache in (k_cache, v_cache))
    k_s, v_s = (torch.rand(k_cache.shape[:-1], generator=torch.Generator().manual_seed(s)).to(DEVICE) / 40
                for s in (1, 2))
    out = paged_prefill_attention(q, k_q, v_q, cu, lens, tables, 0.125, max_query_len=40, k_scales=k_s, v_scales=v_s)
    ref = paged_prefill_attention_ref(q, k_q, v_q, cu, lens, tables, 0.125, k_scales=k_s, v_scales=v_s)
    assert relative_error(out, ref) < 1e-5


def test_two_batches_of_one_bucket_get_the_same_launch(monkeypatch):
    """What a CUDA graph needs: 64 token rows and 9 sequence rows launch the same grid with the same
    tiles whether they hold a prompt chunk and decodes, or verifications, so one graph replays both.
    (A graph bakes in the scalar arguments too: the engine's block tables are always as wide as
    max_model_len needs, as these are.)"""
    launches = []

    class Recorder:
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                scalars = [a for a in args if not isinstance(a, torch.Tensor)]
                launches.append((grid, scalars, kwargs))
            return launch

    monkeypatch.setattr(paged_prefill, "_ragged_attention_kernel", Recorder())
    first = [(37, 1), (100, 1), (20, 5), (0, 40), (35, 9)] + [(0, 0)] * 3 + [(-8, 8)]
    second = [(20, 5)] * 8 + [(-24, 24)]
    for mix in (first, second):
        assert sum(n for _, n in mix) == 64 and len(mix) == 9
        q, k_cache, v_cache, cu, lens, tables = ragged_batch(mix, 4, 64, 16, torch.float16, 0)
        tables = torch.nn.functional.pad(tables, (0, 16 - tables.shape[1]))
        with aot_target(TARGETS[90]):
            paged_prefill_attention(q, k_cache, v_cache, cu, lens, tables, 0.1, max_query_len=64)
    assert len(launches) == 2 and launches[0] == launches[1]
    grid, _, kwargs = launches[0]
    assert grid == (64 // kwargs["BLOCK_Q"] + 9, 2)
