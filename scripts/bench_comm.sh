#!/usr/bin/env bash
# bench_comm.sh: collective benchmark of the Gloo communicator. For each mesh, `apc run` starts
# one comm_worker per rank, which times World::create and, on every mesh dim, each collective on
# a tensor of n MiB (n as in apc/cost/collectives.h), printing the time and the bytes each rank sent.
# Usage: scripts/bench_comm.sh [MESH ...]   (default: 2 4 2x4; APC_BENCH_MIB=16, APC_BENCH_ITERS=5)
# Figures only; correctness lives in tests/runtime/comm_test.cpp.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${APC_BUILD_DIR:-build}
APC="$BUILD_DIR/tools/apc"
WORKER="$BUILD_DIR/tests/runtime/comm_worker"
for b in "$APC" "$WORKER"; do [ -x "$b" ] || { echo "build $b first (scripts/build.sh)"; exit 1; }; done
DIR=$(mktemp -d)
trap 'rm -rf "$DIR"' EXIT

meshes=("$@")
[ ${#meshes[@]} -eq 0 ] && meshes=(2 4 2x4)
for mesh in "${meshes[@]}"; do
  n=1
  for s in ${mesh//x/ }; do n=$((n * s)); done
  "$APC" run "$DIR" --nproc "$n" --timeout 600 -- \
    "$WORKER" bench "$mesh" "${APC_BENCH_MIB:-16}" "${APC_BENCH_ITERS:-5}"
done
