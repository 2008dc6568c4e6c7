#!/usr/bin/env bash
# demo.sh: installs what is missing, builds, and runs the main job on a bundled sample model.
# Until the optimizer lands this imports llama_tiny and prints its graph with `apc inspect`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
BUILD_DIR=${APC_BUILD_DIR:-build}
"$BUILD_DIR/tools/apc" inspect sample_models/out/llama_tiny.pt --input tokens:i64[8,128]
