"""Quantization while loading: each checkpoint matrix is quantized as it arrives, to the very same
tensors as quantizing the loaded model, and the unquantized model is never held whole (measured)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from safetensors.torch import save_file
from transformers import LlamaConfig, LlamaForCausalLM

from minillm import LLM
from minillm.layers.quant_linear import quantize_model
from minillm.models.loader import load_model
from minillm.models.registry import read_model_config

# Loads twice in a fresh process, whose memory no earlier test has shaped: quantizing while loading,
# as the engine does, then the plain load in the model's dtype that loading-then-quantizing began
# with. Tiny loads first, so that what the first load of a process imports is not counted.
MEASURE = """
import json, sys
from pathlib import Path
import torch
from minillm import LLM
from minillm.models.loader import SHIPPED_MODELS, load_model
from minillm.models.registry import read_model_config
from minillm.utils.memory import PeakMemory

cpu, path = torch.device("cpu"), Path(sys.argv[1])
load_model(SHIPPED_MODELS["tiny"], read_model_config(SHIPPED_MODELS["tiny"]), torch.bfloat16, cpu, None, "int4")
engine = LLM(str(path), dtype="bfloat16", quantization="int4", skip_tokenizer_init=True, max_model_len=32,
             num_kv_blocks=2, block_size=16).llm_engine
quantized = sum(t.numel() * t.element_size() for t in engine.model.state_dict().values())
with PeakMemory(cpu) as unquantized_load:
    load_model(path, read_model_config(path), torch.bfloat16, cpu)
print(json.dumps({"quantizing": engine.load_peak_bytes, "quantized": quantized,
                  "unquantized": unquantized_load.bytes}))
"""


def write_random_checkpoint(path, config: LlamaConfig) -> int:
    """A random bf16 checkpoint (the shapes transformers gives the config), written without building
    the model; returns its bytes."""
    with torch.device("meta"):
        shapes = {name: t.shape for name, t in LlamaForCausalLM(config).state_dict().items()}
    generator = torch.Generator().manual_seed(0)
    tensors = {name: torch.randn(shape, generator=generator, dtype=torch.bfloat16) for name, shape in shapes.items()}
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    config.save_pretrained(path)
    return sum(t.numel() * t.element_size() for t in tensors.values())


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the peak resident set is read from /proc")
def test_peak_memory_while_quantizing_stays_far_under_the_unquantized_model(tmp_path):
    # ~60 MB in bf16 and 16 layers, each matrix small beside the model, as in a real one.
    config = LlamaConfig(hidden_size=384, intermediate_size=1152, num_hidden_layers=16, num_attention_heads=6,
                         num_key_value_heads=2, vocab_size=4096, architectures=["LlamaForCausalLM"], dtype="bfloat16")
    size = write_random_checkpoint(tmp_path, config)
    done = subprocess.run([sys.executable, "-c", MEASURE, str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    peak = json.loads(done.stdout.strip().splitlines()[-1])
    # The meter sees a whole model in its dtype when one is held, as loading then quantizing did...
    assert peak["unquantized"] >= 0.8 * size, (peak, size)
    # ...and quantizing while loading holds the quantized model (about a third of the bf16 one here, the
    # embeddings staying in bf16) plus one matrix and its quantization's temporaries (measured: 0.5 to
    # 3.5 MB above the quantized model, against 3.8 MB per layer in bf16).
    assert 0.9 * peak["quantized"] <= peak["quantizing"] <= 0.5 * size, (peak, size)


@pytest.mark.parametrize(("method", "group_size"), [("int8", 128), ("int4", 32)])
def test_quantizing_while_loading_gives_the_tensors_of_quantizing_the_loaded_model(hf_checkpoint, method,
                                                                                    group_size):
    # Merged q/k/v and gate/up, with biases: each checkpoint matrix is quantized into its own rows.
    _, path = hf_checkpoint("llama_bias")
    config, cpu = read_model_config(path), torch.device("cpu")
    while_loading = load_model(path, config, torch.float32, cpu, None, method, group_size).state_dict()
    after_loading = quantize_model(load_model(path, config, torch.float32, cpu), method, group_size).state_dict()
    assert while_loading.keys() == after_loading.keys()
    for name, tensor in after_loading.items():
        assert while_loading[name].dtype == tensor.dtype and torch.equal(while_loading[name], tensor), name


def test_a_weight_of_the_wrong_shape_is_named_before_it_is_quantized(hf_checkpoint, tmp_path):
    _, path = hf_checkpoint("llama_mha")
    LlamaForCausalLM(LlamaConfig.from_pretrained(path)).save_pretrained(tmp_path)  # the same config...
    config = json.loads((tmp_path / "config.json").read_text())
    config["intermediate_size"] = 256  # ...but config.json now implies wider MLP matrices
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"tensor 'model\.layers\.0\.mlp\.\w+_proj\.weight' in .* has shape "
                                         r"\(\d+, \d+\), but config\.json implies"):
        LLM(str(tmp_path), skip_tokenizer_init=True, quantization="int4", quant_group_size=32)
