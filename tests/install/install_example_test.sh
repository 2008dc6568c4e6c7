#!/bin/sh
# The installed package works for a C++ trainer out of tree (issue 14, item 6):
#   1. `cmake --install` the build into a fresh prefix;
#   2. configure and build examples/trainer against that prefix alone (find_package(apc));
#   3. check that the trainer links no planner library and no COIN-OR code, and build and run the
#      README's API example as C++17 against apc::api;
#   4. plan a sample for 2 ranks, train the artifact 3 steps with the example on 2 Gloo ranks
#      (`apc run`), and check that every step printed a finite loss and that SGD lowered it;
#   5. checkpoints through the package: 2 steps saving, then a resume to 3 steps prints step 2
#      exactly as the straight run did; and data: a .safetensors file of inputs and labels (written
#      with perl) trains 3 steps with finite losses.
# Usage: install_example_test.sh BUILD_DIR SOURCE_DIR GENERATOR
set -eu
build=$(cd "$1" && pwd) src=$(cd "$2" && pwd) generator=$3
work=$(mktemp -d "${TMPDIR:-/tmp}/apc-install-test.XXXXXX")
trap 'rm -rf "$work"' EXIT
fail() { echo "install_example_test: $*" >&2; exit 1; }

cmake --install "$build" --prefix "$work/prefix" >"$work/install.log" || fail "cmake --install failed"
test -f "$work/prefix/lib/cmake/apc/apcConfig.cmake" || fail "no apcConfig.cmake installed"
# The tools are installed and run from the prefix (issue 35).
for tool in apc apc-train; do
  "$work/prefix/bin/$tool" --help >/dev/null 2>&1 || fail "no working $tool installed in bin/"
done
# No generated header is needed by the runtime's or the API's public headers.
! grep -lE '#include.*pb\.h' "$work/prefix/include/apc/runtime/"*.h "$work/prefix/include/apc/api/"*.h ||
  fail "a public runtime/API header includes generated protobuf code"

# The package records no path of this build (issue 35): without LibTorch's location it says what
# it needs; with the LibTorch apc was built against (Torch_DIR from the build) it configures.
torch_dir=$(sed -n 's/^Torch_DIR:[A-Z]*=//p' "$build/CMakeCache.txt")
test -n "$torch_dir" || fail "no Torch_DIR in the build's CMakeCache.txt"
! grep -rqF "$build" "$work/prefix/lib/cmake/apc" || fail "the installed package config names the build tree"
! grep -rqF "$torch_dir" "$work/prefix/lib/cmake/apc" || fail "the installed package config names LibTorch's path"
if cmake -S "$src/examples/trainer" -B "$work/trainer-no-torch" -G "$generator" \
  -DCMAKE_PREFIX_PATH="$work/prefix" >"$work/configure-no-torch.log" 2>&1; then
  fail "configuring without LibTorch's location succeeded"
fi
grep -q "set Torch_DIR" "$work/configure-no-torch.log" ||
  { tail -20 "$work/configure-no-torch.log"; fail "no message saying how to find LibTorch"; }
cmake -S "$src/examples/trainer" -B "$work/trainer" -G "$generator" \
  -DCMAKE_PREFIX_PATH="$work/prefix" -DTorch_DIR="$torch_dir" >"$work/configure.log" 2>&1 ||
  { tail -20 "$work/configure.log"; fail "configuring examples/trainer against the package failed"; }
cmake --build "$work/trainer" >"$work/build.log" 2>&1 ||
  { tail -30 "$work/build.log"; fail "building examples/trainer failed"; }
trainer="$work/trainer/trainer"
nm -C "$trainer" >"$work/symbols.txt"
! grep -E ' [TtWw] .*(apc::(solver|plan|lower|strategy|cost)::|Cbc|Clp|Osi)' "$work/symbols.txt" ||
  fail "the example trainer contains planner or COIN-OR code"
! readelf -d "$trainer" | grep -E 'NEEDED.*(Cbc|Clp|Osi|Coin)' ||
  fail "the example trainer needs a COIN-OR library"

# apc::api from C++17: the README's API example, built against the package and run.
mkdir -p "$work/api"
cat >"$work/api/CMakeLists.txt" <<CMAKE
cmake_minimum_required(VERSION 3.22)
project(apc_api_example LANGUAGES CXX)
set(CMAKE_CXX_STANDARD 17)
find_package(apc REQUIRED)
add_executable(plan_example "$src/tests/api/readme_example.cpp")
target_link_libraries(plan_example PRIVATE apc::api)
CMAKE
cmake -S "$work/api" -B "$work/api/build" -G "$generator" -DCMAKE_PREFIX_PATH="$work/prefix" \
  -DTorch_DIR="$torch_dir" \
  >"$work/api-configure.log" 2>&1 || { tail -20 "$work/api-configure.log"; fail "configuring the API example failed"; }
cmake --build "$work/api/build" >"$work/api-build.log" 2>&1 ||
  { tail -30 "$work/api-build.log"; fail "building the README's API example as C++17 against apc::api failed"; }
(cd "$src" && "$work/api/build/plan_example") >"$work/api-run.log" 2>&1 ||
  { cat "$work/api-run.log"; fail "the API example failed"; }
grep -q ' rank programs$' "$work/api-run.log" || { cat "$work/api-run.log"; fail "the API example made no programs"; }

"$build/tools/apc" plan "$src/sample_models/out/mlp_stack.pt" --mesh 2 --quiet \
  -o "$work/plan.json" --artifact "$work/art" || fail "apc plan failed"
APC_TIMEOUT_S=120 "$build/tools/apc" run "$work/art" -- "$trainer" '{artifact}' 3 >"$work/run.log" 2>&1 ||
  { cat "$work/run.log"; fail "training with the example trainer failed"; }
cat "$work/run.log"
awk '/^step [0-9]+ loss / { n++; l[n] = $4; if ($4 != $4 + 0 || $4 == "nan" || $4 == "inf") bad = 1 }
     END { exit !(n == 3 && !bad && l[2] < l[1] && l[3] < l[2]) }' "$work/run.log" ||
  fail "expected 3 finite losses, each below the one before (SGD on one batch)"
# 5. Save and resume with the example: the resumed run continues the straight one exactly.
APC_TIMEOUT_S=120 "$build/tools/apc" run "$work/art" -- "$trainer" '{artifact}' 2 - "$work/ckpt" \
  >"$work/run2.log" 2>&1 || { cat "$work/run2.log"; fail "training 2 steps with checkpoints failed"; }
APC_TIMEOUT_S=120 "$build/tools/apc" run "$work/art" -- "$trainer" '{artifact}' 3 - "$work/ckpt" \
  >"$work/run3.log" 2>&1 || { cat "$work/run3.log"; fail "resuming with the example failed"; }
test -f "$work/ckpt/step_00000003/manifest.json" || fail "the example saved no checkpoint of step 3"
[ "$(grep '^step' "$work/run2.log"; grep '^step' "$work/run3.log")" = "$(grep '^step' "$work/run.log")" ] ||
  { cat "$work/run.log" "$work/run2.log" "$work/run3.log"; fail "2 steps + a resumed step differ from 3 straight steps"; }
# Data: 16 rows of x [64, 128] (f32) and labels [64] (i64) for mlp_stack, as safetensors.
perl -e '
  my ($n, $xb, $yb) = (16, 16 * 64 * 128 * 4, 16 * 64 * 8);
  my $h = sprintf("{\"inputs\":{\"dtype\":\"F32\",\"shape\":[%d,64,128],\"data_offsets\":[0,%d]},"
                . "\"labels\":{\"dtype\":\"I64\",\"shape\":[%d,64],\"data_offsets\":[%d,%d]}}",
                  $n, $xb, $n, $xb, $xb + $yb);
  $h .= " " x ((8 - length($h) % 8) % 8);
  binmode STDOUT;
  print pack("Q<", length($h)), $h, pack("f<*", map { sin($_) } 1 .. $n * 64 * 128),
        pack("q<*", map { $_ % 128 } 1 .. $n * 64);' >"$work/train.safetensors"
APC_TIMEOUT_S=120 "$build/tools/apc" run "$work/art" -- "$trainer" '{artifact}' 3 "$work/train.safetensors" \
  >"$work/data.log" 2>&1 || { cat "$work/data.log"; fail "training on a data file with the example failed"; }
cat "$work/data.log"
awk '/^step [0-9]+ loss / { n++; if ($4 != $4 + 0 || $4 == "nan" || $4 == "inf") bad = 1 }
     END { exit !(n == 3 && !bad) }' "$work/data.log" || fail "expected 3 finite losses on the data file"
echo "install_example_test: ok"
