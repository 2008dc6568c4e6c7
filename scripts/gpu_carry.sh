#!/usr/bin/env bash
# gpu_carry.sh: packs what a GPU machine without a package registry needs to run the GPU checks
# (scripts/gpu_all.sh) into .gpu/ (git-ignored through .git/info/exclude), at most ~40 MB:
#
#   .gpu/bin/      apc, apc-train, apc-bench-runtime of the CUDA build (scripts/build_cuda.sh;
#                  build them against the torch version of the GPU machine: APC_CUDA_VENV pointing
#                  at a venv with that torch, e.g. `pip install torch==2.11.0`)
#   .gpu/lib/      the shared libraries they load besides torch, glibc and libstdc++ (CBC, Clp,
#                  Cgl, Osi, CoinUtils, protobuf, LAPACK/BLAS, gfortran): Debian's, which the
#                  GPU machine's image does not have
#   .gpu/samples/  the sample models the checks use (sample_models/out is too large to carry)
#
# Then, on the GPU machine (the device tool): carry [".gpu"] and run scripts/gpu_all.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${APC_CUDA_BUILD_DIR:-build-cuda}
SAMPLES=${APC_GPU_SAMPLES:-"mlp_stack.pt mlp_stack.pt2 llama_small.pt2 gpt2_small.pt2 cnn_small.pt2
  llama_small.pt gpt2_small.pt
  cnn_small.pt llama_tiny.pt hf_llama_tiny.pt2 hf_gpt2_tiny.pt2"}

die() { echo "gpu_carry: $*" >&2; exit 1; }
cmake --build "$BUILD_DIR" --target apc apc-train apc-bench-runtime >/dev/null ||
  die "cannot build the CUDA binaries in $BUILD_DIR (scripts/build_cuda.sh first)"
grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >>.git/info/exclude
rm -rf .gpu
mkdir -p .gpu/bin .gpu/lib .gpu/samples
for b in apc apc-train apc-bench-runtime; do
  cp "$BUILD_DIR/tools/$b" .gpu/bin/
  strip --strip-debug .gpu/bin/$b
done
# Every library the binaries resolve outside torch's folders and the system's base set.
ldd .gpu/bin/apc .gpu/bin/apc-train | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' | sort -u |
  while read -r name path; do
    case "$name" in
      libc.so* | libm.so* | libdl.so* | librt.so* | libpthread.so* | libstdc++.so* | libgcc_s.so* | \
        libz.so* | libbz2.so* | libcrypto.so* | libssl.so* | libutil.so* | ld-linux*) continue ;;
    esac
    case "$path" in */torch/lib/* | */nvidia/* | */cuda*) continue ;; esac
    cp -L "$path" ".gpu/lib/$name"
  done
for s in $SAMPLES; do
  [ -f "sample_models/out/$s" ] || die "sample_models/out/$s is missing (scripts/setup.sh)"
  cp "sample_models/out/$s" .gpu/samples/
done
du -sh .gpu
ls .gpu/lib | xargs echo "gpu_carry: libraries:"
