#!/usr/bin/env bash
# gpu_nodes.sh: per-op times of training steps on a GPU beside the plan's prices, to find what the
# cost model misprices (apc-train --profile --profile-nodes). After scripts/gpu_all.sh's unpacking
# (or with build-cuda/ and sample_models/out/ in place), on a machine with a CUDA GPU:
#
#   scripts/gpu_nodes.sh OUTDIR ["label:file[:input]" ...]
#
# Calibrates cuda:0 (apc calibrate), plans each case on a mesh of 1 with that profile, trains it
# with --profile --profile-nodes and writes the per-op table to OUTDIR/nodes_<label>.txt (also
# printed). Default cases: the samples gpu_bench.sh measured worst (mlp_stack, llama_small at
# batch 64, cnn_small at batch 256, gpt2_small).
set -uo pipefail
cd "$(dirname "$0")/.."
OUTDIR=${1:-out/gpu_nodes}
shift || true
BUILD_DIR=${APC_CUDA_BUILD_DIR:-build-cuda}
APC="$BUILD_DIR/tools/apc"
TRAIN="$BUILD_DIR/tools/apc-train"
WORK=out/gpu_nodes_work
mkdir -p "$OUTDIR" "$WORK"
CASES=("$@")
[ ${#CASES[@]} -gt 0 ] || CASES=("mlp_stack:mlp_stack.pt2" "llama_small_b64:llama_small.pt:tokens:i64[64,128]"
  "cnn_small_b256:cnn_small.pt:x:f32[256,3,32,32]" "gpt2_small:gpt2_small.pt2")
"$APC" calibrate --nproc 1 --device cuda -o "$WORK/cluster1.json" | sed 's/^/  /'
for c in "${CASES[@]}"; do
  label=${c%%:*} rest=${c#*:}
  file=${rest%%:*} input=${rest#*:}
  args=()
  [ "$input" != "$rest" ] && args=(--input "$input")
  art="$WORK/$label"
  if ! "$APC" plan "sample_models/out/$file" --mesh 1 --cluster "$WORK/cluster1.json" --quiet \
      -o "$art.plan.json" --artifact "$art" "${args[@]}"; then
    echo "gpu_nodes: $label: not planned"
    continue
  fi
  {
    echo "== $label ($file ${args[*]})"
    "$APC" run "$art" --nproc 1 --timeout 600 -- "$TRAIN" "$art" --device cuda --steps 5 \
      --profile --profile-nodes 2>&1 | grep -v "^step \|progress"
  } | tee "$OUTDIR/nodes_$label.txt"
done
