#!/usr/bin/env bash
# bench_memory.sh [flags of scripts/bench_memory.py]: builds apc, then prints per model, plan and
# optimizer the predicted peak memory per rank (the plan's memory model) beside the one apc-train
# --profile measures on 2 CPU ranks (apc's host caching allocator), per phase too, with the mean
# absolute error; then the --device-memory plans of llama3_8b on 8x8 at 80, 40 and 24 GiB (solve
# time, status, predicted peak). Figures, not a test (issue 29).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh >/dev/null
exec .venv/bin/python3 scripts/bench_memory.py "$@"
