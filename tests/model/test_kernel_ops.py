"""The model gets its kernel ops: every layer with a kernel (RMSNorm, rotary embedding, SiLU-and-mul,
the quantized linears) and the attention backend call the engine's one KernelOps, chosen once; an
exercise replaces one op of one engine and nothing else sees it."""

from __future__ import annotations

import torch

from minillm import LLM, SamplingParams
from minillm.kernels import layer_reference
from minillm.layers.custom_op import CustomOp
from minillm.models.llama import LlamaForCausalLM
from minillm.models.loader import resolve_model_path
from minillm.models.registry import read_model_config

PROMPT = [{"prompt_token_ids": list(range(10, 30))}]
GREEDY = SamplingParams(temperature=0, max_tokens=5)


def test_every_layer_with_a_kernel_shares_the_engine_ops():
    engine = LLM("tiny", skip_tokenizer_init=True, dtype="float32", quantization="int8").llm_engine
    layers = [m for m in engine.model.modules() if isinstance(m, CustomOp)]
    kinds = {type(m).__name__ for m in layers}
    assert kinds == {"RMSNorm", "RotaryEmbedding", "SiluAndMul", "QuantLinear"}
    assert all(m.ops is engine.ops for m in layers) and engine.model.ops is engine.ops
    assert engine.model_runner.attn_backend.ops is engine.ops
    assert engine.ops.kernel == ("triton" if engine.device.type == "cuda" else "torch")  # "auto"


def test_replacing_one_op_of_one_engine_changes_that_engine_alone():
    calls = []

    def counted_rms_norm(x, weight, eps):
        calls.append("rms_norm")
        return layer_reference.rms_norm_ref(x, weight, eps)

    def counted_add_rms_norm(x, residual, weight, eps):
        calls.append("fused_add_rms_norm")
        return layer_reference.fused_add_rms_norm_ref(x, residual, weight, eps)

    # Eager steps: a replayed CUDA graph calls no Python op at all.
    mine, other = (LLM("tiny", skip_tokenizer_init=True, dtype="float32", enforce_eager=True) for _ in range(2))
    expected = other.generate(PROMPT, GREEDY, use_tqdm=False)[0].outputs[0].token_ids
    mine.llm_engine.ops.rms_norm = counted_rms_norm
    mine.llm_engine.ops.fused_add_rms_norm = counted_add_rms_norm
    assert mine.generate(PROMPT, GREEDY, use_tqdm=False)[0].outputs[0].token_ids == expected
    layers = mine.llm_engine.model_config.num_hidden_layers
    # Each of 5 steps: the first layer's input norm alone (no residual yet), then every other norm
    # (two per layer and the final one) with the residual add.
    assert calls.count("rms_norm") == 5 and calls.count("fused_add_rms_norm") == 5 * 2 * layers
    calls.clear()
    other.generate(PROMPT, GREEDY, use_tqdm=False)
    assert not calls


def test_a_model_built_alone_runs_the_references():
    config = read_model_config(resolve_model_path("tiny"))
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    assert model.ops.kernel == "torch" and model.model.norm.ops is model.ops
