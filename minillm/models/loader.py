"""Find a model (shipped, local folder, or Hub id) and load its safetensors weights (or, with
load_format="dummy", make random ones of the config's shapes on the device).

Only safetensors are read: a pickle checkpoint (`.bin`, `.pt`) can run arbitrary code when
loaded, and no remote code is ever executed. Every failure names the file or tensor at fault.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from minillm.config.model import ModelConfig
from minillm.kernels.ops import KernelOps
from minillm.layers.linear import default_weight_loader
from minillm.layers.quant_linear import QuantLinear, quantize_model
from minillm.models.interface import CausalLM
from minillm.models.quant_loading import OPTIONAL_TENSORS, quant_readers
from minillm.models.registry import model_class

ASSETS = Path(__file__).parents[1] / "assets"
SHIPPED_MODELS = {"tiny": ASSETS / "tiny", "tiny-draft": ASSETS / "tiny-draft"}
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")
_HUB_FILES = ["*.json", "*.safetensors", "tokenizer.model", "*.txt"]  # never *.bin / *.pt
PICKLE_SUFFIXES = {".bin", ".pt", ".pth", ".ckpt", ".pkl"}
_IGNORED_TENSORS = ("rotary_emb.inv_freq",)
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tokenizer_config.json")


def resolve_model_path(model: str | Path) -> Path:
    """'tiny' / 'tiny-draft', a local Hugging Face folder, or a Hub id (downloaded once)."""
    if not isinstance(model, (str, Path)) or not str(model).strip():
        raise ValueError(f"model must be 'tiny', 'tiny-draft', a local folder or a Hub id, got {model!r}")
    name = str(model)
    if name in SHIPPED_MODELS:
        return SHIPPED_MODELS[name]
    path = Path(name).expanduser()
    if path.is_dir():
        return path
    if path.exists() or not _HUB_ID.match(name) or name.startswith("."):
        raise ValueError(f"unknown model {name!r}: not a shipped model ({', '.join(SHIPPED_MODELS)}), "
                         "not a model folder, and not a Hugging Face Hub id")
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(repo_id=name, allow_patterns=_HUB_FILES))
    except Exception as e:  # offline, no such repo, gated, network: all mean "cannot have it"
        raise ValueError(f"unknown model {name!r}: not a shipped model ({', '.join(SHIPPED_MODELS)}) "
                         f"nor a local folder, and the Hugging Face Hub could not provide it "
                         f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})") from None


def weight_files(path: Path) -> list[Path]:
    index = path / "model.safetensors.index.json"
    if index.is_file():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        missing = [n for n in names if not (path / n).is_file()]
        if missing:
            raise ValueError(f"weight file {path / missing[0]} listed in {index.name} is missing")
        return [path / n for n in names]
    files = sorted(path.glob("*.safetensors"))
    if not files:
        pickles = sorted(p.name for p in path.iterdir() if p.suffix in PICKLE_SUFFIXES)
        hint = (f"; found {', '.join(pickles)}, which minillm refuses to load because pickle files "
                "can run code (convert them to safetensors first)") if pickles else ""
        raise ValueError(f"no *.safetensors weight files in {path}{hint}")
    return files


def load_model(path: Path, config: ModelConfig, dtype: torch.dtype, device: torch.device,
               ops: KernelOps | None = None, quantization: str | None = None, quant_group_size: int = 128,
               load_format: str = "auto") -> CausalLM:
    """ops: the engine's kernels, which the model's layers call (the PyTorch references without).
    quantization: the scheme an unquantized checkpoint's decoder is quantized to as its weights arrive
    (see models/quant_loading.py); a quantized checkpoint loads in its own (config.quantization).
    load_format "dummy": random weights made on the device, no weight file read (vLLM's meaning)."""
    method = config.quantization or quantization
    if load_format == "dummy" and method is not None:
        raise ValueError(f"load_format='dummy' makes unquantized random weights, but the model in {path} is "
                         f"quantized ({method!r})")
    # Built on the meta device (no memory, no random init), then allocated once on the target device:
    # quantized layers only ever allocate their packed weights.
    with torch.device("meta"):
        model = model_class(config.architecture)(config, ops).to(dtype)
        if method is not None:
            quantize_model(model, method, config.quant_group_size or quant_group_size)
    model.to_empty(device=device)
    if load_format == "dummy":
        init_dummy_weights(model)
    else:
        _WeightLoader(model, config.quant_method).load(weight_files(path))
    return model.eval().requires_grad_(False)


def init_dummy_weights(model: torch.nn.Module, low: float = -1e-3, high: float = 1e-3, seed: int = 1234) -> None:
    """Every parameter drawn uniformly from [low, high] where it lies, in its own dtype, from a seeded
    generator: nothing passes through the host, so a 7B-shaped model is ready in a moment on a GPU.
    Small values keep every activation finite in half precision; the text is noise, the step's cost
    (which depends on the shapes alone) is the real one."""
    generators: dict[torch.device, torch.Generator] = {}
    for param in model.parameters():
        if param.device not in generators:
            generators[param.device] = torch.Generator(param.device).manual_seed(seed)
        param.data.uniform_(low, high, generator=generators[param.device])


class _WeightLoader:
    """Each checkpoint tensor to its parameter, through the owning layer's `weight_loader` (see
    layers/linear.py), or to a quantized layer's reader for the checkpoint's format (see
    models/quant_loading.py); the merged layers' shards are found by the model's packed_modules_mapping."""

    def __init__(self, model: CausalLM, quant_method: str | None) -> None:
        self.model = model
        self.readers: dict[str, Callable[[torch.Tensor, int | None], None]] = {}
        self.pending: set[tuple[str, int | None]] = set()
        for module_name, module in model.named_modules():
            shards = range(len(module.output_sizes)) if hasattr(module, "output_sizes") else [None]
            for name, read in _readers(module, quant_method):
                full_name = f"{module_name}.{name}" if module_name else name
                self.readers[full_name] = read
                if name not in OPTIONAL_TENSORS:
                    self.pending |= {(full_name, shard) for shard in shards}

    def load(self, files: list[Path]) -> None:
        for file in files:
            try:
                with safe_open(str(file), framework="pt") as f:
                    names = list(f.keys())
                # Opened again for each tensor: a tensor is read through a memory map of its file, and a
                # page read stays resident until the map closes, so that one open file would hold the
                # whole file in the process's memory by its end (the quantized model plus its unquantized
                # file, where loading should hold only the quantized model plus one tensor).
                for name in names:
                    with safe_open(str(file), framework="pt") as f:
                        self._load_tensor(name, f.get_tensor(name), file)
            except SafetensorError as e:
                raise ValueError(f"weight file {file} is corrupt or not a safetensors file ({e})") from None
        if self.pending:
            names = sorted(self._checkpoint_name(n, s) for n, s in self.pending)
            raise ValueError(f"{len(names)} tensors the model needs are missing from the checkpoint "
                             f"{files[0].parent}: {', '.join(names[:5])}{' ...' if len(names) > 5 else ''}")

    def _checkpoint_name(self, name: str, shard: int | None) -> str:
        if shard is None:
            return name
        for ckpt, (merged, idx) in self.model.packed_modules_mapping.items():
            if f".{merged}." in name and idx == shard:
                return name.replace(merged, ckpt)
        return name

    def _load_tensor(self, name: str, tensor: torch.Tensor, file: Path) -> None:
        if name.endswith(_IGNORED_TENSORS) or (name == "lm_head.weight" and self.model.lm_head is None):
            return
        target, shard = name, None
        for ckpt, (merged, idx) in self.model.packed_modules_mapping.items():
            if f".{ckpt}." in name:
                target, shard = name.replace(f".{ckpt}.", f".{merged}."), idx
                break
        if target not in self.readers:
            raise ValueError(f"unexpected tensor {name!r} in {file}: the "
                             f"{self.model.config.architecture} model has no such weight")
        try:
            self.readers[target](tensor, shard)
        except ValueError as e:
            raise ValueError(f"tensor {name!r} in {file} {e}") from None
        self.pending.discard((target, shard))


def _readers(module: torch.nn.Module, quant_method: str | None) -> Iterator[tuple[str, Callable]]:
    """(name, reader(tensor, shard_id)) of each tensor a module reads from a checkpoint: its own
    parameters, or a quantized layer's tensors in the checkpoint's format (quant_method; None: not
    quantized, so its weights are quantized as they arrive)."""
    if isinstance(module, QuantLinear):
        for name, reader in quant_readers(module, quant_method).items():
            yield name, partial(reader, module)
        return
    for name, param in module.named_parameters(recurse=False):
        yield name, partial(getattr(module, "weight_loader", default_weight_loader), param)


def load_tokenizer(path: Path):
    from transformers import AutoTokenizer

    hint = "pass skip_tokenizer_init=True and give prompts as token ids"
    if not any((path / name).is_file() for name in _TOKENIZER_FILES):
        raise ValueError(f"model folder {path} has no tokenizer files ({', '.join(_TOKENIZER_FILES)}); {hint}")
    try:
        return AutoTokenizer.from_pretrained(str(path), trust_remote_code=False)
    except Exception as e:
        reason = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise ValueError(f"could not load the tokenizer in {path} ({type(e).__name__}: {reason}); {hint}") from None
