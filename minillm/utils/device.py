"""Which device and dtype to run on, decided the same way everywhere (engine, notebooks, CLI)."""

from __future__ import annotations

import os

import torch

# "1": a CPU stands in for a CUDA GPU (minillm/course/gpu_standin.py): "cuda" resolves to the CPU.
GPU_STANDIN_ENV = "MINILLM_GPU_STANDIN"
_DTYPES = {"float32": torch.float32, "float": torch.float32, "float16": torch.float16,
           "half": torch.float16, "bfloat16": torch.bfloat16}


def default_device() -> str:
    if torch.cuda.is_available():
        return "cuda"
    if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
        return "mps"
    return "cpu"


def resolve_device(device: str | torch.device | None) -> torch.device:
    if device is None:
        return torch.device(default_device())
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"device must be 'cpu', 'cuda', 'cuda:N' or 'mps', got {device!r}") from None
    if dev.type == "cuda" and os.environ.get(GPU_STANDIN_ENV) == "1":
        return torch.device("cpu")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device='cuda' was asked for, but torch sees no CUDA device "
                         f"(torch {torch.__version__}); use device='cpu'")
    if dev.type not in ("cpu", "cuda", "mps"):
        raise ValueError(f"device must be 'cpu', 'cuda' or 'mps', got {device!r}")
    return dev


# bf16 in hardware starts with Ampere; older GPUs (a T4 is 7.5) emulate it, slowly, and the Triton kernels are
# not tested there.
BF16_MIN_CAPABILITY = (8, 0)


def cuda_bf16_native(device: torch.device | int | None = None) -> bool:
    """Whether this CUDA GPU has bfloat16 in hardware. Not `torch.cuda.is_bf16_supported()`: that says True on a
    T4 too, counting emulation as support."""
    return torch.cuda.get_device_capability(device) >= BF16_MIN_CAPABILITY


def format_capability(capability: tuple[int, int]) -> str:
    return ".".join(map(str, capability))


def resolve_dtype(dtype: str | torch.dtype, checkpoint_dtype: str, device: torch.device) -> torch.dtype:
    """`auto` is the checkpoint's dtype on a GPU (bf16 becomes fp16 where the GPU lacks native bf16, e.g.
    a T4), and float32 on CPU, where half-precision matmuls are slow or missing."""
    if isinstance(dtype, str) and dtype == "auto":
        return _auto_dtype(checkpoint_dtype, device)
    resolved = _explicit_dtype(dtype)
    if resolved == torch.bfloat16 and device.type == "cuda" and not cuda_bf16_native(device):
        have = format_capability(torch.cuda.get_device_capability(device))
        raise ValueError(f"dtype='bfloat16' was asked for, but this GPU has compute capability {have} and native "
                         f"bfloat16 needs {format_capability(BF16_MIN_CAPABILITY)}+; use dtype='float16'")
    return resolved


def _explicit_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        if dtype not in _DTYPES.values():
            raise ValueError(f"dtype must be one of float32, float16, bfloat16 or 'auto', got {dtype}")
        return dtype
    if dtype not in _DTYPES:
        raise ValueError(f"dtype must be 'auto', 'float32', 'float16' or 'bfloat16', got {dtype!r}")
    return _DTYPES[dtype]


def _auto_dtype(checkpoint_dtype: str, device: torch.device) -> torch.dtype:
    if device.type == "cpu":
        return torch.float32
    wanted = _DTYPES.get(checkpoint_dtype.replace("torch.", ""), torch.float32)
    if wanted == torch.float32:
        return torch.float16 if device.type == "mps" else torch.float32
    if wanted == torch.bfloat16 and device.type == "cuda" and not cuda_bf16_native(device):
        return torch.float16
    return wanted


def device_memory_bytes(device: torch.device) -> int:
    """Total memory of the device the KV cache lives on (system RAM for the CPU)."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    if device.type == "mps" and hasattr(torch.mps, "recommended_max_memory"):
        return torch.mps.recommended_max_memory()
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def triton_status() -> tuple[bool, str]:
    """Whether Triton kernels can run here, and why (or why not)."""
    try:
        import triton
    except ImportError:
        return False, "triton is not installed (it ships for Linux only: pip install triton)"
    if os.environ.get("TRITON_INTERPRET") == "1":
        return True, f"triton {triton.__version__}, CPU interpreter (TRITON_INTERPRET=1): correct but slow"
    if torch.cuda.is_available():
        return True, f"triton {triton.__version__} on {torch.cuda.get_device_name()}"
    return False, (f"triton {triton.__version__} is installed but there is no CUDA GPU; "
                   "set TRITON_INTERPRET=1 to run kernels on the CPU interpreter")
