#!/usr/bin/env bash
# The README's run command: installs dependencies, builds sparsekv (Release; the CUDA backend
# when nvcc is present) into build/, and runs the end-to-end decode benchmark. Without a GPU the
# benchmark runs on the CPU reference backend, scaled down. Extra arguments go to `sparsekv bench`.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/install-deps.sh

mkdir -p build
log=build/demo-build.log
echo "demo: building into build/ (log: $log)"
if ! { cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DSPARSEKV_CUDA=AUTO &&
       cmake --build build -j"$(nproc)" --target sparsekv_tool; } >"$log" 2>&1; then
  tail -n 60 "$log"
  echo "demo: build failed" >&2
  exit 1
fi

echo "demo: build/tools/sparsekv/sparsekv bench${*:+ $*}"
echo
build/tools/sparsekv/sparsekv bench "$@"
