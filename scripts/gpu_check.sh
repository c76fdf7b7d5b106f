#!/usr/bin/env bash
# The GPU evidence in one command that fits a short loan of a GPU: the open targets first, then the
# GPU tests beside every notebook, then serving. Each step has an estimate (seconds on one H100) and
# starts only while the budget has room for it; a step is cut at the budget, so a run always ends in
# time with what it measured: a log (and JSON) per step, and summary.md with each step's result and
# time and each target's PASS / FAIL / NOT RUN.
#
#   scripts/gpu_check.sh OUTDIR            # on a CUDA machine: about 10 min on one H100 (2026-11-27)
#   scripts/gpu_check.sh [OUTDIR] --dry-run  # anywhere: the tiers, steps and estimates; nothing runs
#   GPU_CHECK_BUDGET=300 scripts/gpu_check.sh OUTDIR         # seconds for all steps (default 540)
#   GPU_CHECK_STEPS="tests notebooks" scripts/gpu_check.sh OUTDIR   # a subset; tier1, tier2, tier3 name tiers
#
# A device call runs 10 minutes at most, so a loan is best spent on two: GPU_CHECK_STEPS="tier1 tier3"
# (6 min 24 s to 7 min 14 s on an H100, 2026-11-27; 6 min 21 s on an H200, 2026-11-28, before step
# decode-kernels), then, while the machine is warm, GPU_CHECK_STEPS=tier2 (3 min 49 s on an H100,
# 2 min 22 s on an H200).
#
# Runs from a checkout with no install (the repo goes on PYTHONPATH), offline, on a machine with torch,
# triton, transformers, safetensors, tokenizers and pytest. The notebooks and serving steps need the
# wheels that scripts/gpu_wheels.sh puts in .whl (installed here into a temporary folder), and are
# skipped, with the reason, without them.
set -uo pipefail
cd "$(dirname "$0")/.."

[ "${1:-}" = "--dry-run" ] && set -- "$(mktemp -d)" --dry-run  # no OUTDIR: a dry run writes to a scratch one
OUTDIR=${1:?usage: scripts/gpu_check.sh OUTDIR [--dry-run]}
DRY=0
[ "${2:-}" = "--dry-run" ] && DRY=1
mkdir -p "$OUTDIR"
OUTDIR=$(cd "$OUTDIR" && pwd)
PY=${PYTHON:-python3}
REPO=$PWD
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 TQDM_DISABLE=1 PYTHONUNBUFFERED=1
BUDGET=${GPU_CHECK_BUDGET:-540}
MODEL_DIR=${GPU_CHECK_MODEL_DIR:-/tmp/minillm-random-llama}
WHEELS=${GPU_CHECK_WHEELS:-.whl}
SITE=/tmp/minillm-gpu-check-site
SUMMARY="$OUTDIR/summary.md"
# Tier 1, the targets of the open GPU work, timed alone; tier 2, correctness, its two steps side by
# side; tier 3, serving.
TIER1="env kernels attention decode spec throughput quant decode-int4 decode-kernels host host-pageable host-async"
TIER1="$TIER1 host-spec quant-sweep"
TIER2="tests notebooks"
TIER3="serve"
STEPS=${GPU_CHECK_STEPS:-$TIER1 $TIER2 $TIER3}
STEPS=${STEPS//tier1/$TIER1}
STEPS=${STEPS//tier2/$TIER2}
STEPS=${STEPS//tier3/$TIER3}

if [ $DRY = 0 ] && ! $PY -c "import torch, sys; sys.exit(not torch.cuda.is_available())" 2>/dev/null; then
    echo "no CUDA device: running dry (nothing runs)"
    DRY=1
fi

{
    echo "# minillm GPU check"
    echo
    echo "$(date -u +%Y-%m-%dT%H:%MZ), commit ${GPU_CHECK_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}, budget ${BUDGET} s"
    echo
    echo "| tier | step | result | seconds (estimate) | log |"
    echo "| --- | --- | --- | ---: | --- |"
} >"$SUMMARY"

# plan TIER NAME ESTIMATE: whether the step runs now; if not, its summary row says why.
plan() {
    local tier=$1 name=$2 estimate=$3 left=$((BUDGET - SECONDS))
    case " $STEPS " in *" $name "*) ;; *) echo "| $tier | $name | NOT RUN: not in GPU_CHECK_STEPS | ($estimate) | |" >>"$SUMMARY"; return 1;; esac
    if [ $DRY = 1 ]; then
        echo "| $tier | $name | NOT RUN: dry run (would run: ${*:4}) | ($estimate) | |" >>"$SUMMARY"
        return 1
    fi
    if [ "$estimate" -gt "$left" ]; then
        echo "| $tier | $name | NOT RUN: ${left} s of the budget left | ($estimate) | |" >>"$SUMMARY"
        return 1
    fi
}

# finish TIER NAME RC START ESTIMATE: the step's summary row and the end of its log.
finish() {
    local result="ok"
    [ "$3" = 124 ] && result="CUT at the budget"
    [ "$3" != 0 ] && [ "$3" != 124 ] && result="FAILED (exit $3)"
    echo "| $1 | $2 | $result | $((SECONDS - $4)) ($5) | $2.log |" >>"$SUMMARY"
    echo "== $2: $result"
    tail -n 25 "$OUTDIR/$2.log"
}

# step TIER NAME ESTIMATE COMMAND...: runs COMMAND, cut where the budget ends, output in NAME.log.
step() {
    local tier=$1 name=$2 estimate=$3
    shift 3
    plan "$tier" "$name" "$estimate" "$@" || return 0
    echo "== $name: $*"
    local start=$SECONDS
    timeout $((BUDGET - SECONDS)) "$@" >"$OUTDIR/$name.log" 2>&1
    finish "$tier" "$name" $? $start "$estimate"
}

# side_by_side TIER ESTIMATE NAME1 "CMD1" NAME2 "CMD2": two steps at once (both correctness, untimed).
side_by_side() {
    local tier=$1 estimate=$2 start=$SECONDS pids=() names=()
    shift 2
    while [ $# -gt 0 ]; do
        if plan "$tier" "$1" "$estimate" "$2"; then
            echo "== $1: $2"
            timeout $((BUDGET - SECONDS)) bash -c "$2" >"$OUTDIR/$1.log" 2>&1 &
            pids+=($!)
            names+=("$1")
        fi
        shift 2
    done
    for i in "${!pids[@]}"; do
        wait "${pids[$i]}"
        finish "$tier" "${names[$i]}" $? $start "$estimate"
    done
}

# Python packages the notebooks and the server need, where the wheels came along.
NOWHEELS="no wheels in $WHEELS (run scripts/gpu_wheels.sh where pip works)"
if [ $DRY = 0 ] && ls "$WHEELS"/*.whl >/dev/null 2>&1; then
    $PY scripts/install_wheels.py "$WHEELS" "$SITE" >"$OUTDIR/wheels.log" 2>&1 && NOWHEELS=""
    [ -n "$NOWHEELS" ] || echo "installed the wheels ($(tail -1 "$OUTDIR/wheels.log"))"
    [ -z "$NOWHEELS" ] || NOWHEELS="the wheels did not install: wheels.log"
fi
# wheels_for TIER NAME ESTIMATE: true where the step's wheels are installed (or on a dry run).
wheels_for() {
    [ $DRY = 1 ] || [ -z "$NOWHEELS" ] && return 0
    case " $STEPS " in *" $2 "*) echo "| $1 | $2 | NOT RUN: $NOWHEELS | ($3) | |" >>"$SUMMARY";; esac
    return 1
}

step 1 env 6 bash -c "nvidia-smi; $PY -m minillm.cli env"
# A 1.1B Llama (TinyLlama's shape) with random weights, written while the first steps run (unless a
# run before this one on the machine wrote it, its tokenizer last): the text does not matter, the shapes do.
MODEL_PID=
if [ $DRY = 0 ] && [ ! -f "$MODEL_DIR/tokenizer.json" ]; then
    $PY scripts/random_llama.py "$MODEL_DIR" --hidden 2048 --layers 22 --heads 32 --kv-heads 4 \
        --intermediate 5632 --vocab 32000 >"$OUTDIR/model.log" 2>&1 &
    MODEL_PID=$!
fi
step 1 kernels 20 $PY -m minillm.cli bench kernels --models tiny --kernels torch triton --out "$OUTDIR/kernels.json"
# The ragged kernel at other tilings too, the H100's own (64 x 64 on 4 warps) beside them, and with
# deeper pipelines (a fourth field: stages; the launcher's 2). At 3 stages Triton reads the block table
# a tile further ahead; only from 5 are the K/V tiles copied two tiles ahead (BENCHMARKS.md, "Two tiles
# ahead takes five stages"), in 3 buffers each: 64 x 64 then fills half an H100's shared memory, 64 x 32
# under a third.
step 1 attention 25 $PY -m minillm.cli bench attention --tilings 64x32x4 64x32x8 64x64x8 128x64x8 32x32x4 \
    128x64x4 128x32x4 128x128x8 64x64x4x3 64x64x4x5 64x32x4x5 128x64x8x5 --out "$OUTDIR/attention.json"
[ -z "$MODEL_PID" ] || wait $MODEL_PID || echo "writing the 1.1B model failed: model.log"
# The roofline of the 1.1B model (its graphs' capture time and memory among it) and its launch count;
# then batch-1 decode of a Llama-2-7B shape, graphed, its random weights made on the GPU (nothing read
# from disk: load_format="dummy"), against the copy and read-only bandwidths.
step 1 decode 70 bash -c "$PY -m minillm.cli bench decode --model $MODEL_DIR --dtype bfloat16 \
    --out $OUTDIR/decode.json && $PY -m minillm.cli bench kernels --models $MODEL_DIR --dtype bfloat16 \
    --out $OUTDIR/kernels-1b.json && $PY -m minillm.cli bench decode --shape llama-2-7b --dtype bfloat16 \
    --batches 1 --prefill-lens --modes graphs --out $OUTDIR/decode-7b.json"
# Speculative decoding, greedy: the course's pair (draft model, n-gram) at batches 1, 16 and 64 (where
# it stops paying: it still paid at 16 on 2026-11-27) and, on the 1.1B model, draft = target, whose
# verification cost v is the target's.
step 1 spec 50 bash -c "$PY -m minillm.cli bench spec --device cuda --ks 2 4 --batch-sizes 1 16 64 \
    --temperatures 0 --num-tokens 96 --out $OUTDIR/spec.json && $PY -m minillm.cli bench spec \
    --model $MODEL_DIR --device cuda --dtype bfloat16 --methods draft=target --ks 4 --batch-sizes 1 \
    --temperatures 0 --num-tokens 64 --out $OUTDIR/spec-1b.json"
step 1 throughput 115 $PY -m minillm.cli bench throughput --model "$MODEL_DIR" --device cuda --dtype bfloat16 \
    --out "$OUTDIR/throughput.json"
step 1 quant 50 $PY -m minillm.cli bench quant --model tiny --device cuda --num-prompts 16 --num-tokens 32 \
    --out "$OUTDIR/quant.json"
# A whole INT4 g128 decode step of the 1.1B model, graphed, against step decode's bf16 one (19 s on an
# H200, 2026-11-28).
step 1 decode-int4 20 $PY -m minillm.cli bench decode --model "$MODEL_DIR" --dtype bfloat16 --quantization int4 \
    --batches 1 --prefill-lens --modes graphs --out "$OUTDIR/decode-int4.json"
# The same step's kernels one by one, in bf16, INT4 and INT8 (profiled replays): how much of the step
# the linear layers are, and so how far quantizing them can speed it up (its estimate: the same
# profile, run on an H200 from a script of its own before this step existed).
step 1 decode-kernels 35 $PY scripts/profile_decode_kernels.py "$MODEL_DIR" "$OUTDIR/decode-kernels.json"
# Host time per step by phase (schedule, prepare, execute, sample, update): what bounds a small model,
# before and after. Before: the engine of $BASELINE, the last commit before issue 25's fused kernels
# and its host work (device-side argmax, pinned staging), on the same tiny weights; from the git
# history where it is here, else from the tree scripts/gpu_wheels.sh exported beside the wheels.
BASELINE=${GPU_CHECK_BASELINE:-d92481a}
BEFORE=
if git rev-parse -q --verify "$BASELINE^{commit}" >/dev/null 2>&1; then
    BEFORE="--baseline $BASELINE"
elif [ -f "$WHEELS/baseline-$BASELINE/minillm/__init__.py" ]; then
    BEFORE="--baseline $WHEELS/baseline-$BASELINE"
else
    echo "no $BASELINE to compare the host step with (no git history, no $WHEELS/baseline-$BASELINE): after only"
fi
step 1 host 30 $PY -m minillm.cli bench step --model "$REPO/minillm/assets/tiny" --device cuda --batch-sizes 1 16 \
    --steps 30 $BEFORE --out "$OUTDIR/step.json"
# The same on this tree with the inputs copied from pageable memory (utils/staging.py): what the
# pinned host arrays buy, or cost, in the prepare phase.
step 1 host-pageable 12 env MINILLM_PINNED_STAGING=0 $PY -m minillm.cli bench step \
    --model "$REPO/minillm/assets/tiny" --device cuda --batch-sizes 1 16 --steps 30 --out "$OUTDIR/step-pageable.json"
# The same with async scheduling (engine/async_step.py): each step queued before the one before is
# read, so that a step's total is what the host's work and the device's, overlapped, leave.
step 1 host-async 12 $PY -m minillm.cli bench step --model "$REPO/minillm/assets/tiny" --device cuda \
    --batch-sizes 1 16 --steps 30 --async-scheduling --out "$OUTDIR/step-async.json"
# The same phases of a speculative step of the course's pair (propose, prepare, execute, verify): where
# c and v of step spec go on the host.
step 1 host-spec 12 $PY -m minillm.cli bench step --model "$REPO/minillm/assets/tiny" --device cuda \
    --batch-sizes 1 4 --steps 30 --speculative-config '{"model": "tiny-draft", "num_speculative_tokens": 4}' \
    --out "$OUTDIR/step-spec.json"
# What the quantized matmuls' decode path is sensitive to (split-K, tiles, pipeline stages, the one-row
# int4 kernel's packed products or fp32), for the INT4 targets that step quant measures.
step 1 quant-sweep 40 $PY scripts/quant_gemv_sweep.py "$OUTDIR/quant-sweep.json"

# pytest-xdist, where it is installed, runs the GPU tests in parallel on the one GPU.
XDIST=$($PY -c "import xdist" 2>/dev/null && echo "-n 6")
TESTS="$PY -m pytest -q -p no:cacheprovider $XDIST --timeout=240 -rfE tests/kernels/test_gpu.py tests/engine/test_async_scheduling.py tests/kernels/test_kernels.py \
    tests/kernels/test_quant_kernels.py tests/kernels/test_kv_int8.py tests/kernels/test_layer_kernels.py tests/kernels/test_ragged_attention.py \
    tests/kernels/test_kernel_properties.py tests/kernels/test_quant_properties.py tests/kernels/test_layer_properties.py \
    tests/model/test_hf_parity.py \
    tests/model/test_kernel_ops.py tests/engine/test_paged_engine.py tests/engine/test_cuda_graph.py \
    tests/engine/test_device.py tests/engine/test_spec_decode.py tests/bench/test_bench_decode.py \
    tests/bench/test_bench_kernels.py --junitxml=$OUTDIR/tests.xml"
# The notebooks import the installed copy (with minillm.widgets), on the shipped pair unless
# MINILLM_MODEL / MINILLM_DRAFT_MODEL name others.
NOTEBOOKS="PYTHONPATH=$SITE MINILLM_MODEL=\${MINILLM_MODEL:-tiny} MINILLM_DRAFT_MODEL=\${MINILLM_DRAFT_MODEL:-tiny-draft} \
    $PY scripts/run_notebooks.py $OUTDIR/notebooks --jobs 6"
if wheels_for 2 notebooks 215; then
    side_by_side 2 215 tests "$TESTS" notebooks "$NOTEBOOKS"
else
    side_by_side 2 215 tests "$TESTS"
fi
wheels_for 3 serve 35 && step 3 serve 35 env PYTHONPATH=$SITE $PY -m minillm.cli bench serve --model tiny \
    --device cuda --num-prompts 64 --request-rate 8,inf --out "$OUTDIR/serve.json"

[ $DRY = 1 ] || $PY -m minillm.bench.targets "$OUTDIR" >>"$SUMMARY" 2>"$OUTDIR/targets.log" \
    || echo "the targets table failed: targets.log"
# The sweeps' fastest variants against the shipped launches (attention tilings, quantized matmuls).
[ $DRY = 1 ] || $PY -m minillm.bench.sweep_choices "$OUTDIR" >>"$SUMMARY" 2>"$OUTDIR/sweep_choices.log" \
    || echo "the sweeps' choices failed: sweep_choices.log"
echo
cat "$SUMMARY"
