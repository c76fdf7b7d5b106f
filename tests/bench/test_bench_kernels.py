"""`minillm bench kernels`: the launch counter counts what launches, once, in the right place."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import make_hf_model
from test_cli import minillm

from minillm import LLM
from minillm.bench.kernels import LaunchCounter, count_step_launches


def test_views_and_allocations_launch_nothing_computations_launch_once():
    x = torch.randn(4, 6)
    with LaunchCounter() as counter:
        y = x.view(6, 4).t().unsqueeze(0)[0]  # views
        torch.empty(3)
        torch.empty_like(x)
        z = y * 2 + 1  # two kernels
        z.sum()
    assert counter.counts == {("outside", "mul"): 1, ("outside", "add"): 1,
                              ("outside", "sum"): 1}


def test_a_triton_launch_counts_once_and_hides_the_ops_inside_it():
    counter = LaunchCounter()

    def interpreted_kernel(a):  # the CPU interpreter moves data with aten ops of its own
        return (a.clone() + 1).exp()

    launch = counter.count_triton("my_kernel", interpreted_kernel)
    a = torch.ones(3)
    with counter:
        counter.where = "layer 0"
        launch(a)
        a.neg()
    assert counter.counts == {("layer 0", "triton:my_kernel"): 1, ("layer 0", "neg"): 1}


def test_an_engine_step_is_charged_to_its_layers_and_the_rest():
    llm = LLM("tiny", device="cpu", dtype="float32", skip_tokenizer_init=True, enforce_eager=True,
              enable_prefix_caching=False, max_num_seqs=2, max_model_len=128, num_kv_blocks=32)
    one = count_step_launches(llm, batch=1, steps=2)
    two = count_step_launches(llm, batch=2, steps=2)
    assert one["layers"] == llm.llm_engine.model_config.num_hidden_layers
    assert one["per_step"] == one["per_layer"] * one["layers"] + one["outside_per_step"]
    assert sum(one["by_layer"]) == one["per_layer"] * one["layers"]
    assert sum(one["layer_ops"].values()) == one["by_layer"][-1]
    # RMSNorm twice, attention, four matmuls (qkv, o, gate_up, down), SiLU: at least these per layer.
    assert one["layer_ops"]["linear"] == 4 and one["layer_ops"]["rsqrt"] == 2 and one["per_layer"] >= 10
    # The count is of launches, not of work: a second sequence launches nothing more.
    assert two["per_layer"] == one["per_layer"]
    assert llm.llm_engine.ops.rms_norm.__module__.endswith("_reference")  # restored afterwards


def test_bench_kernels_prints_the_count_and_writes_it(tmp_path):
    out = tmp_path / "kernels.json"
    result = minillm("bench", "kernels", "--models", "tiny", "--kernels", "torch", "--steps", "1", "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert "launches per layer" in result.stdout and "the last layer of tiny (torch): " in result.stdout
    payload = json.loads(out.read_text())
    assert payload["rows"][0]["per_layer"] == payload["summary"]["tiny torch per_layer"] > 0


@pytest.mark.parametrize("kind", ["tiny", "qwen3_qk_norm"])
def test_a_decoder_layer_is_at_most_ten_launches_with_the_triton_kernels(kind, tmp_path):
    """The fused kernels' point: two norms with their residual adds, four matmuls, rotary embedding
    with the KV store (and Qwen3's q/k norm), attention and SiLU-and-mul. Counted on the GPU where
    there is one, else under the CPU interpreter, which launches the same kernels."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = "tiny"
    if kind != "tiny":
        make_hf_model(kind).save_pretrained(model := str(tmp_path))
    llm = LLM(model, device=device, dtype="float32", skip_tokenizer_init=True, enforce_eager=True,
              attention_backend="triton", enable_prefix_caching=False, max_num_seqs=1, max_model_len=128,
              num_kv_blocks=16)
    launches = count_step_launches(llm, batch=1, steps=1)
    assert launches["layer_ops"] == {"linear": 4, "triton:fused_add_rms_norm": 2,
                                     "triton:fused_rotary_store_kvcache": 1, "triton:paged_decode_attention": 1,
                                     "triton:silu_and_mul": 1}
    assert launches["per_layer"] <= 10  # the target; the kernels above make it 9
