#!/usr/bin/env bash
# One pass over everything that needs a GPU: the Triton kernels compiled and tested against
# their references, the engine's GPU tests (bf16 vs CPU fp32, CUDA graphs vs eager, KV
# sizing) and the kernel benchmarks. Results land in $OUT (default benchmarks/results/gpu).
#
# Runs from the repository root with the packages importable from the tree, so it works on a
# bare GPU host that has torch, triton and transformers but cannot install anything; wheels
# in .whl/ (msgspec, gguf) are unpacked first when present.
set -uo pipefail
OUT=${OUT:-benchmarks/results/gpu}
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/kvrelay-site .whl/*.whl \
    && export PYTHONPATH=/tmp/kvrelay-site
fi
export PYTHONPATH=client:kernels:worker:tests:${PYTHONPATH:-}
export KVRELAY_TEST_TOKENIZER_DIR=${KVRELAY_TEST_TOKENIZER_DIR:-.devdata/smollm2-tokenizer}
export KVRELAY_GPU_REPORT=$OUT/gpu_report.json
export PYTHONUNBUFFERED=1
unset TRITON_INTERPRET
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/device.txt"
python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)" | tee -a "$OUT/device.txt"
if [ "${RUN_KERNEL_TESTS:-1}" = 1 ]; then
  start=$(date +%s)
  timeout "${KERNEL_TEST_TIMEOUT:-240}" python3 -m pytest tests/kernels -q -p no:cacheprovider \
    -o addopts="" --timeout 120 2>&1 | tee "$OUT/kernel_tests.log" | tail -25
  echo "kernel tests: $(( $(date +%s) - start ))s"
fi
if [ "${RUN_ENGINE_TESTS:-1}" = 1 ]; then
  start=$(date +%s)
  timeout "${ENGINE_TEST_TIMEOUT:-200}" python3 -m pytest tests/engine/test_gpu_engine.py -q -s \
    -p no:cacheprovider -o addopts="" --timeout 150 ${ENGINE_TEST_SELECT:+-k "$ENGINE_TEST_SELECT"} \
    2>&1 | tee "$OUT/engine_gpu_tests.log" | tail -25
  echo "engine gpu tests: $(( $(date +%s) - start ))s"
fi
if [ "${RUN_BENCH:-1}" = 1 ]; then
  start=$(date +%s)
  timeout "${BENCH_TIMEOUT:-240}" python3 benchmarks/kernels.py --out "$OUT/kernels.json" ${BENCH_ARGS:-} \
    2>&1 | tee "$OUT/bench.log"
  echo "benchmarks: $(( $(date +%s) - start ))s"
fi
