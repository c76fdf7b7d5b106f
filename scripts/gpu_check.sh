#!/usr/bin/env bash
# The GPU evidence in one command: GPU tests and GPU benchmarks, JSON and logs per step and one
# summary.md in OUTDIR. Runs from a checkout with no install (the repo goes on PYTHONPATH), offline,
# on a machine with torch, triton, transformers, safetensors, tokenizers, pytest and hypothesis.
#
#   scripts/gpu_check.sh OUTDIR            # on a CUDA machine: 6 minutes on one H100, spec steps aside
#   scripts/gpu_check.sh OUTDIR --dry-run  # anywhere: checks the wiring, every step skipped
#   GPU_CHECK_STEPS="tests attention" scripts/gpu_check.sh OUTDIR   # a subset, to fit a time slot
set -uo pipefail
cd "$(dirname "$0")/.."

OUTDIR=${1:?usage: scripts/gpu_check.sh OUTDIR [--dry-run]}
DRY=0
[ "${2:-}" = "--dry-run" ] && DRY=1
mkdir -p "$OUTDIR"
OUTDIR=$(cd "$OUTDIR" && pwd)
PY=${PYTHON:-python3}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 TQDM_DISABLE=1 PYTHONUNBUFFERED=1
ALL_STEPS="env tests attention quant model decode host throughput spec spec-large"
STEPS=${GPU_CHECK_STEPS:-$ALL_STEPS}
MODEL_DIR=${GPU_CHECK_MODEL_DIR:-/tmp/minillm-random-llama}
DRAFT_DIR=${GPU_CHECK_DRAFT_DIR:-/tmp/minillm-random-draft}
SUMMARY="$OUTDIR/summary.md"

if [ $DRY = 0 ] && ! $PY -c "import torch, sys; sys.exit(not torch.cuda.is_available())" 2>/dev/null; then
    echo "no CUDA device: running dry (every step skipped)"
    DRY=1
fi

{
    echo "# minillm GPU check"
    echo
    echo "$(date -u +%Y-%m-%dT%H:%MZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
    echo
    echo "| step | result | seconds | log |"
    echo "| --- | --- | ---: | --- |"
} >"$SUMMARY"

# step NAME LIMIT_S COMMAND...: runs COMMAND with its output in NAME.log, one summary row.
step() {
    local name=$1 limit=$2
    shift 2
    case " $STEPS " in *" $name "*) ;; *) echo "| $name | skipped: not in GPU_CHECK_STEPS | | |" >>"$SUMMARY"; return;; esac
    if [ $DRY = 1 ]; then
        echo "| $name | skipped: dry run (would run: $*) | | |" >>"$SUMMARY"
        return
    fi
    echo "== $name: $*"
    local start=$SECONDS rc
    timeout "$limit" "$@" >"$OUTDIR/$name.log" 2>&1
    rc=$?
    local result="ok"
    [ $rc = 124 ] && result="TIMED OUT after ${limit}s"
    [ $rc != 0 ] && [ $rc != 124 ] && result="FAILED (exit $rc)"
    echo "| $name | $result | $((SECONDS - start)) | $name.log |" >>"$SUMMARY"
    tail -n 40 "$OUTDIR/$name.log"
}

# pytest-xdist, where it is installed, runs the GPU tests in parallel on the one GPU.
XDIST=$($PY -c "import xdist" 2>/dev/null && echo "-n 8")
step env 60 bash -c "nvidia-smi; $PY -m minillm.cli env"
step tests 420 $PY -m pytest -q -p no:cacheprovider $XDIST --timeout=240 -rfE \
    tests/kernels/test_gpu.py tests/kernels/test_kernels.py tests/kernels/test_quant_kernels.py tests/test_kv_int8.py \
    tests/engine/test_paged_engine.py tests/model/test_hf_parity.py tests/engine/test_cuda_graph.py tests/engine/test_device.py \
    tests/bench/test_bench_decode.py tests/engine/test_spec_decode.py --junitxml="$OUTDIR/tests.xml"
step attention 120 $PY -m minillm.cli bench attention --out "$OUTDIR/attention.json"
step quant 150 $PY -m minillm.cli bench quant --model tiny --device cuda --num-prompts 16 --num-tokens 32 \
    --out "$OUTDIR/quant.json"
# A 1.1B Llama (TinyLlama's shape) with random weights: the text does not matter, the shapes do.
step model 180 $PY scripts/random_llama.py "$MODEL_DIR" --hidden 2048 --layers 22 --heads 32 --kv-heads 4 \
    --intermediate 5632 --vocab 32000
step decode 240 $PY -m minillm.cli bench decode --model "$MODEL_DIR" --dtype bfloat16 --out "$OUTDIR/decode.json"
# Host time per step by phase (schedule, prepare, execute, sample, update): what bounds a small model.
step host 120 $PY -m minillm.cli bench step --device cuda --out "$OUTDIR/step.json"
step throughput 300 $PY -m minillm.cli bench throughput --model "$MODEL_DIR" --device cuda --dtype bfloat16 \
    --out "$OUTDIR/throughput.json"
# Speculative decoding with the shipped pair: plain against draft model, n-gram and draft = target.
step spec 300 $PY -m minillm.cli bench spec --device cuda --ks 1 2 4 8 --batch-sizes 1 4 16 64 \
    --num-tokens 96 --out "$OUTDIR/spec.json"
# The 1.1B target with a random 0.1B draft of its vocabulary: the draft's cost c at a realistic size
# (random weights accept almost nothing; draft = target measures the machinery at alpha = 1).
step spec-large 300 bash -c "$PY scripts/random_llama.py $DRAFT_DIR --hidden 768 --layers 12 --heads 12 \
    --kv-heads 4 --intermediate 2048 --vocab 32000 && $PY -m minillm.cli bench spec --model $MODEL_DIR \
    --draft $DRAFT_DIR --device cuda --dtype bfloat16 --methods draft_model draft=target --ks 2 4 \
    --batch-sizes 1 16 --temperatures 0 --num-tokens 64 --out $OUTDIR/spec-large.json"

echo
cat "$SUMMARY"
