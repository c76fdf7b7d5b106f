"""On a CUDA GPU: parity with transformers in bfloat16, CUDA-graph decode against eager steps, a
greedy decode step that waits for the device only to read its tokens and sends its inputs in one
copy, a draft model that never waits for its k drafts, and a greedy speculative step that waits
once in all.
Skipped where there is no GPU (CI has none); run it on one with `pytest tests/kernels/test_gpu.py`, or with
every other GPU test and benchmark through scripts/gpu_check.sh."""

from __future__ import annotations

import warnings

import pytest
import torch
from conftest import HF_CONFIGS, make_hf_model

from minillm import LLM, SamplingParams
from minillm.engine.model_runner import sequence_logits
from minillm.utils.device import cuda_bf16_native
from minillm.utils.staging import StagingArena

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.skipif(torch.cuda.is_available() and not cuda_bf16_native(), reason="no native bfloat16 below cc 8.0")
@pytest.mark.parametrize("kind", HF_CONFIGS)
def test_bf16_parity_on_cuda(kind, tmp_path):
    hf = make_hf_model(kind)
    hf.save_pretrained(tmp_path)
    hf = hf.to("cuda", torch.bfloat16)
    llm = LLM(str(tmp_path), skip_tokenizer_init=True, device="cuda", dtype="bfloat16")
    prompts = [torch.randint(0, 512, (n,), generator=torch.Generator().manual_seed(n)).tolist() for n in (1, 33, 100)]
    logits = sequence_logits(llm.llm_engine.model, prompts)
    for p, ours in zip(prompts, logits):
        ref = hf(torch.tensor([p], device="cuda")).logits[0].float()
        scale = ref.abs().max()
        # bf16 keeps 8 bits of mantissa: two implementations agree to a few units of 2^-8 of the scale.
        assert (ours - ref).abs().max() <= 0.04 * scale, f"{kind}: {((ours - ref).abs().max() / scale):.3f}"
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    for p, out in zip(prompts, llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)):
        ids = torch.tensor([p], device="cuda")
        ref = hf.generate(ids, do_sample=False, max_new_tokens=16, min_new_tokens=16, output_logits=True,
                          return_dict_in_generate=True)
        expected = ref.sequences[0, len(p):].tolist()
        ours = out.outputs[0].token_ids
        # Token for token, except that after a near-tie (top two within bf16 noise) the two may
        # legitimately take different branches.
        for i, (a, b) in enumerate(zip(ours, expected)):
            if a != b:
                top2 = ref.logits[i][0].float().topk(2).values
                assert top2[0] - top2[1] <= 0.04 * top2[0].abs(), f"{kind}: diverged at token {i} without a near-tie"
                break


class CountingGraph:
    def __init__(self, graph):
        self.graph, self.replays = graph, 0

    def replay(self):
        self.replays += 1
        self.graph.replay()


@pytest.mark.parametrize("quantization", [None, "int4"])
def test_cuda_graph_decode_matches_eager(hf_checkpoint, quantization):
    """Replayed graphs against eager launches, float32: the same greedy tokens, logprobs within
    rounding (the graph's attention splits the context into partitions for max_model_len, not for
    the batch's longest sequence, so sums are ordered differently)."""
    _, path = hf_checkpoint("llama_gqa_tied")
    prompts = [{"prompt_token_ids": list(range(1 + i, 9 + 7 * i))} for i in range(6)]
    params = [SamplingParams(temperature=0, max_tokens=4 + 5 * i, ignore_eos=True, logprobs=1) for i in range(6)]
    args = dict(skip_tokenizer_init=True, dtype="float32", device="cuda", max_num_seqs=8, quantization=quantization,
                quant_group_size=32)
    graphed = LLM(str(path), **args)
    graphs = graphed.llm_engine.model_runner.cuda_graphs
    assert sorted(b.num_seqs for b in graphs.graphs if b.uniform_decode) == [1, 2, 4, 8]
    assert graphs.capture_seconds > 0
    graphs.graphs = {batch: CountingGraph(g) for batch, g in graphs.graphs.items()}
    eager = LLM(str(path), enforce_eager=True, **args)
    assert eager.llm_engine.model_runner.cuda_graphs is None

    def run(llm):
        outs = llm.generate(prompts, params, use_tqdm=False)
        return [(o.outputs[0].token_ids, [e[t].logprob for e, t in zip(o.outputs[0].logprobs, o.outputs[0].token_ids)])
                for o in outs]

    for (tokens, logprobs), (ref_tokens, ref_logprobs) in zip(run(graphed), run(eager)):
        assert tokens == ref_tokens
        assert logprobs == pytest.approx(ref_logprobs, abs=1e-3)
    assert sum(g.replays for b, g in graphs.graphs.items() if b.uniform_decode) >= 20
    assert sum(g.replays for b, g in graphs.graphs.items() if not b.uniform_decode) >= 1  # the prefill


def test_inputs_are_staged_through_pinned_host_arrays():
    arena = StagingArena("cuda")
    buffer = arena.buffer(8, dtype=torch.int32, fill=7)
    tables = arena.buffer(3, 4, dtype=torch.int32, fill=5)
    assert buffer.cpu.is_pinned() and buffer.cpu.data_ptr() == buffer.np.ctypes.data
    torch.cuda._sleep(50_000_000)  # the stream busy for a while: the first flush's copy is still queued...
    first = buffer.stage([1, 2, 3], num_rows=5, pad=-1)
    arena.flush()
    first = first.clone()
    buffer.stage([9, 8])  # ...when the next step writes the block: it must wait for that copy
    rows = tables.stage_rows([[1, 2, 3], [4]], width=3)
    arena.flush()
    assert first.tolist() == [1, 2, 3, -1, -1]
    assert buffer.tensor.tolist() == [9, 8, 3, -1, -1, 7, 7, 7]
    assert rows.tolist() == [[1, 2, 3], [4, 0, 0]] and tables.tensor[2].tolist() == [5] * 4
    assert arena.num_copies == 2  # a copy a flush, both buffers in the second


def decoding_engine(**kwargs):
    """tiny on the GPU with three greedy requests past their first decode step."""
    engine = LLM("tiny", device="cuda", skip_tokenizer_init=True, **kwargs).llm_engine
    assert engine.model_runner.cuda_graphs is not None
    params = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    for i in range(3):
        engine.add_request(f"greedy-{i}", {"prompt_token_ids": [1 + i] * (5 + i)}, params)
    while engine.scheduler.waiting or any(seq.num_output_tokens == 0 for seq in engine.scheduler.running):
        engine.step()
    engine.step()  # the first decode step of this batch
    torch.cuda.synchronize()
    return engine


def syncs_of(fn) -> tuple[list[str], object]:
    """The host's waits for the device while fn runs, as torch's sync debug mode reports them; and
    what fn returned."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            result = fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    # torch's first warning in this mode says the mode is a prototype; each sync is its own warning
    return [str(w.message) for w in caught if "called a synchronizing CUDA operation" in str(w.message)], result


def test_an_all_greedy_decode_step_makes_no_synchronizing_call():
    """The argmax stays on the device, the inputs are queued, not waited for, and the sampled ids come
    back by a copy queued into pinned memory, waited for on its event (`SampledTokens`): a greedy decode
    step makes no call that synchronizes the device."""
    engine = decoding_engine()
    syncs, outputs = syncs_of(engine.step)
    assert sorted(out.request_id for out in outputs) == [f"greedy-{i}" for i in range(3)]
    assert not syncs, syncs


def test_the_draft_model_never_waits_for_the_device():
    """Each draft step feeds the last one's tokens on the device, and the drafts stay there for the
    target: k draft steps, no wait."""
    engine = decoding_engine(speculative_config={"model": "tiny-draft", "num_speculative_tokens": 4})
    runner = engine.model_runner
    batch = engine.scheduler.schedule()
    assert batch.num_spec_tokens == [4, 4, 4]
    syncs, proposal = syncs_of(lambda: runner.proposer.propose(batch.seqs, batch.num_spec_tokens))
    assert not syncs, syncs
    assert proposal.on_device and [len(drafts) for drafts in proposal.token_ids] == [4, 4, 4]


def test_a_greedy_speculative_step_waits_for_the_device_once():
    """To read the drafts and the target's tokens together: the drafts go into the target's input on
    the device, and the greedy rejection sampler decides on the host from what it read back."""
    engine = decoding_engine(speculative_config={"model": "tiny-draft", "num_speculative_tokens": 4})
    assert engine.model_runner.proposer.advance_graphs
    syncs, outputs = syncs_of(engine.step)
    assert sorted(out.request_id for out in outputs) == [f"greedy-{i}" for i in range(3)]
    assert len(syncs) == 1, syncs


@pytest.mark.parametrize("kwargs,copies", [({}, 1), ({"async_scheduling": True}, 1),
                                           ({"speculative_config": {"model": "tiny-draft",
                                                                    "num_speculative_tokens": 4}}, 2)])
def test_a_replayed_step_sends_its_inputs_in_one_copy(kwargs, copies):
    """Token ids, positions, logits rows and the attention metadata of a graphed step, staged in pinned
    memory and sent in one copy (utils/staging.py); a speculative step sends the draft's first step's
    and the target's."""
    engine = decoding_engine(**kwargs)
    arena = engine.model_runner.buffers.arena
    assert arena.host.is_pinned()
    before = arena.num_copies
    for _ in range(4):
        engine.step()
    assert arena.num_copies - before == 4 * copies
