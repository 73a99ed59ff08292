#!/usr/bin/env bash
# The step schedule chosen by the library against every manual schedule, on a GPU machine, from
# the repository root (sparsekv at the host pool's batch, full-hbm at every batch it holds):
#   OUT=/some/dir bash scripts/gpu-bench-schedule.sh [MODE...]   (default: all)
# Builds the tool (Release, sm_90, no tests), then DeepSeek-V3.2 at 32K, the calibrated workload
# with --hybrid at the host pool's batch (SCHEDULE_BATCH [59]), sparsekv only:
#   auto:   --schedule auto;
#   manual: --schedule manual, cross-layer prefetch off/on x chunks none/8/16/32
#           (manual-off, manual-on: only those with the prefetch off, on);
# each beside full-hbm's whole sweep (its peak, for the ratio; its attention, for the check).
#   all:    auto and manual. Several modes run one after the other (e.g. `auto manual-off`).
# Every run first checks attention against full-hbm bit for bit (the bench's check steps).
# Writes to $OUT: schedule.txt (everything printed) and one JSON per run.
# Environment: SCHEDULE_STEPS [40], SCHEDULE_WARMUP [26] (the auto schedule measures its
# candidates in the warm-up), SCHEDULE_HOST_POOL_GB [80], SCHEDULE_BUILD [build-e2e],
# SCHEDULE_MISS_RATE (set: the miss-rate mode at that rate instead of the calibrated workload).
set -u -o pipefail

# shellcheck source=scripts/gpu-common.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-common.sh"
MODES=("$@")
((${#MODES[@]})) || MODES=(all)
MODE="${MODES[*]}"
wants() {  # wants NAME...: true if a mode asked for is one of NAME...
  local m n
  for m in "${MODES[@]}"; do for n in "$@"; do [[ $m == "$n" ]] && return 0; done; done
  return 1
}
gpu_out gpu-bench-schedule-out
BUILD=${SCHEDULE_BUILD:-build-e2e}
STEPS=${SCHEDULE_STEPS:-40}
WARMUP=${SCHEDULE_WARMUP:-26}
POOL=${SCHEDULE_HOST_POOL_GB:-80}
BATCH=${SCHEDULE_BATCH:-59}

main() {
  gpu_banner "gpu-bench-schedule $MODE" ", tree $(git rev-parse --short HEAD 2>/dev/null)"
  nvidia-smi --query-gpu=name,driver_version,pcie.link.gen.current,pcie.link.width.current --format=csv
  gpu_install_sysroot
  gpu_build gpu-bench-schedule "$BUILD" "$OUT/build.log" sparsekv_tool -- \
    -DSPARSEKV_BUILD_TESTS=OFF -DSPARSEKV_BUILD_TOOLS=ON || return 1
  echo "=== built in ${SECONDS}s"
  local tool=$BUILD/tools/sparsekv/sparsekv failed=0
  local workload=(--locality calibrated)
  [[ -n ${SCHEDULE_MISS_RATE:-} ]] && workload=(--miss-rate "$SCHEDULE_MISS_RATE")
  local common=(bench --backend cuda --preset deepseek-v3.2 --host-pool-gb "$POOL"
    --page-tokens 1024 --hybrid --steps "$STEPS" --warmup "$WARMUP" "${workload[@]}"
    --contexts 32768)
  run() {
    local name=$1
    shift
    echo "=== $name: $*"
    "$tool" "${common[@]}" "$@" --json "$OUT/$name.json" >"$OUT/$name.txt" 2>&1 || failed=1
    grep -E 'sparsekv|full-hbm|check|error|Error' "$OUT/$name.txt" | tail -n 8
  }
  if wants auto all; then
    run auto --variants full-hbm,sparsekv --batch "$BATCH" --schedule auto
  fi
  local prefetches=()
  wants manual all manual-off && prefetches+=(off)
  wants manual all manual-on && prefetches+=(on)
  if ((${#prefetches[@]})); then
    for prefetch in "${prefetches[@]}"; do
      for chunk in 0 8 16 32; do
        local flags=(--variants full-hbm,sparsekv --batch "$BATCH" --schedule manual)
        [[ $prefetch == on ]] && flags+=(--crosslayer-prefetch)
        ((chunk > 0)) && flags+=(--copy-chunk-rows "$chunk")
        run "manual-prefetch-$prefetch-chunks$chunk" "${flags[@]}"
      done
    done
  fi
  echo "=== done in ${SECONDS}s (failed=$failed)"
  return "$failed"
}

gpu_main -a "$OUT/schedule.txt"
