#!/usr/bin/env bash
# gpu_all.sh: every GPU check in one run, sized for a lease of minutes on a machine with one or
# more CUDA GPUs and no package registry (never a CI dependency). Prepare with
# scripts/gpu_carry.sh (binaries built against that machine's torch, Debian's libraries, samples
# in .gpu/); there, in the repository root:
#
#   scripts/gpu_all.sh OUTDIR
#
#  1. Unpacks .gpu/ (binaries into build-cuda/tools, samples into sample_models/out), points
#     LD_LIBRARY_PATH at .gpu/lib and at the torch/lib of the machine's python3, prints the GPU,
#     torch's version and any library the binaries cannot find.
#  2. scripts/gpu_smoke.sh: CUDA losses = CPU losses, sharded = single (NCCL with 2+ GPUs).
#  3. Interpreter overhead on cuda:0: apc-bench-runtime --device cuda on the TorchScript samples,
#     at the CPU benchmark's input sizes and at 8x larger batches, against TorchScript run eagerly
#     (two also against TorchScript's optimizing executor, --jit-optimize).
#  4. scripts/gpu_bench.sh: apc calibrate --device cuda, then per model the plan's predicted step
#     beside apc-train --profile's measured one (mesh 1; with 2+ GPUs also ddp/fsdp/auto on N).
#  5. scripts/bench_eager.py: the same models and batches trained in eager PyTorch (the machine's
#     torch, SGD), beside apc-train's measured step.
#
# Each part has its own time limit and a failed part does not stop the next. Logs, the calibrated
# cluster profile and the fidelity table go to OUTDIR (default out/gpu_all).
set -uo pipefail
cd "$(dirname "$0")/.."
OUTDIR=${1:-out/gpu_all}
mkdir -p "$OUTDIR" build-cuda/tools sample_models/out
say() { echo "gpu_all: $*"; }

# 1. Unpack and look around.
[ -d .gpu/bin ] || { say "no .gpu/ (run scripts/gpu_carry.sh and carry .gpu)"; exit 1; }
cp .gpu/bin/* build-cuda/tools/
for f in .gpu/samples/*; do [ -e "sample_models/out/${f##*/}" ] || cp "$f" sample_models/out/; done
PY=${APC_PYTHON:-python3}
torch_lib=$("$PY" -c 'import os, torch; print(os.path.dirname(torch.__file__) + "/lib")')
export LD_LIBRARY_PATH="$PWD/.gpu/lib:$torch_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export APC_PYTHON=$PY
{
  nvidia-smi -L
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader
  "$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'
  nproc
  ldd build-cuda/tools/apc build-cuda/tools/apc-train | grep "not found" || echo "libraries: all found"
  build-cuda/tools/apc --version
} 2>&1 | tee "$OUTDIR/machine.log"

# 2. Smoke.
say "gpu_smoke"
timeout 240 scripts/gpu_smoke.sh >"$OUTDIR/smoke.log" 2>&1
say "gpu_smoke exit $?"
tail -12 "$OUTDIR/smoke.log"

# 3. Interpreter overhead.
say "interpreter overhead on cuda:0"
bench() {  # model input [flags...]
  local m=$1 input=$2
  shift 2
  timeout 60 build-cuda/tools/apc-bench-runtime "sample_models/out/$m.pt" --input "$input" \
    --device cuda --iters 20 "$@" 2>&1 | tail -1
}
# (gpt2_tiny.pt is left out: traced on the CPU, TorchScript itself cannot run it on CUDA, "index
# is on cpu, different from other tensors on cuda:0".)
{
  bench mlp_stack 'x:f32[8,64,128]'
  bench mlp_stack 'x:f32[64,64,128]'
  bench llama_tiny 'tokens:i64[8,64]'
  bench llama_tiny 'tokens:i64[64,64]'
  bench cnn_small 'x:f32[8,3,32,32]'
  bench cnn_small 'x:f32[64,3,32,32]'
  bench llama_tiny 'tokens:i64[8,64]' --jit-optimize
  bench mlp_stack 'x:f32[8,64,128]' --jit-optimize
} | tee "$OUTDIR/bench_runtime.log"

# 4. Fidelity.
say "gpu_bench"
APC_GPU_MODELS=${APC_GPU_MODELS:-"mlp_stack llama_small gpt2_small cnn_small hf_llama_tiny hf_gpt2_tiny"} \
  APC_GPU_BENCH_DIR=out/gpu_bench timeout 420 scripts/gpu_bench.sh >"$OUTDIR/gpu_bench.log" 2>&1
say "gpu_bench exit $?"
tail -30 "$OUTDIR/gpu_bench.log"
cp out/gpu_bench/cluster1.json "$OUTDIR/" 2>/dev/null || true

# 5. apc-train's step beside eager PyTorch's on the same model, batch and device.
say "apc-train against eager PyTorch on cuda:0"
eager() {  # profile-label model [--shape S]
  local prof="out/gpu_bench/$1_1_auto.profile.json" m=$2
  shift 2
  [ -s "$prof" ] || { say "no $prof"; return; }
  timeout 120 "$PY" scripts/bench_eager.py "$m" --device cuda --apc-profile "$prof" "$@" 2>&1 | tail -1
}
{
  eager mlp_stack mlp_stack
  eager cnn_small cnn_small
  eager llama_small llama_small
  eager gpt2_small gpt2_small
  eager cnn_small_b256 cnn_small --shape 256,3,32,32
  eager llama_small_b64 llama_small --shape 64,128
  eager gpt2_small_b32 gpt2_small --shape 32,128
} | tee "$OUTDIR/eager.log"
tar czf "$OUTDIR/profiles.tar.gz" -C out/gpu_bench $(cd out/gpu_bench && ls ./*.profile.json ./*.plan.json 2>/dev/null) 2>/dev/null || true
