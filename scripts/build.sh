#!/usr/bin/env bash
# build.sh [--sanitize]: configures and builds apc (Release) into build/. Used by demo.sh and
# test.sh.
# --sanitize: the planner core (no LibTorch: support, ir, mesh, cost, strategy, solver, plan, lower)
# and its unit tests with AddressSanitizer and UndefinedBehaviorSanitizer into build-asan/, then
# runs those tests (ctest -j1). The LibTorch parts (frontend, runtime, api, tools) are not built
# there: LibTorch itself is not built with the sanitizers.
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS=${APC_JOBS:-$(nproc)}
if [ "${1:-}" = "--sanitize" ]; then
  BUILD_DIR=${APC_BUILD_DIR:-build-asan}
  if [ ! -f "$BUILD_DIR/build.ninja" ]; then
    cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DAPC_WITH_TORCH=OFF \
      -DAPC_SANITIZE=ON >/dev/null
  fi
  cmake --build "$BUILD_DIR" -j "$JOBS"
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1 \
    ctest --test-dir "$BUILD_DIR" --output-on-failure -j 1
  exit 0
fi
BUILD_DIR=${APC_BUILD_DIR:-build}
if [ ! -f "$BUILD_DIR/build.ninja" ]; then
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
fi
cmake --build "$BUILD_DIR" -j "$JOBS"
