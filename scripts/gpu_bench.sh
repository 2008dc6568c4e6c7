#!/usr/bin/env bash
# gpu_bench.sh: the measurement loop on a machine with CUDA GPUs (never a CI dependency).
#
#  1. build-cuda/tools/{apc,apc-train} as gpu_smoke.sh finds or builds them (scripts/build_cuda.sh),
#     with LD_LIBRARY_PATH pointed at a matching torch when the build's RUNPATH is gone.
#  2. apc calibrate --device cuda on 1 GPU: the compute tables (matmul f32/bf16, elementwise
#     bandwidth, the per-op floor); with 2+ GPUs (APC_GPU_NPROC, default all) also the NCCL
#     collectives of a 1-d mesh over them.
#  3. Per model (sample_models/out: mlp_stack, llama_small, gpt2_small, cnn_small by default;
#     APC_GPU_MODELS; then larger batches of three, APC_GPU_LARGE), plans priced with that profile
#     on a mesh of 1 (and of N with 2+ GPUs:
#     the optimizer's plan, ddp, fsdp), lowered, trained with apc-train --device cuda --profile
#     --json; prints predicted beside measured step time and the error, then the mean absolute
#     percentage error.
#  4. With 2+ GPUs: scripts/bench_vs_torch.py --device cuda, apc's plans beside torch's DDP and
#     FSDP2 on the same GPUs (step time and the CUDA allocator's peak).
# Output in out/gpu_bench/ (APC_GPU_BENCH_DIR): cluster.json and one profile JSON per case.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${APC_CUDA_BUILD_DIR:-build-cuda}
WORK=${APC_GPU_BENCH_DIR:-out/gpu_bench}
STEPS=${APC_GPU_STEPS:-10}
APC="$BUILD_DIR/tools/apc"
TRAIN="$BUILD_DIR/tools/apc-train"
say() { echo "gpu_bench: $*"; }

if [ ! -x "$APC" ] || [ ! -x "$TRAIN" ]; then scripts/build_cuda.sh; fi
PY=${APC_PYTHON:-}
for p in .venv-cuda/bin/python3 .venv/bin/python3 "$(command -v python3 || true)"; do
  [ -n "$PY" ] && break
  if [ -n "$p" ] && [ -x "$p" ] && "$p" -c 'import torch' 2>/dev/null; then PY=$p; fi
done
if ldd "$TRAIN" | grep -q "not found"; then
  torch_lib=$("$PY" -c 'import os, torch; print(os.path.dirname(torch.__file__) + "/lib")')
  export LD_LIBRARY_PATH="$torch_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
GPUS=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
if [ "$GPUS" -lt 1 ]; then say "no GPU (nvidia-smi lists none)"; exit 3; fi
NPROC=${APC_GPU_NPROC:-$GPUS}
mkdir -p "$WORK"
say "$("$APC" --version), $GPUS GPU(s): $(nvidia-smi -L | head -1)"

say "calibrating 1 GPU"
"$APC" calibrate --nproc 1 --device cuda -o "$WORK/cluster1.json" | sed 's/^/  /'
if [ "$NPROC" -ge 2 ]; then
  say "calibrating $NPROC GPUs (NCCL)"
  "$APC" calibrate --nproc "$NPROC" --device cuda -o "$WORK/cluster$NPROC.json" | sed 's/^/  /'
fi

MODELS=${APC_GPU_MODELS:-mlp_stack llama_small gpt2_small cnn_small}
printf '%-14s %-6s %-6s %13s %12s %8s\n' model ranks plan "predicted ms" "measured ms" error
errs=()
run_case() {  # model[:file] ranks plan [flags...]  (file: default MODEL.pt2 in sample_models/out)
  local m=${1%%:*} file=${1#*:} n=$2 plan=$3
  [ "$file" != "$1" ] || file=$m.pt2
  shift 3
  local art="$WORK/${m}_${n}_${plan}"
  "$APC" plan "sample_models/out/$file" --mesh "$n" --cluster "$WORK/cluster$n.json" --quiet \
    -o "$art.plan.json" --artifact "$art" "$@" || { say "$m $plan: not planned"; return; }
  "$APC" run "$art" --nproc "$n" --timeout 900 -- "$TRAIN" "$art" --device cuda --steps "$STEPS" \
    --profile --json > "$art.profile.json" || { say "$m $plan: run failed"; return; }
  "$PY" - "$art.profile.json" "$m" "$n" "$plan" <<'PYEOF'
import json, sys
p = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
print(f"{sys.argv[2]:<14} {sys.argv[3]:<6} {sys.argv[4]:<6} {p['predicted_step_ms']:13.3f} "
      f"{p['measured_step_ms']:12.3f} {p['error_pct']:7.1f}%")
PYEOF
}
for m in $MODELS; do
  [ -f "sample_models/out/$m.pt2" ] || { say "no sample_models/out/$m.pt2 (run scripts/setup.sh)"; continue; }
  run_case "$m" 1 auto
  if [ "$NPROC" -ge 2 ]; then
    run_case "$m" "$NPROC" auto --memory-budget 0,1
    run_case "$m" "$NPROC" ddp --strategy ddp
    run_case "$m" "$NPROC" fsdp --strategy fsdp
  fi
done | tee "$WORK/table.txt"
# Larger batches (TorchScript samples, whose inputs any shape re-traces): compute-bound steps,
# where the measured kernel curves matter more than the per-op dispatch.
# APC_GPU_LARGE: "label:file:input ..." (empty: none).
LARGE=${APC_GPU_LARGE-"llama_small_b64:llama_small.pt:tokens:i64[64,128] \
gpt2_small_b32:gpt2_small.pt:idx:i64[32,128] cnn_small_b256:cnn_small.pt:x:f32[256,3,32,32]"}
for c in $LARGE; do
  label=${c%%:*} rest=${c#*:}
  file=${rest%%:*} input=${rest#*:}
  [ -f "sample_models/out/$file" ] || { say "no sample_models/out/$file"; continue; }
  run_case "$label:$file" 1 auto --input "$input"
done | tee -a "$WORK/table.txt"
"$PY" - "$WORK/table.txt" <<'PYEOF'
import sys
errs = [abs(float(l.split()[-1].rstrip('%'))) for l in open(sys.argv[1]) if l.strip().endswith('%')]
if errs:
    print(f"mean absolute percentage error over {len(errs)} cases: {sum(errs) / len(errs):.1f}%")
PYEOF
# Beside PyTorch's own DDP and FSDP2 on the same GPUs (issue 30), with 2+ GPUs and a CUDA torch.
if [ "$NPROC" -ge 2 ] && "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
  say "apc against torch DDP and FSDP2 on $NPROC GPUs"
  "$PY" scripts/bench_vs_torch.py --build "$BUILD_DIR" --device cuda --nproc "$NPROC" \
    --cluster "$WORK/cluster$NPROC.json" --steps "$STEPS" --warmup 3 --repeats 2 \
    --json "$WORK/vs_torch.json" || say "bench_vs_torch failed"
fi
