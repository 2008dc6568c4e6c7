#!/usr/bin/env bash
# bench_runtime.sh: runtime benchmark (figures only; correctness lives in tests/runtime).
#  1. Interpreter overhead on one rank: TorchScript's own forward+backward against apc's
#     interpreter on the same graph, weights and inputs (tools/apc-train/bench_runtime.cpp);
#     target ratio <= 1.05.
#  2. Collective bytes per step: each sample planned on a mesh, lowered, and trained one step by
#     apc-train on forked ranks with --report-comm, printing per rank the bytes its collectives
#     sent next to the bytes the plan priced (n of each step, and this rank's share by the
#     alpha-beta formulas).
# Usage: scripts/bench_runtime.sh [MODEL:MESH ...]   (default: the small samples on 4 and 2x2)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${APC_BUILD_DIR:-build}
APC="$BUILD_DIR/tools/apc"
TRAIN="$BUILD_DIR/tools/apc-train"
BENCH="$BUILD_DIR/tools/apc-bench-runtime"
for b in "$APC" "$TRAIN"; do [ -x "$b" ] || { echo "build $b first (scripts/build.sh)"; exit 1; }; done
# The benchmark binary is not in the default build (EXCLUDE_FROM_ALL): build it here.
cmake --build "$BUILD_DIR" --target apc-bench-runtime >/dev/null
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT

declare -A INPUTS=(
  [toy_block]="--input x:f32[4,16,1024]"
  [mlp_stack]="--input x:f32[8,64,128]"
  [gpt2_tiny]="--input idx:i64[8,64]"
  [llama_tiny]="--input tokens:i64[8,64]"
  [cnn_small]="--input x:f32[8,3,32,32]"
)

echo "=== interpreter overhead (1 rank, forward+backward, median)"
for m in toy_block mlp_stack gpt2_tiny llama_tiny cnn_small; do
  # shellcheck disable=SC2086
  "$BENCH" "sample_models/out/$m.pt" ${INPUTS[$m]} --iters "${APC_BENCH_ITERS:-5}"
done

cases=("$@")
if [ ${#cases[@]} -eq 0 ]; then
  for m in toy_block mlp_stack gpt2_tiny llama_tiny cnn_small; do
    for mesh in 4 2x2; do cases+=("$m:$mesh"); done
  done
fi
echo "=== collective bytes per step (rank: sent by the program's collectives | priced)"
for c in "${cases[@]}"; do
  model=${c%%:*}
  mesh=${c#*:}
  world=$(( ${mesh//x/*} ))
  echo "--- $model on $mesh"
  # shellcheck disable=SC2086
  if ! "$APC" plan "sample_models/out/$model.pt" ${INPUTS[$model]} --mesh "$mesh" -o "$OUT/plan.json" \
      --artifact "$OUT/art" >"$OUT/plan.log" 2>&1; then
    echo "apc plan failed:"; tail -3 "$OUT/plan.log"; continue
  fi
  port=$(( 20000 + RANDOM % 20000 ))
  pids=()
  for ((r = 0; r < world; r++)); do
    RANK=$r LOCAL_RANK=$r WORLD_SIZE=$world MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
      "$TRAIN" "$OUT/art" --steps 2 --report-comm >"$OUT/out.$r" 2>"$OUT/err.$r" &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || echo "a rank failed"; done
  # The second step (the first may include one-time set-up traffic).
  for ((r = 0; r < world; r++)); do grep "step 1 comm" "$OUT/err.$r" || tail -2 "$OUT/err.$r"; done
  rm -rf "$OUT/art"
done
