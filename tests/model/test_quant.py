"""Weight-only quantization, reference path: the formulas (exact packing, error within half a
level), the bytes they save, the layer swap and its errors, and the quality cost on tiny."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from minillm import LLM, SamplingParams
from minillm.eval.heldout import eval_token_ids
from minillm.eval.perplexity import perplexity
from minillm.layers.quant_linear import QuantLinear, linear_weight_bytes, quantize_model
from minillm.quant.int4 import dequantize_int4, pack_int4, quantize_int4, unpack_int4
from minillm.quant.int8 import dequantize_int8, quantize_int8


@pytest.mark.parametrize("rows", [1, 3, 16, 17])
def test_int4_packing_is_exact_and_two_values_per_byte(rows):
    q = torch.randint(0, 16, (rows, 256), dtype=torch.uint8)
    packed = pack_int4(q)
    assert packed.dtype == torch.uint8 and packed.shape == (rows, 128)
    assert torch.equal(unpack_int4(packed), q)
    assert torch.equal(packed[:, 0] & 0xF, q[:, 0]) and torch.equal(packed[:, 0] >> 4, q[:, 1])  # low nibble first


@pytest.mark.parametrize("rows", [1, 3, 16, 17])
def test_int8_error_is_within_half_a_level_and_row_maxima_are_exact(rows):
    w = torch.randn(rows, 200) * torch.rand(rows, 1) * 3
    w[0, 5] = 0.0
    qweight, scales = quantize_int8(w)
    back = dequantize_int8(qweight, scales)
    assert qweight.dtype == torch.int8 and scales.shape == (rows,)
    assert ((back - w).abs() <= scales[:, None] / 2 + 1e-6).all()
    assert back[0, 5] == 0 and torch.allclose(back.abs().amax(1), w.abs().amax(1))


@pytest.mark.parametrize("group_size", [32, 64, 128])
@pytest.mark.parametrize("rows", [1, 3, 16, 17])
def test_int4_error_is_within_half_a_level_of_its_group(rows, group_size):
    w = torch.randn(rows, 256) + torch.randn(rows, 1)  # groups not centred on zero
    packed, scales, zeros = quantize_int4(w, group_size)
    assert scales.shape == zeros.shape == (rows, 256 // group_size)
    back = dequantize_int4(packed, scales, zeros, group_size)
    level = scales.repeat_interleave(group_size, dim=1)
    assert ((back - w).abs() <= level / 2 + 1e-6).all()
    at_zero_point = unpack_int4(packed) == zeros.repeat_interleave(group_size, dim=1)
    assert at_zero_point.any() and (back[at_zero_point] == 0).all()  # the zero point reads back as exactly 0


@pytest.mark.parametrize("method, group_size, limit", [("int8", 128, 0.53), ("int4", 128, 0.30)])
def test_weight_bytes_with_scales_and_zeros(method, group_size, limit):
    model = LLM("tiny", dtype="float16").llm_engine.model
    _, fp16 = linear_weight_bytes(model)
    held, _ = linear_weight_bytes(quantize_model(model, method, group_size))
    assert held <= limit * fp16, held / fp16


def test_only_decoder_linears_are_swapped_and_bad_arguments_are_named():
    model = LLM("tiny").llm_engine.model
    quantize_model(model, "int4", 64)
    swapped = [n for n, m in model.named_modules() if isinstance(m, QuantLinear)]
    assert len(swapped) == 6 * 4 and all(".layers." in f".{n}" for n in swapped)
    with pytest.raises(ValueError, match="quantization must be one of"):
        LLM("tiny", quantization="int3")
    with pytest.raises(ValueError, match="quant_group_size must be one of"):
        LLM("tiny", quantization="int4", quant_group_size=100)


def test_a_group_size_that_does_not_divide_names_the_layer(tmp_path):
    config = LlamaConfig(hidden_size=96, intermediate_size=192, num_hidden_layers=1, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=4096)
    LlamaForCausalLM(config).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=r"cannot quantize model\.layers\.0\.self_attn\.qkv_proj: its input "
                                         r"dimension 96 is not a multiple of 64"):
        LLM(str(tmp_path), skip_tokenizer_init=True, quantization="int4", quant_group_size=64)


@pytest.mark.slow
def test_quality_on_tiny():
    baseline = LLM("tiny", dtype="float32")
    tokens = eval_token_ids(baseline.get_tokenizer())[:16384]
    reference = perplexity(baseline, tokens)["perplexity"]
    changes = {}
    for method in ("int8", "int4"):
        llm = LLM("tiny", dtype="float32", quantization=method)
        changes[method] = perplexity(llm, tokens)["perplexity"] / reference - 1
        out = llm.generate("def main():\n", SamplingParams(temperature=0.0, max_tokens=16), use_tqdm=False)
        assert len(out[0].outputs[0].token_ids) > 0
    assert abs(changes["int8"]) < 0.005 and abs(changes["int4"]) < 0.05, changes
