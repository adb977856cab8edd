#!/usr/bin/env bash
# A/B against another commit, same machine, same run: offline.py, serve.py and
# engine_overhead.py on this tree and on COMMIT, alternated (A B, then B A, ...), then the
# mean of each and the ratio. offline.py and serve.py are each tree's own (same workload);
# engine_overhead.py is this tree's, run on both trees' packages.
#
#   benchmarks/ab.sh COMMIT [ROUNDS]      (default 2 rounds: about 20 minutes on 2 cores)
#   BENCHES="serve" benchmarks/ab.sh COMMIT 4      (only some of the benchmarks)
#
# COMMIT is checked out in a temporary git worktree and run with this tree's virtual
# environment, its packages put first on PYTHONPATH (worker subprocesses inherit it).
# Results: benchmarks/results/ab/<side>-<benchmark>-<round>.json and summary.json.
set -euo pipefail
commit=${1:?usage: benchmarks/ab.sh COMMIT [ROUNDS]}
rounds=${2:-2}
here=$(cd "$(dirname "$0")/.." && pwd)
python=$here/.venv/bin/python
out=$here/benchmarks/results/ab
base=$(mktemp -d -t kvrelay-ab-XXXX)
mkdir -p "$out"
git -C "$here" worktree add --detach "$base/tree" "$commit" >/dev/null
trap 'git -C "$here" worktree remove --force "$base/tree"; rm -rf "$base"' EXIT

run() {  # run SIDE BENCHMARK ROUND
  local tree=$here path=
  if [ "$1" = base ]; then tree=$base/tree; path=$tree/client:$tree/worker:$tree/kernels; fi
  local args=(--out "$out/$1-$2-$3.json") script=benchmarks/$2.py
  [ "$2" = offline ] && args+=(--systems kvrelay --repeats 1)
  [ "$2" = engine_overhead ] && args+=(--folder "$base/tiny") && script=$here/$script
  echo "round $3: $2 on $1" >&2
  (cd "$tree" && PYTHONPATH=$path "$python" "$script" "${args[@]}") > "$out/$1-$2-$3.log" 2>&1
}

benches=${BENCHES:-engine_overhead offline serve}
rm -f "$out"/*.json
"$python" "$here/benchmarks/engine_overhead.py" --prepare-only --folder "$base/tiny" 2>/dev/null

for round in $(seq 1 "$rounds"); do
  order="base this"; [ $((round % 2)) = 0 ] && order="this base"
  for bench in $benches; do
    for side in $order; do run "$side" "$bench" "$round"; done
  done
done
"$python" "$here/benchmarks/ab_summary.py" "$out" "$commit"
