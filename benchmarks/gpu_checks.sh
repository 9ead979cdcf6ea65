#!/usr/bin/env bash
# The GPU checks of ../shared/gpu-checks.md in one go (GPT-2 small *shape*, random weights: same compute).
#   bash benchmarks/gpu_checks.sh [OUT_DIR]
# Writes one log per check to OUT_DIR (default runs/gpu-checks) and prints them as they run.
set -u
out=${1:-runs/gpu-checks}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$(pwd)
py=${PYTHON:-python3}
check() {  # name, seconds, command...
    local name=$1 limit=$2; shift 2
    echo "=== $name ($(date -u +%T))"
    local began=$SECONDS
    timeout "$limit" "$@" 2>&1 | tee "$out/$name.txt"
    echo "=== $name: exit ${PIPESTATUS[0]}, $((SECONDS - began)) s"
}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
$py -c "import torch, transformers, lightning; print('torch', torch.__version__, 'transformers', transformers.__version__, 'lightning', lightning.__version__)"
check pytest_gpu 240 $py -m pytest -m gpu tests/test_gpu.py -q -p no:cacheprovider
check bench_evaluate 300 $py benchmarks/bench_evaluate.py --lm gpt2 --planner paper --device cuda --articles 64
check bench_lm 240 $py benchmarks/bench_lm.py --gpt2-small --device cuda --steps 20 --warmup 3
check bench_planner 300 $py benchmarks/bench_planner.py --d_model 768 --num_heads 2 --dim_feedforward 2048 \
    --horizon 10 --batch_size 512 --boundaries 1024 --sample_batch_size 1024 --precision bf16 --device cuda \
    --repeats 3
