#!/usr/bin/env bash
# bench.sh: planning benchmark. For each sample model and mesh, runs `apc plan` and prints its
# summary (phase times, problem sizes before/after reduction, solver status) and the peak RSS.
# Usage: scripts/bench.sh [MODEL[:MESH] ...]   (default: every model on 8, 2x4 and 8x8)
# Figures only; correctness lives in the tests.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${APC_BUILD_DIR:-build}
APC="$BUILD_DIR/tools/apc"
[ -x "$APC" ] || scripts/build.sh >/dev/null
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT

cases=("$@")
if [ ${#cases[@]} -eq 0 ]; then
  for m in toy_block mlp_stack gpt2_tiny llama_tiny cnn_small gpt2_small llama_small llama3_8b; do
    for mesh in 8 2x4 8x8; do cases+=("$m:$mesh"); done
  done
fi

for c in "${cases[@]}"; do
  model=${c%%:*}
  mesh=${c#*:}
  [ "$mesh" = "$c" ] && mesh=8x8
  echo "=== $model on $mesh"
  if /usr/bin/time -v -o "$OUT/time" "$APC" plan "sample_models/out/$model.pt" --mesh "$mesh" \
      -o "$OUT/plan.json" --time-limit "${APC_BENCH_TIME_LIMIT:-120}" >"$OUT/log" 2>&1; then
    grep -E -i "phase|import|enumerate|build|solve|write|status|objective|nodes|variables|total" "$OUT/log" | head -20
  else
    echo "apc plan failed:"; tail -3 "$OUT/log"
  fi
  grep -E "Maximum resident|Elapsed" "$OUT/time" | sed 's/^\s*/  /'
done
