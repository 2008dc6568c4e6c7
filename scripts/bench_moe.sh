#!/usr/bin/env bash
# bench_moe.sh [flags of scripts/bench_moe.py]: builds apc, then prints the mixture-of-experts
# figures: DeepSeek-V3 (full size, stub weights) planned on a 2-d and a 3-d mesh (wall time, peak
# memory, how the experts are cut), and the small MoE samples' optimizer plan against ddp and fsdp
# on CPU ranks (predicted beside measured step, calibrated). Figures, not a test.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh >/dev/null
exec .venv/bin/python3 scripts/bench_moe.py "$@"
