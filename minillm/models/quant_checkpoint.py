"""Save a quantized model as a Hugging Face-style folder that `LLM(folder)` loads already quantized:
the writer beside the loader that reads it back.

The folder is the source model's, with `model.safetensors` replaced: the decoder's projections
hold `qweight`, `scales` (and, for int4, `zeros`) instead of `weight`, under the checkpoint's own
names (q_proj, k_proj, ... split back out of minillm's merged layers: every quantized tensor has
the output channels as its first dimension, so the split is the same row ranges as for weights).
config.json gains a `quantization_config` saying how they were packed (see models/registry.py).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

from minillm.layers.linear import shard_range
from minillm.layers.quant_linear import QuantLinear
from minillm.models.interface import CausalLM
from minillm.models.loader import PICKLE_SUFFIXES

# Replaced by what is written here (or, for pickle weights, never copied); every other file of the
# source folder (tokenizer, generation_config.json) is copied as it is, a README with a note on top.
_NOT_COPIED = ("*.safetensors", "model.safetensors.index.json", "config.json", "README.md",
               *(f"*{suffix}" for suffix in PICKLE_SUFFIXES))


def check_output_dir(output_dir: str | Path) -> Path:
    """The folder save_quantized may write: a new one, or one that holds no model yet."""
    out = Path(output_dir)
    if (out / "config.json").exists():
        raise ValueError(f"output_dir {out} already holds a model (config.json); choose an empty folder")
    if out.exists() and not out.is_dir():
        raise ValueError(f"output_dir {out} is a file; choose a new folder")
    return out


def save_quantized(model: CausalLM, source: str | Path, output_dir: str | Path) -> Path:
    """Write `model`, loaded from the folder `source` and quantized (LLM(..., quantization=...) does
    both: pass `llm.llm_engine.model` and `llm.llm_engine.model_path`), to output_dir (created; must
    not hold a model already), in the dtype it runs in (`minillm quantize` loads it in the
    checkpoint's own dtype, so that a CPU does not turn a bf16 model into an fp32 file)."""
    quantized = [m for m in model.modules() if isinstance(m, QuantLinear)]
    if not quantized:
        raise ValueError("the model is not quantized: create it with LLM(model, quantization='int8' or 'int4')")
    out = check_output_dir(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    source = Path(source)
    for file in source.iterdir():
        if file.is_file() and not any(file.match(pattern) for pattern in _NOT_COPIED):
            shutil.copy2(file, out / file.name)
    config = json.loads((source / "config.json").read_text())
    layer = quantized[0]
    config["quantization_config"] = {"quant_method": "minillm", "quantization": layer.method,
                                     "group_size": layer.group_size if layer.method == "int4" else None}
    # The dtype of the scales and of the unquantized tensors (the scales are kept in the model's
    # dtype), under both names transformers has used.
    config["dtype"] = str(layer.scales.dtype).removeprefix("torch.")
    if "torch_dtype" in config:
        config["torch_dtype"] = config["dtype"]
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    scheme = layer.method + (f" g{layer.group_size}" if layer.method == "int4" else "")
    card = source / "README.md"
    (out / "README.md").write_text(
        f"# {source.name}, quantized ({scheme})\n\nThe decoder's linear layers of `{source.name}` in {scheme}, "
        "weight-only, written by `minillm quantize` (minillm/models/quant_checkpoint.py); `LLM(folder)` loads "
        "them quantized. Everything else is the source model's"
        + (", whose card follows.\n\n" + card.read_text() if card.is_file() else ".\n"))
    weights = out / "model.safetensors"
    save_file(checkpoint_tensors(model), str(weights), metadata={"format": "pt"})
    # safetensors writes through a private temporary file: give the weights the mode the other files have.
    weights.chmod((out / "config.json").stat().st_mode & 0o777)
    return out


def checkpoint_tensors(model: CausalLM) -> dict[str, torch.Tensor]:
    """The model's state under the checkpoint's tensor names, merged layers split back out."""
    split = {}
    for ckpt, (merged, index) in model.packed_modules_mapping.items():
        split.setdefault(merged, []).append((ckpt, index))
    tensors = {}
    for name, tensor in model.state_dict().items():
        module_name, _, tensor_name = name.rpartition(".")
        parent, _, child = module_name.rpartition(".")
        if child not in split:
            tensors[name] = tensor.contiguous().cpu()
            continue
        sizes = model.get_submodule(module_name).output_sizes
        for ckpt, index in split[child]:
            start, end = shard_range(sizes, index)
            tensors[f"{parent}.{ckpt}.{tensor_name}"] = tensor[start:end].contiguous().cpu()
    return tensors
