#!/usr/bin/env bash
# setup.sh: installs what apc's build, tests and sample generation need, then writes the sample
# models. Idempotent and quiet when everything is present. Run as root on Debian 12 or 13.
#
# 1. Debian packages: the toolchain, CBC, CLI11, nlohmann_json, protobuf, GoogleTest, and the Gloo
#    headers that c10d/ProcessGroupGloo.hpp includes (the torch wheel links Gloo but ships no
#    headers of it).
#    clang with its compiler-rt (libFuzzer, sanitizers) for the fuzz targets of tests/fuzz, which
#    the fuzz_smoke test builds into build-fuzz/: Debian's `clang` and the matching
#    `libclang-rt-<major>-dev` (14 on Debian 12, 19 on Debian 13).
# 2. The project venv (.venv, git-ignored) with torch 2.13.0 (its LibTorch is what CMake builds
#    against: torch.utils.cmake_prefix_path) and sample_models/requirements.txt. APC_PYTHON picks
#    the interpreter that makes the venv (default: python3.11 when there is one, else python3);
#    APC_TORCH_SPEC the torch requirement (default torch==2.13.0, the CPU wheel on our machines).
# 3. The sample models (sample_models/out/), written by the venv's torch.
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(
  build-essential cmake ninja-build pkg-config git
  coinor-libcbc-dev
  libcli11-dev nlohmann-json3-dev
  libprotobuf-dev protobuf-compiler
  libgtest-dev libssl-dev
  libgloo-dev
  python3-jsonschema  # the schema tests validate JSON with Debian's python
  clang               # fuzz targets (tests/fuzz); its libclang-rt-<major>-dev follows below
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
clang_rt="libclang-rt-$(clang -dumpversion | cut -d. -f1)-dev"
if ! dpkg-query -W -f='${Status}' "$clang_rt" 2>/dev/null | grep -q "install ok installed"; then
  echo "setup: installing $clang_rt"
  [ ${#missing[@]} -gt 0 ] || $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "$clang_rt" >/dev/null
fi

VENV=.venv
TORCH_SPEC=${APC_TORCH_SPEC:-torch==2.13.0}
if [ -z "${APC_PYTHON:-}" ]; then
  APC_PYTHON=$(command -v python3.11 || command -v python3)
fi
stamp="$VENV/.apc-setup"
want="$TORCH_SPEC $(sha256sum sample_models/requirements.txt | cut -c1-16)"
if [ ! -x "$VENV/bin/python3" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  if [ ! -x "$VENV/bin/python3" ]; then
    echo "setup: creating $VENV with $APC_PYTHON"
    if ! "$APC_PYTHON" -m venv "$VENV" 2>/dev/null; then
      DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends python3-venv >/dev/null
      rm -rf "$VENV"
      "$APC_PYTHON" -m venv "$VENV"
    fi
  fi
  echo "setup: installing $TORCH_SPEC and sample_models/requirements.txt into $VENV"
  # pip warns once per package about local index folders it skips (a mirror set-up of some
  # machines, not an error): keep its other messages.
  pip_quiet() { "$VENV/bin/pip" "$@" 2> >(grep -v "^WARNING: Location 'file://" >&2); }
  pip_quiet install -q --disable-pip-version-check "$TORCH_SPEC"
  # The constraint keeps requirements from replacing the torch just installed.
  "$VENV/bin/python3" -c 'import torch; print("torch==" + torch.__version__)' > "$VENV/torch-pin.txt"
  pip_quiet install -q --disable-pip-version-check -r sample_models/requirements.txt \
    -c "$VENV/torch-pin.txt"
  echo "$want" > "$stamp"
fi

# Sample models (sample_models/out/*.pt, *.pt2), written with the venv's torch.
"$VENV/bin/python3" sample_models/generate.py --out sample_models/out --quiet
