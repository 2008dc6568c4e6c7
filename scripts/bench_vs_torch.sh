#!/usr/bin/env bash
# bench_vs_torch.sh [flags of scripts/bench_vs_torch.py]: builds apc, then prints per sample model
# the median training step and peak memory per rank under PyTorch's DDP and FSDP2 and under apc's
# ddp, fsdp and optimizer's plans, on the same CPU ranks (default 2, one thread each). Figures,
# not a test.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh >/dev/null
exec .venv/bin/python3 scripts/bench_vs_torch.py "$@"
