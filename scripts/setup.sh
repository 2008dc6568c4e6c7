#!/usr/bin/env bash
# setup.sh: installs the Debian packages that apc's build, tests and sample generation need, then
# writes the sample models. Idempotent and quiet when everything is present. Run as root on Debian 12.
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(
  build-essential cmake ninja-build pkg-config git
  libtorch-dev python3-torch
  coinor-libcbc-dev
  libcli11-dev nlohmann-json3-dev
  libprotobuf-dev protobuf-compiler
  libgtest-dev libssl-dev
  libgloo-dev  # headers of the Gloo that Debian's libtorch links (c10d/ProcessGroupGloo.hpp needs them)
  python3-jsonschema
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# Sample models (sample_models/out/*.pt), written with the system python's torch 1.13.
/usr/bin/python3 sample_models/generate.py --out sample_models/out --quiet
