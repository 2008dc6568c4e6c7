#!/usr/bin/env bash
# fuzz.sh [SECONDS] | --smoke: builds the libFuzzer targets of tests/fuzz with clang, AddressSanitizer
# and UndefinedBehaviorSanitizer into build-fuzz/ and runs each for SECONDS (default 300) on its
# seed corpus, then prints the executions per target. Exit 0 when no target found a crash; a
# crashing input is kept in build-fuzz/crashes/<target>/.
#
# Targets: fuzz_spec (spec files), fuzz_shardings (--in/--out-shardings files), fuzz_plan (the plan
# reader with what explain and diff do), fuzz_plan_edit (structured edits of a valid plan, rehashed,
# through verifyPlan and lowering), fuzz_artifact (manifest.json and rank programs; the
# runtime reads artifacts through the same reader), fuzz_inputs (the --input shape text and the
# exported program's symbolic expressions), and, when LibTorch is available (the project venv, or
# APC_FUZZ_TORCH=1), the model loaders: fuzz_pt2 (the .pt2 zip, models/model.json and the weight
# configs through the importer and loadModelState) and fuzz_pt (TorchScript archives and their
# extra/apc_inputs.json). Our code is instrumented; LibTorch (the wheel) is not. APC_FUZZ_TORCH=0
# leaves the two out (a build of the planner core only).
#
# Seeds come from the repository: sample_models/specs, the documents of tests/spec/spec_cases.json,
# tests/fuzz/seeds/ (small .pt/.pt2 archives included) and the JSON records of the small sample
# .pt2 files in sample_models/out when they exist. What the fuzzers add is kept in
# build-fuzz/corpus/ across runs.
#
# Needs clang and its compiler-rt (libFuzzer, sanitizers): installed here when missing (Debian's
# `clang` and the matching `libclang-rt-<major>-dev`: 14 on Debian 12, 19 on Debian 13), unless
# APC_FUZZ_NO_INSTALL=1, in which case a missing clang exits 77 (ctest's SKIP_RETURN_CODE).
# --smoke: 8 s per target (about a minute in all), for the fuzz_smoke ctest test.
# --replay: runs every input of build-fuzz/corpus/<target> and the seeds once (no fuzzing): the
# corpora under ASan and UBSan.
# APC_FUZZ_TARGETS="t1 t2" runs only those targets. A second argument RUNS stops each target after
# that many executions (when before SECONDS):
# scripts/fuzz.sh 1200 1000000 runs every target to a million executions or 20 minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=300
RUNS=${2:--1}
if [ "${1:-}" = "--smoke" ]; then
  SECS=8
elif [ "${1:-}" = "--replay" ]; then
  # Every input of the corpora and seeds once, no mutation (libFuzzer's -runs=0).
  SECS=0
  RUNS=0
elif [ -n "${1:-}" ]; then
  SECS=$1
fi
BUILD=${APC_FUZZ_BUILD_DIR:-build-fuzz}
JOBS=${APC_JOBS:-$(nproc)}
TARGETS=(fuzz_spec fuzz_shardings fuzz_plan fuzz_plan_edit fuzz_artifact fuzz_inputs)
TORCH=${APC_FUZZ_TORCH:-}
if [ -z "$TORCH" ]; then
  TORCH=0
  [ -x .venv/bin/python3 ] && .venv/bin/python3 -c 'import torch' >/dev/null 2>&1 && TORCH=1
fi
[ "$TORCH" = 1 ] && TARGETS+=(fuzz_pt2 fuzz_pt)
# APC_FUZZ_TARGETS="fuzz_pt2 fuzz_pt": only these (e.g. one at a time for long runs).
[ -n "${APC_FUZZ_TARGETS:-}" ] && read -r -a TARGETS <<<"$APC_FUZZ_TARGETS"

# --- clang with libFuzzer ------------------------------------------------------------------------
have_fuzzer() {
  command -v clang++ >/dev/null 2>&1 || return 1
  echo 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }' |
    clang++ -x c++ -fsanitize=fuzzer,address,undefined -o /dev/null - >/dev/null 2>&1
}
if ! have_fuzzer; then
  if [ "${APC_FUZZ_NO_INSTALL:-0}" = 1 ]; then
    echo "fuzz: clang with libFuzzer is not installed; skipping"
    exit 77
  fi
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  if ! command -v clang++ >/dev/null 2>&1; then
    echo "fuzz: installing clang"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends clang >/dev/null
  fi
  major=$(clang++ -dumpversion | cut -d. -f1)
  echo "fuzz: installing libclang-rt-${major}-dev"
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
    "libclang-rt-${major}-dev" >/dev/null
  have_fuzzer || { echo "fuzz: clang++ cannot link a libFuzzer target"; exit 1; }
fi

# --- build ---------------------------------------------------------------------------------------
WITH_TORCH=$([ "$TORCH" = 1 ] && echo ON || echo OFF)
# (Re)configure when there is no build yet or it was configured with the other torch setting.
if [ ! -f "$BUILD/build.ninja" ] ||
  ! grep -q "^APC_WITH_TORCH:BOOL=$WITH_TORCH\$" "$BUILD/CMakeCache.txt"; then
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER=clang++ \
    -DAPC_WITH_TORCH="$WITH_TORCH" -DAPC_BUILD_TESTS=OFF -DAPC_SANITIZE=ON -DAPC_FUZZ=ON >/dev/null
fi
cmake --build "$BUILD" -j "$JOBS" --target "${TARGETS[@]}"

# --- seed corpora --------------------------------------------------------------------------------
SEEDS="$BUILD/seeds"
rm -rf "$SEEDS"
for t in fuzz_spec fuzz_shardings fuzz_plan fuzz_plan_edit fuzz_artifact fuzz_inputs fuzz_pt2 fuzz_pt; do
  mkdir -p "$SEEDS/$t" "$BUILD/corpus/$t" "$BUILD/crashes/$t"
done
cp sample_models/specs/*.json "$SEEDS/fuzz_spec/"
/usr/bin/python3 - "$SEEDS" <<'EOF'
import json, sys
seeds = sys.argv[1]
cases = json.load(open("tests/spec/spec_cases.json"))
for i, c in enumerate(cases["spec"]):
    open(f"{seeds}/fuzz_spec/case_{i}.json", "w").write(json.dumps(c["doc"]))
for i, c in enumerate(cases["out_shardings"]):
    ndim = c.get("mesh_ndim", 2)
    # The first byte picks the mesh's number of dims: 1 + byte % 4.
    open(f"{seeds}/fuzz_shardings/case_{i}.json", "wb").write(
        bytes([ndim - 1]) + json.dumps(c["doc"]).encode())
open(f"{seeds}/fuzz_shardings/in_list.json", "wb").write(b'\x01[["S(0)", "R"], null]')
open(f"{seeds}/fuzz_shardings/in_object.json", "wb").write(b'\x01{"x": ["S(0)", "S(1)"]}')
for i, text in enumerate(["tokens:i64[8,128]", "x:f32[B=8,16,128]", "f32[8,16]", "y:bf16[]",
                          "Mul(Integer(2), Symbol('s0', integer=True, positive=True))",
                          "Add(Symbol('s0'), Integer(-1))",
                          "FloorDiv(Mul(Symbol('s0'), Symbol('s1')), Integer(4))"]):
    open(f"{seeds}/fuzz_inputs/seed_{i}.txt", "w").write(text)
# Model loaders: the first byte picks the mode (odd: a whole archive; even: its JSON records).
import glob, os, zipfile
def record(z, suffix):
    names = [n for n in z.namelist() if n.endswith(suffix)]
    return z.read(names[0]) if names else None
small = [f"sample_models/out/{m}.pt2" for m in ("toy_block", "mlp_stack", "cnn_small")]
for f in sorted(glob.glob("tests/fuzz/seeds/pt2/*.pt2")) + [f for f in small if os.path.exists(f)]:
    name = os.path.basename(f)
    if f.startswith("tests/"):
        open(f"{seeds}/fuzz_pt2/raw_{name}", "wb").write(b"\x01" + open(f, "rb").read())
    z = zipfile.ZipFile(f)
    parts = [record(z, "models/model.json"), record(z, "data/weights/model_weights_config.json"),
             record(z, "data/constants/model_constants_config.json")]
    doc = b"\x00" + b"\n----\n".join(p for p in parts if p is not None)
    if len(doc) <= 65536:
        open(f"{seeds}/fuzz_pt2/json_{name}", "wb").write(doc)
for f in sorted(glob.glob("tests/fuzz/seeds/pt/*.pt")):
    name = os.path.basename(f)
    open(f"{seeds}/fuzz_pt/raw_{name}", "wb").write(b"\x01" + open(f, "rb").read())
    inputs = record(zipfile.ZipFile(f), "extra/apc_inputs.json")
    if inputs is not None:
        open(f"{seeds}/fuzz_pt/inputs_{name}", "wb").write(b"\x00" + inputs)
        open(f"{seeds}/fuzz_inputs/apc_inputs_{name}.json", "wb").write(inputs)
# Reproducers of past findings, as the text of the even mode.
for f in sorted(glob.glob("tests/fuzz/seeds/pt_inputs/*")):
    text = open(f, "rb").read()
    open(f"{seeds}/fuzz_pt/inputs_{os.path.basename(f)}", "wb").write(b"\x00" + text)
    open(f"{seeds}/fuzz_inputs/apc_inputs_{os.path.basename(f)}", "wb").write(text)
# fuzz_plan_edit: lists of 4-byte edits [what, node, b, c] of toy_block_2x2_graph.json (none; an
# output placement; another strategy; an input placement; a parameter's placement; a mesh dim).
for i, edits in enumerate([[], [(1, 3, 0, 0)], [(0, 3, 5, 0)], [(2, 4, 1, 0x11)], [(7, 0, 0, 0)],
                           [(8, 0, 1, 4), (0, 5, 2, 0)]]):
    open(f"{seeds}/fuzz_plan_edit/edits_{i}", "wb").write(bytes(b for e in edits for b in e))
for f in sorted(glob.glob("tests/fuzz/seeds/pt2_json/*")):
    text = open(f, "rb").read()
    open(f"{seeds}/fuzz_pt2/json_{os.path.basename(f)}", "wb").write(b"\x00" + text)
EOF
cp tests/fuzz/seeds/plan/* "$SEEDS/fuzz_plan/"
cp tests/fuzz/seeds/artifact/* "$SEEDS/fuzz_artifact/"

# --- run -----------------------------------------------------------------------------------------
# fuzz_artifact writes its files here: memory-backed where /dev/shm exists.
APC_FUZZ_TMPDIR=$(mktemp -d "$([ -d /dev/shm ] && echo /dev/shm || echo "${TMPDIR:-/tmp}")/apc_fuzz.XXXXXX")
export APC_FUZZ_TMPDIR
trap 'rm -rf "$APC_FUZZ_TMPDIR"' EXIT
status=0
summary=""
for t in "${TARGETS[@]}"; do
  log="$BUILD/$t.log"
  echo "fuzz: $t for ${SECS} s"
  set +e
  limits=(-timeout=10 -rss_limit_mb=2048)
  # fuzz_pt: LibTorch's unpickler (inside torch::jit::load) allocates and zero-fills whatever a
  # damaged length field says, up to 4 GiB, before it fails (about 40 s under ASan): LibTorch's
  # code, not ours; such inputs end in a one-line error, slowly (docs/BUILD.md).
  [ "$t" = fuzz_pt ] && limits=(-timeout=120 -rss_limit_mb=8192)
  # lsan.supp: leaks inside LibTorch's own code (each with its reason); ours are all reported.
  ASAN_OPTIONS=detect_leaks=1 LSAN_OPTIONS="suppressions=$PWD/tests/fuzz/lsan.supp" \
    "$BUILD/tests/fuzz/$t" "$BUILD/corpus/$t" "$SEEDS/$t" \
    -max_total_time="$SECS" -runs="$RUNS" "${limits[@]}" -max_len=65536 \
    -artifact_prefix="$BUILD/crashes/$t/" -print_final_stats=1 >"$log" 2>&1
  rc=$?
  set -e
  runs=$(grep -a -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo "?")
  if [ $rc -ne 0 ]; then
    status=1
    summary+="$t: FAILED after ${runs} executions (exit $rc); see $log and $BUILD/crashes/$t/"$'\n'
    grep -a -m 3 -E 'ERROR|SUMMARY|runtime error|deadly signal' "$log" || true
  else
    summary+="$t: ${runs} executions, no crash"$'\n'
  fi
done
printf '%s' "$summary"
exit $status
