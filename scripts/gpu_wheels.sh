#!/usr/bin/env bash
# Wheels for a GPU machine that has torch, triton and transformers but no pip index: what the
# notebooks (nbclient, ipykernel, ipywidgets, plotly, anywidget) and the server (FastAPI, uvicorn,
# the openai client) need, with everything they depend on, for CPython 3.12 on x86-64 Linux. Run it
# where pip reaches an index; the folder (ignored by git) travels with the checkout, and
# scripts/gpu_check.sh installs from it whatever that machine lacks.
#
#   scripts/gpu_wheels.sh [DIR [REQUIREMENT...]]   # default .whl and the list below; prints the count,
#                                                  # the size and the install line
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-.whl}
PY=${PYTHON:-python3}
REQUIREMENTS=(nbclient nbformat ipykernel "ipywidgets>=7.7,<9" plotly anywidget fastapi uvicorn openai
              prometheus-client)
[ $# -gt 1 ] && REQUIREMENTS=("${@:2}")

mkdir -p "$DIR"
$PY -m pip download -q --disable-pip-version-check --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform any -d "$DIR" "${REQUIREMENTS[@]}"
count=$(ls "$DIR"/*.whl | wc -l)
bytes=$(du -cb "$DIR"/*.whl | tail -1 | cut -f1)
echo "$count wheels, $((bytes / 1024 / 1024)) MiB in $DIR"
echo "install on the GPU machine (only what it lacks): $PY scripts/install_wheels.py $DIR /tmp/site"
# With the default list: the engine that scripts/gpu_check.sh's host step measures as "before" (its
# tiny weights are this checkout's), for a GPU machine whose copy of the checkout has no git history.
BASELINE=${GPU_CHECK_BASELINE:-d92481a}
if [ $# -le 1 ] && git rev-parse -q --verify "$BASELINE^{commit}" >/dev/null 2>&1; then
    rm -rf "$DIR/baseline-$BASELINE"
    git archive --prefix="baseline-$BASELINE/" "$BASELINE" minillm ':!minillm/assets' | tar -x -C "$DIR"
    echo "the host step's before: $BASELINE's minillm in $DIR/baseline-$BASELINE ($(du -sh "$DIR/baseline-$BASELINE" | cut -f1))"
fi
