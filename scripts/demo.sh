#!/usr/bin/env bash
# demo.sh: installs what is missing, builds, and runs the main job on a bundled sample model.
# Imports llama_tiny and prints its graph, lists the strategies of toy_block on a 2x4 mesh, then
# plans toy_block on 2x4 (dp x tp) with a batch-sharded input and explains the plan.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
BUILD_DIR=${APC_BUILD_DIR:-build}
APC="$BUILD_DIR/tools/apc"
"$APC" inspect sample_models/out/llama_tiny.pt --input tokens:i64[8,128]
echo
"$APC" inspect sample_models/out/toy_block.pt --spec sample_models/specs/toy_block_2x4.json --strategies
echo
mkdir -p out
"$APC" plan sample_models/out/toy_block.pt --spec sample_models/specs/toy_block_2x4.json -o out/toy_block_2x4.plan.json
echo
"$APC" explain out/toy_block_2x4.plan.json --top 5
