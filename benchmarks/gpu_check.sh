#!/usr/bin/env bash
# Everything that needs a GPU, in one pass of under 8 minutes on an H200 (each stage has its
# own time limit, so the whole is bounded even when a stage hangs):
#   1. kernel tests, compiled (tests/kernels: every kernel against its reference, every
#      KV block size 8..128, CUDA graphs, block ids past 2**31 elements);
#   2. the engine's GPU tests (pytest -m gpu tests/engine): float32 CUDA vs CPU greedy with
#      penalties / logit bias / min_tokens (identical tokens), seeded sampling alone vs
#      batched, logprobs, the staging-buffer race (torch.cuda._sleep), an engine on cuda:1
#      where there are two GPUs, bf16 vs transformers, CUDA graphs vs eager, KV sizing;
#   3. the kernel benchmarks (benchmarks/kernels.py: attention bandwidth, decode-step MBU).
# Results land in $OUT (default benchmarks/results/gpu): device.txt, one log per stage,
# gpu_report.json, kernels.json and summary.json (each stage's exit code and seconds).
#
# Runs from the repository root with the packages importable from the tree, so it works on
# a bare GPU host that has torch, triton and transformers but cannot install anything: run
# benchmarks/gpu_bundle.sh first where pip works, and carry .whl/ and .devdata/ along
# (wheels of msgspec, redis and gguf; SmolLM2's tokenizer for the tiny test models).
# Exit status: 0 when every stage passed, 1 when one failed or ran out of time; without a
# CUDA device it says so and exits with status 2 before running anything.
set -uo pipefail
OUT=${OUT:-benchmarks/results/gpu}
PYTHON=${PYTHON:-python3}
if ! "$PYTHON" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  echo "gpu_check: no CUDA device is visible to $PYTHON (torch.cuda.is_available() is False" \
       "or torch is missing); these checks need a GPU, so nothing was run." >&2
  exit 2
fi
if ls .whl/*.whl >/dev/null 2>&1; then
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --target /tmp/kvrelay-site .whl/*.whl \
    && export PYTHONPATH=/tmp/kvrelay-site
fi
export PYTHONPATH=client:kernels:worker:tests:${PYTHONPATH:-}
export PYTHONUNBUFFERED=1
unset TRITON_INTERPRET

if [ -z "${KVRELAY_TEST_TOKENIZER_DIR:-}" ] && [ -f .devdata/smollm2-tokenizer/tokenizer.json ]; then
  export KVRELAY_TEST_TOKENIZER_DIR=.devdata/smollm2-tokenizer
fi
mkdir -p "$OUT"
export KVRELAY_GPU_REPORT=$OUT/gpu_report.json
PYTEST=("$PYTHON" -m pytest -q -p no:cacheprovider -o addopts="" -rs)
summary=()
failed=0
# Kernel tests compile one kernel per shape: spread them over 4 processes where
# pytest-xdist is installed (the engine tests size their KV pools from free GPU memory,
# so they run one at a time).
PARALLEL=()
"$PYTHON" -c "import xdist" 2>/dev/null && PARALLEL=(-n 4)

stage() {  # stage NAME TIMEOUT_S LOG COMMAND...: run it under its limit, record rc and time
  local name=$1 limit=$2 log=$3 start rc
  shift 3
  start=$(date +%s)
  timeout "$limit" "$@" >"$OUT/$log" 2>&1
  rc=$?
  [ "$rc" -ne 0 ] && failed=1
  tail -15 "$OUT/$log"
  echo "== $name: exit $rc in $(( $(date +%s) - start ))s (limit ${limit}s)"
  summary+=("\"$name\": {\"exit\": $rc, \"seconds\": $(( $(date +%s) - start ))}")
}

{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null || true
  "$PYTHON" -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__, 'devices', torch.cuda.device_count())"
} | tee "$OUT/device.txt"

[ "${RUN_KERNEL_TESTS:-1}" = 1 ] && stage kernel_tests "${KERNEL_TEST_TIMEOUT:-150}" kernel_tests.log \
  "${PYTEST[@]}" "${PARALLEL[@]}" tests/kernels --timeout 120
[ "${RUN_ENGINE_TESTS:-1}" = 1 ] && stage engine_gpu_tests "${ENGINE_TEST_TIMEOUT:-220}" engine_gpu_tests.log \
  "${PYTEST[@]}" -m gpu tests/engine --timeout 150 ${ENGINE_TEST_SELECT:+-k "$ENGINE_TEST_SELECT"}
[ "${RUN_BENCH:-1}" = 1 ] && stage kernel_benchmarks "${BENCH_TIMEOUT:-80}" bench.log \
  "$PYTHON" benchmarks/kernels.py --quick --out "$OUT/kernels.json" ${BENCH_ARGS:-}

( IFS=,; echo "{${summary[*]}}" ) >"$OUT/summary.json"
cat "$OUT/summary.json"
exit "$failed"
