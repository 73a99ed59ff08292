#!/usr/bin/env bash
# Where a decode step's time goes, per kernel, on a GPU machine (docs/benchmark.md):
#   OUT=/some/dir BUILD=build-gpu bash scripts/gpu-profile-step.sh
# Runs `sparsekv bench` (DeepSeek-V3.2 fp8, 32K, 20% misses, no weight proxy) under Nsight Compute
# with one metric, each kernel's duration (clocks left alone), for full-hbm and sparsekv at batch
# 1 and 8, then prints the mean duration of each kernel per layer of a timed step
# (scripts/profile_summary.py). The step's TPOT comes from a plain run of the same command; the
# difference between TPOT and the kernels' sum is what launches and dependencies cost.
set -u -o pipefail
# shellcheck source=scripts/gpu-common.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-common.sh"
gpu_out profile-out
BUILD=${BUILD:-build-gpu}
BATCHES=${PROFILE_BATCHES:-"1 8"}
EXTRA=${PROFILE_ARGS:-}
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
for b in $BATCHES; do
  for v in full-hbm sparsekv; do
    # shellcheck disable=SC2086 # EXTRA is meant to split
    args=(--backend cuda --contexts 32768 --miss-rate 0.2 --variants "$v" --batch "$b" --max-batch "$b"
      --steps 3 --warmup 1 --no-proxy --host-pool-gb 12 $EXTRA)
    "$BUILD/tools/sparsekv/sparsekv" bench "${args[@]}" --json "$OUT/plain-$v-b$b.json" \
      >"$OUT/plain-$v-b$b.txt" 2>&1 || { echo "bench $v b$b failed"; tail -5 "$OUT/plain-$v-b$b.txt"; }
    timeout 240 "$NCU" --clock-control none --metrics gpu__time_duration.sum --csv \
      --print-kernel-base function --graph-profiling node \
      "$BUILD/tools/sparsekv/sparsekv" bench "${args[@]}" >"$OUT/ncu-$v-b$b.csv" 2>"$OUT/ncu-$v-b$b.err"
    echo "ncu $v b$b rc=$?"
  done
done
python3 scripts/profile_summary.py "$OUT" | tee "$OUT/profile.txt"
