#!/usr/bin/env bash
# torchvision_models.sh [flags of scripts/export_torchvision.py]: torchvision's resnet18,
# mobilenet_v3_small and shufflenet_v2_x0_5 (random weights, training mode, 8x3x64x64) as
# torch.export programs in sample_models/out/torchvision/tv_<name>.pt2, for the benchmarks'
# models we did not write:
#   .venv/bin/python3 scripts/bench_fidelity.py --model tv_resnet18=sample_models/out/torchvision/tv_resnet18.pt2
# torchvision needs torch 2.14.1 on this machine kind (not the project venv's CPU torch 2.13), so it
# goes into .venv-cuda (as scripts/build_cuda.sh makes it; about 5.5 GB, from the local wheels), the
# CUDA build, which runs on the CPU. Not part of CI.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${APC_CUDA_VENV:-.venv-cuda}
if ! "$VENV/bin/python3" -c 'import torchvision' 2>/dev/null; then
  if [ ! -x "$VENV/bin/python3" ]; then
    py=$(command -v python3.11 || command -v python3)
    echo "torchvision_models: creating $VENV with $py (several GB)"
    "$py" -m venv "$VENV"
  fi
  echo "torchvision_models: installing torch==2.14.1 torchvision==0.29.1 into $VENV"
  "$VENV/bin/pip" install -q --disable-pip-version-check torch==2.14.1 torchvision==0.29.1
fi
exec "$VENV/bin/python3" scripts/export_torchvision.py "$@"
