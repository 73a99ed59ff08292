#!/usr/bin/env bash
# Whether the resolve grows with the hot cache, and what the replacement policy costs a decode step,
# on a GPU machine, from the repository root:
#   OUT=/some/dir bash scripts/gpu-bench-resolve-scaling.sh
# Builds resolve_bench and the tool (Release, sm_90), then:
#   1. resolve_bench, hits only and 5% / 20% misses at batch 64, 32K context, 656-B rows, with
#      C = 4096 and 16384 slots, for each eviction policy (clock: the library's default; slru, lru)
#      -> resolve-c<C>-<policy>.json; the summary keys resolve_hits_only_us_b64[_c16384][_<policy>];
#   2. the end-to-end benchmark (DeepSeek-V3.2, --hybrid, the calibrated workload, the library's
#      schedule chosen automatically) at the host pool's batch for 32K (59) and 128K (15), with the
#      library's default eviction and with segmented LRU (the default before the clock; through
#      --config, a file of {"eviction": "segmented_lru"}), each beside
#      full-hbm's whole sweep -> e2e-<context>-<policy>.{json,txt}.
# Everything printed also goes to $OUT/resolve-scaling.txt.
# Environment: SCALING_STEPS [40], SCALING_WARMUP [26], SCALING_HOST_POOL_GB [80],
# SCALING_BUILD [build-scaling], SCALING_SKIP_E2E=1 (resolve_bench only).
set -u -o pipefail

# shellcheck source=scripts/gpu-common.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-common.sh"
gpu_out gpu-bench-resolve-scaling-out
BUILD=${SCALING_BUILD:-build-scaling}
STEPS=${SCALING_STEPS:-40}
WARMUP=${SCALING_WARMUP:-26}
POOL=${SCALING_HOST_POOL_GB:-80}

main() {
  gpu_banner "gpu-bench-resolve-scaling" ", tree $(git rev-parse --short HEAD 2>/dev/null)"
  nvidia-smi --query-gpu=name,driver_version,pcie.link.gen.current,pcie.link.width.current --format=csv
  gpu_install_sysroot
  gpu_build gpu-bench-resolve-scaling "$BUILD" "$OUT/build.log" sparsekv_tool resolve_bench -- \
    -DSPARSEKV_BUILD_TESTS=OFF -DSPARSEKV_BUILD_TOOLS=ON || return 1
  echo "=== built in ${SECONDS}s"
  local failed=0
  for c in 4096 16384; do
    for policy in clock slru lru; do
      echo "=== resolve_bench C=$c $policy"
      "$BUILD/bench/resolve_bench" --contexts 32768 --batches 64 --miss_rates 0,0.05,0.2 \
        --row_bytes 656 --hot_slots "$c" --eviction "$policy" \
        --json "$OUT/resolve-c$c-$policy.json" >"$OUT/resolve-c$c-$policy.txt" 2>&1 || failed=1
      grep -E '^library|WRONG' "$OUT/resolve-c$c-$policy.txt"
    done
  done
  if [[ ${SCALING_SKIP_E2E:-0} != 1 ]]; then
    local tool=$BUILD/tools/sparsekv/sparsekv
    local common=(bench --backend cuda --preset deepseek-v3.2 --host-pool-gb "$POOL"
      --page-tokens 1024 --hybrid --steps "$STEPS" --warmup "$WARMUP" --locality calibrated
      --variants full-hbm,sparsekv --schedule auto)
    echo '{"eviction": "segmented_lru"}' >"$OUT/eviction-slru.json"
    for point in 32768:59 131072:15; do
      local context=${point%%:*} batch=${point##*:}
      for policy in clock slru; do
        local flags=() name="e2e-$((context / 1024))k-$policy"
        [[ $policy == slru ]] && flags=(--config "$OUT/eviction-slru.json")
        echo "=== $name: --contexts $context --batch $batch ${flags[*]}"
        "$tool" "${common[@]}" --contexts "$context" --batch "$batch" "${flags[@]}" \
          --json "$OUT/$name.json" >"$OUT/$name.txt" 2>&1 || failed=1
        grep -E 'sparsekv|full-hbm|check|error|Error' "$OUT/$name.txt" | tail -n 6
      done
    done
  fi
  echo "=== done in ${SECONDS}s (failed=$failed)"
  return "$failed"
}

gpu_main -a "$OUT/resolve-scaling.txt"
