"""INT4 checkpoints written by AutoAWQ (its GEMM layout, as most AWQ models on the Hub) load into
minillm's INT4 layers: the same weights as the library's own unpacking gives, and the tokens of
the dequantized model; every variant minillm cannot read is named."""

from __future__ import annotations

import random
import re

import pytest
import torch
import transformers
from conftest import QUANT_ENGINE, assert_loads_as_dense, write_dequantized
from safetensors import safe_open
from safetensors.torch import save_file

from minillm import LLM
from minillm.models.registry import model_config_from_hf

# AutoAWQ is no longer developed (its authors moved AWQ to llm-compressor, which writes compressed-tensors),
# but its GEMM layout is what most AWQ checkpoints on the Hub hold; its last release still writes it.
awq = pytest.importorskip("awq")
from awq import AutoAWQForCausalLM  # noqa: E402
from awq.utils.packing_utils import reverse_awq_order, unpack_awq  # noqa: E402

VOCAB = 512


def random_model(config_name: str, **extra) -> torch.nn.Module:
    """A random fp16 model whose every projection has a multiple of 64 outputs: AutoAWQ searches its
    clipping over output channels in batches of 64."""
    config = getattr(transformers, config_name)(
        vocab_size=VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, **extra)
    torch.manual_seed(0)
    model = getattr(transformers, config_name.replace("Config", "ForCausalLM"))(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.2)  # wide enough that greedy choices are not decided by rounding
    return model.to(torch.float16)


def write_awq(model: torch.nn.Module, src, out, group_size: int) -> None:
    """Quantize with AutoAWQ itself (its activation-aware scale and clipping search, on random
    calibration tokens) and save as it does."""
    model.save_pretrained(src)
    awq_model = AutoAWQForCausalLM.from_pretrained(str(src), dtype=torch.float16, device_map="cpu")
    rng = random.Random(0)
    calibration = [[rng.randrange(VOCAB) for _ in range(32)] for _ in range(16)]
    awq_model.quantize(None, quant_config={"zero_point": True, "q_group_size": group_size, "w_bit": 4,
                                           "version": "GEMM"},
                       calib_data=calibration, max_calib_samples=16, max_calib_seq_len=32)
    awq_model.save_quantized(str(out))


def dequantize(tensors: dict[str, torch.Tensor], layer: str) -> torch.Tensor:
    """A layer's weight [out, in] from its levels and zero points as the library unpacks them, and
    (q - zero) * scale in float32."""
    levels, zeros = reverse_awq_order(*unpack_awq(tensors[f"{layer}.qweight"], tensors[f"{layer}.qzeros"], 4), 4)
    levels, zeros = (levels & 0xF).float(), (zeros & 0xF).float()  # unpack_awq sign-extends
    scales = tensors[f"{layer}.scales"].float()
    group_size = levels.shape[0] // scales.shape[0]
    return ((levels - zeros.repeat_interleave(group_size, 0)) * scales.repeat_interleave(group_size, 0)).T.contiguous()


@pytest.mark.parametrize("config_name, extra, group_size", [
    ("LlamaConfig", dict(attention_bias=True, mlp_bias=True), 32),  # merged q/k/v and gate/up, biases
    ("Qwen2Config", {}, 64),  # biases on q/k/v only
    ("LlamaConfig", dict(tie_word_embeddings=True), 128),
])
def test_an_autoawq_checkpoint_loads_as_the_weights_it_holds(tmp_path, config_name, extra, group_size):
    write_awq(random_model(config_name, **extra), tmp_path / "fp16", tmp_path / "awq", group_size)
    dense = write_dequantized(tmp_path / "awq", tmp_path / "dense", "qweight", ("qzeros", "scales"), dequantize)

    assert_loads_as_dense(tmp_path / "awq", tmp_path / "dense", dense, group_size)


AWQ = {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True, "version": "gemm",
       "modules_to_not_convert": None}
RAW = {"architectures": ["LlamaForCausalLM"], "vocab_size": 64, "hidden_size": 128, "intermediate_size": 256,
       "num_hidden_layers": 1, "num_attention_heads": 2}


@pytest.mark.parametrize("field, value", [
    ("version", "gemv"),  # packed along the inputs, for AutoAWQ's batch-1 kernel
    ("version", "gemv_fast"),
    ("version", "marlin"),
    ("version", "exllama"),
    ("bits", 8),
    ("bits", 3),
    ("zero_point", False),
    ("group_size", -1),  # one scale per output channel
    ("group_size", 256),
    ("modules_to_not_convert", ["lm_head", "model.layers.0.mlp.down_proj"]),
])
def test_variants_minillm_cannot_read_are_named_by_field(field, value):
    raw = {**RAW, "quantization_config": {**AWQ, field: value}}
    with pytest.raises(ValueError, match="AWQ checkpoint in config: quantization_config " + re.escape(f"{field}=")):
        model_config_from_hf(raw)


@pytest.mark.parametrize("change", [
    {},
    {"version": "GEMM"},  # AutoAWQ's own spelling, as quantize() takes it
    {"modules_to_not_convert": ["lm_head"]},
    {"do_fuse": False, "fuse_max_seq_len": 2048, "backend": "autoawq"},  # transformers' run-time options
])
def test_the_accepted_variants_read_as_int4_with_their_group_size(change):
    config = model_config_from_hf({**RAW, "quantization_config": {**AWQ, **change}})
    assert (config.quantization, config.quant_group_size, config.quant_method) == ("int4", 128, "awq")


def test_a_tensor_of_the_wrong_shape_is_named(tmp_path):
    write_awq(random_model("LlamaConfig"), tmp_path / "fp16", tmp_path / "awq", 64)
    path = tmp_path / "awq" / "model.safetensors"
    with safe_open(str(path), framework="pt") as f:
        tensors = {name: f.get_tensor(name) for name in f.keys()}
    name = "model.layers.1.self_attn.k_proj.qzeros"
    tensors[name] = tensors[name][:, :4].contiguous()  # the zero points of half the outputs
    save_file(tensors, str(path), metadata={"format": "pt"})
    with pytest.raises(ValueError, match=re.escape(f"tensor {name!r}") + ".*has shape"):
        LLM(str(tmp_path / "awq"), **QUANT_ENGINE)
