"""`minillm env`: what a bug report needs to know about the machine, in one paste."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import sys

import torch

from minillm.utils.device import (
    BF16_MIN_CAPABILITY,
    cuda_bf16_native,
    default_device,
    device_memory_bytes,
    format_capability,
    triton_status,
)

_PACKAGES = ("minillm", "torch", "transformers", "tokenizers", "safetensors", "huggingface_hub", "triton",
             "numpy", "jupyterlab", "ipywidgets", "plotly", "anywidget")


def collect_env() -> dict:
    versions = {}
    for name in _PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    # The running torch's own version keeps its build tag (+cpu, +cu130), which the package metadata may drop.
    versions["torch"] = torch.__version__
    device = default_device()
    info = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "packages": versions,
        "default_device": device,
        "device_memory_gb": round(device_memory_bytes(torch.device(device)) / 2**30, 1),
        "cuda": None,
    }
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info["cuda"] = {"device": props.name, "capability": format_capability((props.major, props.minor)),
                        "runtime": torch.version.cuda, "bf16": cuda_bf16_native(0)}
    info["triton_usable"], info["triton_status"] = triton_status()
    info["hf_hub_offline"] = os.environ.get("HF_HUB_OFFLINE") == "1"
    return info


def format_env(info: dict) -> str:
    lines = [f"{key:<16} {value}" for key, value in info.items() if key not in ("packages", "cuda")]
    if info["cuda"]:
        lines += [f"cuda.{k:<11} {v}" for k, v in info["cuda"].items()]
        if not info["cuda"]["bf16"]:
            lines.append(f"{'note':<16} {_no_bf16_note(info['cuda']['capability'])}")
    lines += [f"{name:<16} {version or 'not installed'}" for name, version in info["packages"].items()]
    return "\n".join(lines)


def _no_bf16_note(capability: str) -> str:
    return (f"this GPU has no native bfloat16 (compute capability {capability} < "
            f"{format_capability(BF16_MIN_CAPABILITY)}): dtype='auto' runs bfloat16 checkpoints in float16")
