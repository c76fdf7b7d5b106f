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
from conftest import QUANT_ENGINE, assert_loads_as_dense, write_dequantized
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM

from minillm import LLM
from minillm.models.loader import SHIPPED_MODELS
from minillm.models.registry import model_config_from_hf

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


def dequantize(tensors: dict[str, torch.Tensor], layer: str) -> torch.Tensor:
    """A layer's weight from its int4 levels as the library unpacks them, times their scales in float32."""
    shape = torch.Size(tensors[f"{layer}.weight_shape"].tolist())
    levels = unpack_from_int32(tensors[f"{layer}.weight_packed"], 4, shape).float()
    scale = tensors[f"{layer}.weight_scale"].float()
    return levels * scale.repeat_interleave(shape[1] // scale.shape[1], dim=1)


@pytest.mark.parametrize("source, group_size", [("llama_bias", 32), ("tiny", 128)])
def test_a_compressed_tensors_checkpoint_loads_as_the_weights_it_holds(hf_checkpoint, tmp_path, source, group_size):
    # llama_bias: merged q/k/v and gate/up with biases, float32; tiny: bf16 scales, tied embeddings.
    if source == "tiny":
        model = AutoModelForCausalLM.from_pretrained(SHIPPED_MODELS["tiny"], dtype=torch.bfloat16)
    else:
        model = copy.deepcopy(hf_checkpoint(source)[0])  # the library quantizes the model in place
    write_compressed_tensors(model, tmp_path / "ct", group_size)
    dense = write_dequantized(tmp_path / "ct", tmp_path / "dense", "weight_packed", ("weight_scale", "weight_shape"),
                              dequantize)

    assert_loads_as_dense(tmp_path / "ct", tmp_path / "dense", dense, group_size)


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
    ("sparsity_config", {"format": "sparse-24-bitmask", "targets": ["Linear"]}),  # 2:4 sparse weights
    ("transform_config", {"config_groups": {"u": {"type": "hadamard"}}}),  # rotated weights
    ("config_groups", {}),
    ("config_groups.group_0.format", "naive-quantized"),
    ("config_groups.group_0.targets", ["re:.*self_attn.*"]),
    ("config_groups.group_0.input_activations", {"num_bits": 8, "type": "int"}),  # W4A8
    ("config_groups.group_0.output_activations", {"num_bits": 8, "type": "int"}),
    ("config_groups.group_0.weights.type", "float"),  # fp4
    ("config_groups.group_0.weights.dynamic", True),
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


@pytest.fixture(scope="module")
def compressed(hf_checkpoint, tmp_path_factory):
    """llama_bias as llm-compressor writes it, in groups of 32."""
    path = tmp_path_factory.mktemp("compressed") / "ct"
    write_compressed_tensors(copy.deepcopy(hf_checkpoint("llama_bias")[0]), path, 32)
    return path


def edited(source, out, edit) -> str:
    """A copy of the checkpoint in source, its tensors (a dict by name) changed in place by edit."""
    shutil.copytree(source, out)
    with safe_open(str(out / "model.safetensors"), framework="pt") as f:
        tensors = {name: f.get_tensor(name) for name in f.keys()}
    edit(tensors)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    return str(out)


K_PROJ = "model.layers.0.self_attn.k_proj"  # [32, 64]: 32 outputs, 64 inputs


def test_weight_shape_is_optional_and_checked_where_present(compressed, tmp_path):
    """weight_shape only repeats what config.json says: a checkpoint without it loads the same model,
    and one whose weight_shape disagrees is refused, naming the tensor and both shapes."""
    def drop_shapes(tensors):
        for name in [n for n in tensors if n.endswith(".weight_shape")]:
            del tensors[name]

    reference = LLM(str(compressed), **QUANT_ENGINE).llm_engine.model.state_dict()
    without = LLM(edited(compressed, tmp_path / "without", drop_shapes), **QUANT_ENGINE).llm_engine.model.state_dict()
    assert reference.keys() == without.keys() and all(torch.equal(reference[n], without[n]) for n in reference)

    def wrong_shape(tensors):
        tensors[f"{K_PROJ}.weight_shape"] = torch.tensor([32, 128])

    with pytest.raises(ValueError, match=re.escape(f"tensor '{K_PROJ}.weight_shape'") + r" in .* says the weight is "
                                         r"\[32, 128\], but config.json implies \[32, 64\]"):
        LLM(edited(compressed, tmp_path / "wrong", wrong_shape), **QUANT_ENGINE)


def test_a_packed_weight_of_the_wrong_shape_is_named_with_its_own_shape(compressed, tmp_path):
    """The shape in the message is the checkpoint tensor's (eight inputs to a word), not that of the
    repacked tensor minillm would have made from it."""
    def half_the_inputs(tensors):
        tensors[f"{K_PROJ}.weight_packed"] = tensors[f"{K_PROJ}.weight_packed"][:, :4].contiguous()

    with pytest.raises(ValueError, match=re.escape(f"tensor '{K_PROJ}.weight_packed'") + r" in .* has shape "
                                         r"\(32, 4\), but config.json implies \(32, 8\)"):
        LLM(edited(compressed, tmp_path / "half", half_the_inputs), **QUANT_ENGINE)
