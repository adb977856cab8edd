#!/usr/bin/env bash
# Everything that needs a GPU, in one pass that fits a 15-minute GPU window twice over
# (the stages' limits add up to about 6 minutes; with the machine's start, under 7):
#   1. kernel_tests       the Triton kernels compiled (tests/kernels, the Triton files
#                         only: the CPU checks run in CI), KV block sizes 8..128, CUDA
#                         graphs, block ids past 2**31 elements, LoRA shrink/expand,
#                         FP8 weights (Triton dequantizing kernel, _scaled_mm on sm89+);
#   2. bench_attention    paged decode attention against copy bandwidth, batch 1/16/64
#                         at 4k and 32k (benchmarks/gpu_kernels.py --skip-decode);
#      bench_decode_step  a Llama-3-8B-shaped decode step at batch 1/16/64 and its MBU;
#      bench_quant_gemm   the W8A16 / W4A16 GEMM at M=1 and 16 against bfloat16;
#      bench_kv_quant     int8 / fp8 KV decode attention at 32k against bfloat16;
#      bench_lora         batched LoRA (8 adapters, rank 16/64) against per-adapter matmuls;
#   3. engine_tests       fp32 GPU = CPU greedy over every tiny model family, speculation
#                         (n-gram, self-draft, graphs on) = off, int8/int4 weights GPU =
#                         CPU, swap, beam copy-on-write, graphs = eager, one bf16 model
#                         against transformers' bf16, sampling, KV quantization, staging.
# A pytest stage fails when a test fails, when none ran, or when one skipped for a
# reason not allowed for it (gpu_stage_result.py): skips cannot make it pass.
#
# Results in $OUT (default benchmarks/results/gpu), at most 8 files: summary.json
# (rewritten after every stage: each one's exit, seconds, test counts; the device),
# gpu_report.json (figures the engine tests report), attention.json, decode_step.json,
# quant_gemm.json, kv_quant_decode.json, lora.json, and logs.tar.gz (every log and JUnit
# report, re-packed after each stage, so a run cut short still brings back what it did).
#
# The host needs torch, triton and transformers and installs nothing: what it lacks
# travels in the bundle (benchmarks/gpu_bundle.sh: .whl/ and .devdata/, or the folder
# KVRELAY_GPU_BUNDLE names). Limits: KERNEL_TEST_TIMEOUT, ATTENTION_TIMEOUT, ... below;
# KERNEL_TEST_WORKERS (default 8) processes for the kernel tests.
#
#   gpu_check.sh --dry-run   no GPU needed: the bundle is complete (a wheel for every line
#       of gpu_bundle.txt, their own needs met, the tokenizer, at most 60 MiB), and every
#       stage's tests and benchmarks import, with only the GPU host's packages
#       (gpu_host_packages.txt) and the carried ones importable (gpu_host_env.py).
#
# Exit status: 0 when every stage passed, 1 when one failed or ran out of time; without a
# CUDA device (and without --dry-run) it says so and exits with status 2 before running
# anything.
set -uo pipefail
cd "$(dirname "$0")/.."
DRY_RUN=0
[ "${1:-}" = "--dry-run" ] && DRY_RUN=1
OUT=${OUT:-benchmarks/results/gpu}
PYTHON=${PYTHON:-python3}
BUNDLE=${KVRELAY_GPU_BUNDLE:-.}
WHEELS=$BUNDLE/.whl
TOKENIZER=$BUNDLE/.devdata/smollm2-tokenizer
MAX_CARRIED_MIB=60

KERNEL_TESTS=(tests/kernels/test_triton_*.py tests/kernels/test_block_sizes.py
              tests/kernels/test_kernel_wrappers.py tests/kernels/test_kv_quant_attention.py
              tests/kernels/test_fp8_scaled_mm.py)
ENGINE_TESTS=(tests/engine/test_gpu_engine.py tests/engine/test_gpu_engine_checks.py
              tests/engine/test_gpu_sampling.py tests/engine/test_gpu_kv_quant.py
              tests/engine/test_gpu_staging.py)
# SmolLM2's GGUF is not carried (too large); one random model against transformers' bf16.
ENGINE_DESELECT=(--deselect tests/engine/test_gpu_engine.py::test_smollm2_bf16_gpu_tracks_transformers_bf16)
for name in llama-mha-untied qwen2-gqa-bias-tied llama3-rope; do
  ENGINE_DESELECT+=(--deselect "tests/engine/test_gpu_engine.py::test_bf16_gpu_on_random_models_tracks_transformers_bf16[$name]")
done
# The only skip allowed: the second-device test on a host with one GPU.
ENGINE_ALLOWED_SKIPS=(--allow-skip "needs two CUDA devices")
# Plugins named, not found by entry point: the same set on the host and in the dry run.
export PYTEST_DISABLE_PLUGIN_AUTOLOAD=1
PYTEST=(-m pytest -q -p no:cacheprovider -p pytest_timeout -o addopts="" -rs)
export PYTHONPATH=client:kernels:worker:tests:benchmarks${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1
export KVRELAY_TEST_TOKENIZER_DIR=$TOKENIZER

dry_run() {
  local failed=0 problem
  complain() { echo "gpu_check --dry-run: $*" >&2; failed=1; }
  for name in $(sed 's/#.*//' benchmarks/gpu_bundle.txt); do
    local pattern
    pattern=$(echo "$name" | tr '-' '_')
    # shellcheck disable=SC2012
    [ "$(ls "$WHEELS" 2>/dev/null | grep -ic "^${pattern}-.*\.whl$")" = 1 ] \
      || complain "no wheel (or more than one) of $name in $WHEELS: run benchmarks/gpu_bundle.sh"
  done
  "$PYTHON" benchmarks/gpu_host_env.py --wheels "$WHEELS" --check-bundle -- || failed=1
  for f in tokenizer.json tokenizer_config.json; do
    [ -f "$TOKENIZER/$f" ] || complain "$TOKENIZER/$f is missing: run benchmarks/gpu_bundle.sh"
  done
  if [ -f "$TOKENIZER/tokenizer.json" ]; then
    problem=$("$PYTHON" -c "import sys, tokenizers; tokenizers.Tokenizer.from_file(sys.argv[1])" \
      "$TOKENIZER/tokenizer.json" 2>&1) || complain "the tokenizer does not load: $problem"
  fi
  local mib
  mib=$(( $(du -sk "$WHEELS" "$BUNDLE/.devdata" 2>/dev/null | awk '{s += $1} END {print s + 0}') / 1024 ))
  [ "$mib" -le "$MAX_CARRIED_MIB" ] || complain "the bundle is $mib MiB, over $MAX_CARRIED_MIB"
  [ "$failed" = 0 ] || return 1  # the stages cannot import from an incomplete bundle
  local guard=("$PYTHON" benchmarks/gpu_host_env.py --wheels "$WHEELS" --)
  collect() {  # collect NAME ARGS...: the stage's tests import and at least one is collected
    local stage=$1 output count
    shift
    output=$("${guard[@]}" "${PYTEST[@]}" --collect-only "$@" 2>&1)
    local rc=$?
    count=$(echo "$output" | grep -oE "^[0-9]+(/[0-9]+)? tests? collected" | grep -oE "^[0-9]+")
    if [ "$rc" -ne 0 ] || [ "${count:-0}" -eq 0 ]; then
      echo "$output" | grep -E "^E |rror" | head -20 >&2
      complain "stage $stage: its tests do not collect on the GPU host's packages (exit $rc)"
    else
      echo "gpu_check --dry-run: stage $stage collects $count tests"
    fi
  }
  collect kernel_tests "${KERNEL_TESTS[@]}"
  collect engine_tests "${ENGINE_TESTS[@]}" "${ENGINE_DESELECT[@]}"
  "${guard[@]}" -c "import gpu_kernels, kernels_attention, decode_step, quant_gpu, kv_quant_decode_gpu, lora_gpu" \
    || complain "the benchmarks do not import on the GPU host's packages"
  [ "$failed" = 0 ] && echo "gpu_check --dry-run: the bundle is complete and every stage imports"
  return "$failed"
}

if [ "$DRY_RUN" = 1 ]; then
  dry_run
  exit $?
fi

if ! "$PYTHON" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  echo "gpu_check: no CUDA device is visible to $PYTHON (torch.cuda.is_available() is False" \
       "or torch is missing); these checks need a GPU, so nothing was run." >&2
  exit 2
fi
if ls "$WHEELS"/*.whl >/dev/null 2>&1; then
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/kvrelay-site "$WHEELS"/*.whl && export PYTHONPATH=$PYTHONPATH:/tmp/kvrelay-site
fi
unset TRITON_INTERPRET
mkdir -p "$OUT"
WORK=$(mktemp -d)
export KVRELAY_GPU_REPORT=$OUT/gpu_report.json
# Kernel tests compile one kernel per shape: spread over KERNEL_TEST_WORKERS processes
# where pytest-xdist is there (0: one process). The engine tests size their KV pools from
# free GPU memory, so they run one at a time.
PARALLEL=()
workers=${KERNEL_TEST_WORKERS:-8}
if [ "$workers" -gt 0 ] && "$PYTHON" -c "import xdist" 2>/dev/null; then
  PARALLEL=(-p xdist.plugin -n "$workers")
fi
device=$("$PYTHON" -c "import torch, triton, transformers; print(torch.cuda.get_device_name(), '| torch', torch.__version__, '| triton', triton.__version__, '| transformers', transformers.__version__, '| devices', torch.cuda.device_count())" 2>&1 | tail -1)
echo "$device" | tee "$WORK/device.txt"
nvidia-smi >>"$WORK/device.txt" 2>&1
summary=()
failed=0

write_summary() {
  local IFS=,
  printf '{"device": "%s", "stages": {%s}}\n' "${device//\"/}" "${summary[*]}" >"$OUT/summary.json"
  tar -czf "$OUT/logs.tar.gz" -C "$WORK" . 2>/dev/null
}

stage() {  # stage NAME LIMIT_S JUDGE_ARGS -- COMMAND...: run under its limit, judge, record
  local name=$1 limit=$2 start rc tests="null" judge=()
  shift 2
  while [ "$1" != "--" ]; do judge+=("$1"); shift; done
  shift
  start=$(date +%s)
  timeout -k 10 "$limit" "$@" >"$WORK/$name.log" 2>&1
  rc=$?
  if [ -f "$WORK/$name.xml" ]; then
    tests=$("$PYTHON" benchmarks/gpu_stage_result.py "$WORK/$name.xml" "${judge[@]}")
    [ $? -ne 0 ] && [ "$rc" -eq 0 ] && rc=1
  fi
  [ "$rc" -ne 0 ] && failed=1
  tail -15 "$WORK/$name.log"
  echo "== $name: exit $rc in $(( $(date +%s) - start ))s (limit ${limit}s) tests $tests"
  summary+=("\"$name\": {\"exit\": $rc, \"seconds\": $(( $(date +%s) - start )), \"limit\": $limit, \"tests\": $tests}")
  write_summary
}

stage kernel_tests "${KERNEL_TEST_TIMEOUT:-80}" -- \
  "$PYTHON" "${PYTEST[@]}" "${PARALLEL[@]}" --timeout 70 --junitxml "$WORK/kernel_tests.xml" \
  "${KERNEL_TESTS[@]}"
stage bench_attention "${ATTENTION_TIMEOUT:-30}" -- \
  "$PYTHON" benchmarks/gpu_kernels.py --skip-decode --batches 1 16 64 --contexts 4096 32768 \
  --out "$OUT/attention.json"
stage bench_decode_step "${DECODE_STEP_TIMEOUT:-45}" -- \
  "$PYTHON" benchmarks/gpu_kernels.py --skip-attention --decode-batches 1 16 64 \
  --out "$OUT/decode_step.json"
stage bench_quant_gemm "${QUANT_GEMM_TIMEOUT:-20}" -- \
  "$PYTHON" benchmarks/quant_gpu.py --rows 1 16 --out "$OUT/quant_gemm.json"
stage bench_kv_quant "${KV_QUANT_TIMEOUT:-25}" -- \
  "$PYTHON" benchmarks/kv_quant_decode_gpu.py --batches 1 8 --contexts 32768 \
  --out "$OUT/kv_quant_decode.json"
stage bench_lora "${LORA_TIMEOUT:-20}" -- \
  "$PYTHON" benchmarks/lora_gpu.py --rows 1 64 512 --ranks 16 64 --out "$OUT/lora.json"
stage engine_tests "${ENGINE_TEST_TIMEOUT:-150}" "${ENGINE_ALLOWED_SKIPS[@]}" -- \
  "$PYTHON" "${PYTEST[@]}" --timeout 120 --junitxml "$WORK/engine_tests.xml" \
  "${ENGINE_TESTS[@]}" "${ENGINE_DESELECT[@]}"

cat "$OUT/summary.json"
exit "$failed"
