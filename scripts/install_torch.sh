#!/usr/bin/env bash
# torch for a new environment (the Makefile runs this only where none is installed yet):
#     bash scripts/install_torch.sh .venv/bin/pip
# PyPI's torch bundles CUDA (about 3 GB to download on Linux), which only an NVIDIA GPU uses. On Linux
# without one, PyTorch's CPU build comes from its CPU wheel index instead (about 0.2 GB); where that
# index has no wheel for this Python and platform, or cannot be reached, PyPI's build after all, with a
# message. Elsewhere (macOS: no CUDA in PyPI's build) and on an NVIDIA machine, PyPI's build.
# TORCH_CPU_INDEX names another CPU index (a mirror).
set -euo pipefail

PIP=$1
CPU_INDEX=${TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}

if [[ "$(uname -s)" != Linux ]] || nvidia-smi -L >/dev/null 2>&1; then
    exec "$PIP" install torch
fi
echo "No NVIDIA GPU: installing PyTorch's CPU build from $CPU_INDEX (about 0.2 GB instead of about 3 GB)."
if ! "$PIP" install torch --index-url "$CPU_INDEX"; then
    echo "PyTorch's CPU index has no torch for this Python and platform, or cannot be reached:" \
         "installing PyPI's default build instead (CUDA included, about 3 GB)." >&2
    "$PIP" install torch
fi
