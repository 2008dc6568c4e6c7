#!/usr/bin/env bash
# bench_fidelity.sh [flags of scripts/bench_fidelity.py]: builds apc, calibrates the CPU ranks
# (apc calibrate) and prints, per model and plan, the predicted beside the measured step time
# (apc-train --profile), then per model the mean absolute percentage error, Kendall's tau of the
# two orders and how far the optimizer's plan is from the fastest. Default: 2 ranks, one thread
# each; --nproc 4 runs 4 ranks (on a 2-core machine they share the cores). Figures, not a test.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh >/dev/null
exec .venv/bin/python3 scripts/bench_fidelity.py "$@"
