#!/usr/bin/env bash
# test.sh: installs what is missing, builds, and runs the whole test suite with ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
ctest --test-dir "${APC_BUILD_DIR:-build}" --output-on-failure -j "${APC_TEST_JOBS:-2}"
