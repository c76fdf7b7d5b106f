"""INT4 checkpoints written by the compressed-tensors library (the "pack-quantized" format of vLLM's
llm-compressor) load into minillm's INT4 layers: the same weights as the library's own unpacking
gives, and the tokens of the dequantized model; every variant minillm cannot read is named."""

from __future__ import annotations

import copy
import json
import re
import shutil

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM

from minillm import LLM, SamplingParams
from minillm.layers.quant_linear import QuantLinear
from minillm.models.loader import SHIPPED_MODELS
from minillm.models.registry import model_config_from_hf
from minillm.quant.int4 import dequantize_int4

ct = pytest.importorskip("compressed_tensors")
from compressed_tensors.compressors import ModelCompressor  # noqa: E402
from compressed_tensors.compressors.pack_quantized.helpers import unpack_from_int32  # noqa: E402
from compressed_tensors.quantization import (  # noqa: E402
    QuantizationArgs,
    QuantizationConfig,
    QuantizationScheme,
    apply_quantization_config,
)
from compressed_tensors.quantization.utils import calculate_qparams  # noqa: E402
from compressed_tensors.utils import update_offload_parameter  # noqa: E402

GREEDY = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
ENGINE = dict(skip_tokenizer_init=True, dtype="float32", max_model_len=64, num_kv_blocks=16)
PROMPTS = [{"prompt_token_ids": [1, 5, 9, 2, 7]}, {"prompt_token_ids": [3, 3, 8, 40, 11, 2]}]


def write_compressed_tensors(model: torch.nn.Module, out, group_size: int) -> None:
    """Quantize model's linear layers (not the output head) to symmetric int4 in groups of group_size
    with the library's min-max parameters, and save them as llm-compressor does."""
    args = QuantizationArgs(num_bits=4, type="int", symmetric=True, strategy="group", group_size=group_size)
    config = QuantizationConfig(config_groups={"group_0": QuantizationScheme(targets=["Linear"], weights=args)},
                                ignore=["lm_head"])
    apply_quantization_config(model, config, show_progress=False)
    for module in model.modules():
        if hasattr(module, "quantization_scheme"):
            groups = module.weight.detach().float().unflatten(1, (-1, group_size))
            scale, zero_point = calculate_qparams(groups.amin(-1), groups.amax(-1), args)
            update_offload_parameter(module, "weight_scale", scale.to(module.weight_scale.dtype))
            update_offload_parameter(module, "weight_zero_point", zero_point.to(module.weight_zero_point.dtype))
    compressor = ModelCompressor.from_pretrained_model(model, "pack-quantized")
    compressor.compress_model(model)
    model.save_pretrained(out)
    compressor.update_config(str(out))


def write_dequantized(compressed, out) -> dict[str, torch.Tensor]:
    """The compressed checkpoint with each layer's int4 weights unpacked by the library and multiplied
    by their scales in float32: an unquantized float32 checkpoint of the same weights."""
    with safe_open(str(compressed / "model.safetensors"), framework="pt") as f:
        tensors = {name: f.get_tensor(name) for name in f.keys()}
    dense = {}
    for name, tensor in tensors.items():
        prefix, _, kind = name.rpartition(".")
        if kind == "weight_packed":
            shape = torch.Size(tensors[f"{prefix}.weight_shape"].tolist())
            levels = unpack_from_int32(tensor, 4, shape).float()
            scale = tensors[f"{prefix}.weight_scale"].float()
            dense[f"{prefix}.weight"] = levels * scale.repeat_interleave(shape[1] // scale.shape[1], dim=1)
        elif kind not in ("weight_scale", "weight_shape"):
            dense[name] = tensor.float()
    out.mkdir()
    for file in compressed.iterdir():
        if file.suffix != ".safetensors":
            shutil.copy(file, out / file.name)
    config = json.loads((out / "config.json").read_text())
    del config["quantization_config"]
    config["dtype"] = config["torch_dtype"] = "float32"
    (out / "config.json").write_text(json.dumps(config))
    save_file(dense, str(out / "model.safetensors"), metadata={"format": "pt"})
    return dense


def tokens(llm: LLM) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]


@pytest.mark.parametrize("source, group_size", [("llama_bias", 32), ("tiny", 128)])
def test_a_compressed_tensors_checkpoint_loads_as_the_weights_it_holds(hf_checkpoint, tmp_path, source, group_size):
    # llama_bias: merged q/k/v and gate/up with biases, float32; tiny: bf16 scales, tied embeddings.
    if source == "tiny":
        model = AutoModelForCausalLM.from_pretrained(SHIPPED_MODELS["tiny"], dtype=torch.bfloat16)
    else:
        model = copy.deepcopy(hf_checkpoint(source)[0])  # the library quantizes the model in place
    write_compressed_tensors(model, tmp_path / "ct", group_size)
    dense = write_dequantized(tmp_path / "ct", tmp_path / "dense")

    quantized = LLM(str(tmp_path / "ct"), **ENGINE)
    engine_model = quantized.llm_engine.model
    layers = {name: m for name, m in engine_model.named_modules() if isinstance(m, QuantLinear)}
    assert len(layers) == 4 * quantized.llm_engine.model_config.num_hidden_layers
    assert {(m.method, m.group_size) for m in layers.values()} == {("int4", group_size)}
    # Exactly the library's weights (and the biases), each checkpoint matrix in its rows of a merged layer.
    for name, layer in layers.items():
        parent, _, child = name.rpartition(".")
        shards = sorted((index, ckpt) for ckpt, (merged, index) in engine_model.packed_modules_mapping.items()
                        if merged == child) or [(0, child)]
        expected = torch.cat([dense[f"{parent}.{ckpt}.weight"] for _, ckpt in shards])
        assert torch.equal(dequantize_int4(layer.qweight, layer.scales, layer.zeros, group_size), expected), name
        if layer.bias is not None:
            assert torch.equal(layer.bias, torch.cat([dense[f"{parent}.{ckpt}.bias"] for _, ckpt in shards])), name
    assert tokens(quantized) == tokens(LLM(str(tmp_path / "dense"), **ENGINE))


COMPRESSED = {
    "quant_method": "compressed-tensors", "format": "pack-quantized", "quantization_status": "compressed",
    "ignore": ["lm_head"], "kv_cache_scheme": None, "sparsity_config": {}, "transform_config": {},
    "config_groups": {"group_0": {
        "targets": ["Linear"], "format": "pack-quantized", "input_activations": None, "output_activations": None,
        "weights": {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": 128,
                    "dynamic": False, "actorder": None}}},
}


def with_change(path: str, value) -> dict:
    qc = json.loads(json.dumps(COMPRESSED))
    *parents, key = path.split(".")
    target = qc
    for parent in parents:
        target = target[parent]
    target[key] = value
    return qc


@pytest.mark.parametrize("field, value", [
    ("format", "float-quantized"),  # fp8
    ("format", "marlin-24"),
    ("quantization_status", "frozen"),  # unpacked fake-quantized weights
    ("ignore", ["lm_head", "re:.*down_proj"]),
    ("kv_cache_scheme", {"num_bits": 8, "type": "float"}),
    ("config_groups.group_0.format", "naive-quantized"),
    ("config_groups.group_0.targets", ["re:.*self_attn.*"]),
    ("config_groups.group_0.input_activations", {"num_bits": 8, "type": "int"}),  # W4A8
    ("config_groups.group_0.weights.symmetric", False),  # asymmetric: packed zero points
    ("config_groups.group_0.weights.num_bits", 8),
    ("config_groups.group_0.weights.num_bits", 3),
    ("config_groups.group_0.weights.strategy", "channel"),
    ("config_groups.group_0.weights.group_size", 16),
    ("config_groups.group_0.weights.actorder", "group"),  # GPTQ act-order: a g_idx per layer
    ("config_groups.group_0.weights.scale_dtype", "torch.float8_e4m3fn"),
])
def test_variants_minillm_cannot_read_are_named_by_field(field, value):
    raw = {"architectures": ["LlamaForCausalLM"], "vocab_size": 64, "hidden_size": 128, "intermediate_size": 256,
           "num_hidden_layers": 1, "num_attention_heads": 2, "quantization_config": with_change(field, value)}
    with pytest.raises(ValueError, match="compressed-tensors checkpoint in config: quantization_config "
                                         + re.escape(f"{field}=")):
        model_config_from_hf(raw)


def test_the_accepted_variants_read_as_int4_with_their_group_size():
    raw = {"architectures": ["LlamaForCausalLM"], "vocab_size": 64, "hidden_size": 128, "intermediate_size": 256,
           "num_hidden_layers": 1, "num_attention_heads": 2}
    for actorder in (None, "weight", "static"):
        qc = with_change("config_groups.group_0.weights.actorder", actorder)
        config = model_config_from_hf({**raw, "quantization_config": qc})
        read = (config.quantization, config.quant_group_size, config.quant_method)
        assert read == ("int4", 128, "compressed-tensors")
