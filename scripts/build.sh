#!/usr/bin/env bash
# build.sh [--sanitize]: configures and builds apc (Release) into build/. Used by demo.sh and
# test.sh.
# --sanitize: apc with AddressSanitizer and UndefinedBehaviorSanitizer into build-asan/, then runs
# its unit tests (ctest -j1). With LibTorch (the project venv, unless APC_SANITIZE_TORCH=0) that is
# the whole project: the frontend, runtime, api and tools and their tests too. Our code is
# instrumented, LibTorch (the wheel) is not, which ASan and UBSan allow (docs/BUILD.md, "Sanitizers
# and fuzzing"); leaks are checked too. APC_SANITIZE_TORCH=0 builds the planner core only
# (support, ir, mesh, spec, cost, strategy, solver, plan, lower).
# APC_SANITIZE_TESTS='regex' runs only the ctest tests it matches.
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS=${APC_JOBS:-$(nproc)}
if [ "${1:-}" = "--sanitize" ]; then
  BUILD_DIR=${APC_BUILD_DIR:-build-asan}
  TORCH=${APC_SANITIZE_TORCH:-}
  if [ -z "$TORCH" ]; then
    TORCH=0
    [ -x .venv/bin/python3 ] && .venv/bin/python3 -c 'import torch' >/dev/null 2>&1 && TORCH=1
  fi
  WITH_TORCH=$([ "$TORCH" = 1 ] && echo ON || echo OFF)
  # (Re)configure when there is no build yet or it was configured with the other torch setting.
  if [ ! -f "$BUILD_DIR/build.ninja" ] ||
    ! grep -q "^APC_WITH_TORCH:BOOL=$WITH_TORCH\$" "$BUILD_DIR/CMakeCache.txt"; then
    # clang when installed (fuzz.sh needs it anyway: the same sanitizer runtime), else the default.
    CXX_ARG=()
    command -v clang++ >/dev/null 2>&1 && CXX_ARG=(-DCMAKE_CXX_COMPILER=clang++)
    cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DAPC_WITH_TORCH="$WITH_TORCH" \
      -DAPC_SANITIZE=ON "${CXX_ARG[@]}" >/dev/null
  fi
  cmake --build "$BUILD_DIR" -j "$JOBS"
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1 \
    ctest --test-dir "$BUILD_DIR" --output-on-failure -j 1 \
    ${APC_SANITIZE_TESTS:+-R "$APC_SANITIZE_TESTS"}
  exit 0
fi
BUILD_DIR=${APC_BUILD_DIR:-build}
if [ ! -f "$BUILD_DIR/build.ninja" ]; then
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
fi
cmake --build "$BUILD_DIR" -j "$JOBS"
