#!/usr/bin/env bash
# Installs the Debian packages sparsekv needs to build and test. Idempotent and quiet: does
# nothing when every package is already installed; otherwise one apt-get update and one install.
# Runs as root, or through sudo when available.
set -euo pipefail

# libucx-dev and libhiredis-dev are optional to the library (docs/install.md); the tests use them.
# python3-matplotlib: the plot scripts (scripts/plot_*.py) and their test.
# clang-format: scripts/check-format.sh, which CI runs first.
# clang: the fuzz build (libFuzzer; its FuzzedDataProvider.h is also used by the g++ builds).
# prometheus-cpp-dev: the metrics component and `sparsekv pool --metrics-port` (optional).
packages=(cmake ninja-build g++ clang clang-format pkg-config libgtest-dev libgmock-dev libbenchmark-dev libcli11-dev
          nlohmann-json3-dev python3 python3-venv python3-pip python3-matplotlib
          libucx-dev ucx-utils redis-server libhiredis-dev prometheus-cpp-dev)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if [[ ${#missing[@]} -eq 0 ]]; then
  exit 0
fi

sudo=()
if [[ $(id -u) -ne 0 ]]; then
  if command -v sudo >/dev/null; then
    sudo=(sudo)
  else
    echo "install-deps: missing ${missing[*]}; run as root or install sudo" >&2
    exit 1
  fi
fi

echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -qq
"${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
