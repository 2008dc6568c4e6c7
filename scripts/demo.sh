#!/usr/bin/env bash
# demo.sh: installs what is missing, builds, and runs the main job on a bundled sample model.
# Imports llama_tiny's exported program (.pt2) and prints its graph, lists the strategies of
# toy_block on a 2x4 mesh, plans toy_block on 2x4 (dp x tp) with a batch-sharded input and explains
# the plan, then plans mlp_stack's exported program on 2x2 and trains it on 4 CPU ranks.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
BUILD_DIR=${APC_BUILD_DIR:-build}
APC="$BUILD_DIR/tools/apc"
"$APC" --version
"$APC" inspect sample_models/out/llama_tiny.pt2
echo
"$APC" inspect sample_models/out/toy_block.pt --spec sample_models/specs/toy_block_2x4.json --strategies
echo
mkdir -p out
"$APC" plan sample_models/out/toy_block.pt --spec sample_models/specs/toy_block_2x4.json -o out/toy_block_2x4.plan.json
echo
"$APC" explain out/toy_block_2x4.plan.json --top 5
echo
# Plan mlp_stack's exported program (its batch dim is symbolic in the export) on 2x2, lower it to
# an artifact and train it 5 steps on 4 CPU ranks from the .pt2's weights (apc run sets the torchrun
# variables), next to the unsharded TorchScript model trained in rank 0 from the same weights and
# data.
"$APC" plan sample_models/out/mlp_stack.pt2 --mesh 2x2 \
  -o out/mlp_stack_2x2.plan.json --artifact out/mlp_stack_2x2
"$APC" run out/mlp_stack_2x2 --nproc 4 --timeout 300 -- "$BUILD_DIR/tools/apc-train" out/mlp_stack_2x2 \
  --steps 5 --lr 0.1 --model sample_models/out/mlp_stack.pt2 \
  --compare-single sample_models/out/mlp_stack.pt
