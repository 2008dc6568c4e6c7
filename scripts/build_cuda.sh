#!/usr/bin/env bash
# build_cuda.sh: the GPU build variant (docs/BUILD.md): the runtime, apc and apc-train against the
# CUDA torch wheel, with the NCCL backend (c10d::ProcessGroupNCCL), into build-cuda/. No tests.
# It compiles and links; running on a GPU is scripts/gpu_smoke.sh.
#
# 1. The venv .venv-cuda (git-ignored), created when missing with `pip install torch==2.14.1`: on
#    Linux x86_64 that wheel is the CUDA 13.0 build and pulls the nvidia-* wheels (cudart, cuBLAS,
#    cuSPARSE, cuDNN, NCCL, ...) into .venv-cuda/lib/python3.*/site-packages/nvidia/. About 5.4 GB.
# 2. A CUDA toolkit for LibTorch's CMake config (Caffe2's cuda.cmake runs FindCUDA and
#    enable_language(CUDA)): nvcc, cudart and the CUDA headers, at $CUDA_HOME or /usr/local/cuda.
#    The math libraries' headers and NCCL's come from the nvidia wheels when the toolkit has none.
# 3. Configure (Release, Ninja, APC_WITH_NCCL=ON so that a missing NCCL fails the configure, no
#    tests) and build the targets apc and apc-train.
#
# Environment: APC_CUDA_BUILD_DIR (build-cuda), APC_CUDA_VENV (.venv-cuda), APC_CUDA_TORCH_SPEC
# (torch==2.14.1), APC_CUDA_VENV_PYTHON (the python that makes the venv: python3.11 when there is
# one, else python3), APC_JOBS (nproc).
set -euo pipefail
cd "$(dirname "$0")/.."

BUILD_DIR=${APC_CUDA_BUILD_DIR:-build-cuda}
VENV=${APC_CUDA_VENV:-.venv-cuda}
TORCH_SPEC=${APC_CUDA_TORCH_SPEC:-torch==2.14.1}
JOBS=${APC_JOBS:-$(nproc)}

die() { echo "build_cuda: $*" >&2; exit 1; }

if [ ! -x "$VENV/bin/python3" ]; then
  py=${APC_CUDA_VENV_PYTHON:-$(command -v python3.11 || command -v python3 || true)}
  [ -n "$py" ] || die "no python3 to create $VENV with"
  echo "build_cuda: creating $VENV with $py and installing $TORCH_SPEC (several GB)"
  "$py" -m venv "$VENV"
  "$VENV/bin/pip" install -q --disable-pip-version-check "$TORCH_SPEC"
fi
torch_version=$("$VENV/bin/python3" -c 'import torch; print(torch.__version__)' 2>/dev/null) ||
  die "$VENV/bin/python3 cannot import torch"
cuda_version=$("$VENV/bin/python3" -c 'import torch; print(torch.version.cuda or "")' 2>/dev/null)
[ -n "$cuda_version" ] || die "the torch in $VENV ($torch_version) is a CPU build; use a CUDA wheel"

toolkit=""
for d in "${CUDA_HOME:-}" "${CUDA_PATH:-}" /usr/local/cuda; do
  if [ -n "$d" ] && [ -f "$d/include/cuda.h" ] && [ -x "$d/bin/nvcc" ]; then toolkit=$d; break; fi
done
[ -n "$toolkit" ] || die "no CUDA toolkit (nvcc, cudart, headers) at \$CUDA_HOME, \$CUDA_PATH or \
/usr/local/cuda; LibTorch's CMake config needs one (CUDA $cuda_version, the version of the wheel)"
nvcc_version=$("$toolkit/bin/nvcc" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p')
echo "build_cuda: torch $torch_version (CUDA $cuda_version), toolkit $toolkit (nvcc $nvcc_version)"

if [ ! -f "$BUILD_DIR/build.ninja" ]; then
  mkdir -p "$BUILD_DIR"
  log=$BUILD_DIR/configure.log
  CUDA_HOME=$toolkit cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DAPC_PYTHON="$(cd "$VENV" && pwd)/bin/python3" -DAPC_BUILD_TESTS=OFF -DAPC_WITH_NCCL=ON \
    >"$log" 2>&1 ||
    { tail -30 "$log" >&2; die "configure failed (log: $log)"; }
  grep -E '^-- (apc:|PyTorch: CUDA detected)' "$log" || true
fi
start=$(date +%s)
cmake --build "$BUILD_DIR" -j "$JOBS" --target apc apc-train
echo "build_cuda: $BUILD_DIR/tools/apc and apc-train built in $(( $(date +%s) - start )) s"
