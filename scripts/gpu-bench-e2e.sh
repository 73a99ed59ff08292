#!/usr/bin/env bash
# The end-to-end benchmark on a GPU machine (docs/benchmark.md), from the repository root:
#   OUT=/some/dir bash scripts/gpu-bench-e2e.sh [sweep|glm53|v4pro]   (default: sweep)
# v4pro: after the build, DeepSeek-V4-Pro (30 CSA layers offloaded, 31 HCA resident, 1
# window-only, a raw window of 128 in each; fp8 entries of 584 B, top-k 1024 entries, a hot cache
# of 2048) in its standard scenario (108.1 GB of weights per GPU streamed by the proxy, 24.9 GB of
# HBM for KV) at 256K, 512K and 1M with the calibrated workload: full-hbm (batches from the HBM:
# 17, 8, 4) and sparsekv (from the host pool: 80 GB gives 69, 34, 17), every batch swept, and
# sparsekv also at full-hbm's largest. Writes e2e.txt, e2e-v4pro.json, e2e.csv and summary.json
# with e2e_throughput_ratio_vs_full_hbm_v4pro_{256k,512k,1m}, e2e_ideal_ratio_vs_full_hbm_v4pro_*
# (the same sparsekv point's ideal) and e2e_min_ratio_vs_full_hbm_v4pro. Time, estimated: the
# build ~200 s; pinning 80 GB ~20 s (~4 GB/s); filling both variants ~15 s per context (sparsekv's
# 17-69 requests write ~78 GB of prompt entries to the pool over PCIe at ~20 GB/s, full-hbm's
# stay in HBM); 45 points (15 per context) of E2E_V4_STEPS [32] steps at <= 40 ms (the proxy's
# 108 GB at ~4 TB/s is ~27 ms) plus their captures and attention/proxy graphs, <= 2 s each:
# ~90 s. About 6 minutes in all; E2E_DEADLINE [570] keeps it under 10 (--time-limit skips the
# points that would not fit, and the JSON's notes count them). Knobs: E2E_HOST_POOL_GB,
# E2E_V4_STEPS with E2E_V4_WARMUP [16], E2E_EXTRA. Not yet run: the V4 variants are compiled, not
# run on a GPU (docs/benchmark.md, "DeepSeek-V4").
# glm53: after the build, GLM-5.3 (its index groups {0}, {1}, {2-5}, ..., {74-77}) beside
# DeepSeek-V3.2, each in its standard scenario (the preset's weights per GPU and the HBM they
# leave), at 32K with the calibrated workload: full-hbm and sparsekv with --hybrid, every batch
# swept. Writes e2e.txt, e2e-glm53-deepseek-v3.2.json, e2e-glm53-glm-5.3.json and summary.json
# with e2e_throughput_ratio_vs_full_hbm_32k_calibrated and
# e2e_throughput_ratio_vs_full_hbm_glm53_32k_calibrated. Knobs: E2E_DEADLINE [540],
# E2E_HOST_POOL_GB, E2E_CALIBRATED_STEPS [64] with E2E_CALIBRATED_WARMUP [48] (the calibrated
# miss rate settles by step ~50, docs/residency.md), E2E_EXTRA.
# sweep: builds the tool (Release, sm_90, no tests), runs `sparsekv bench --sweep` (contexts 32K, 16K,
# 64K, 128K; misses 20, 5, 40 %; full-hbm, sparsekv, no-cache, page-offload) for DeepSeek-V3.2, then
# the same sweep for GLM-5 in the time left, and writes at most 8 files to $OUT:
#   e2e.txt                  everything printed here (build log tail, progress, tables)
#   e2e-deepseek-v3.2.json   every point, ceilings, checks, summary (docs/benchmark.md)
#   e2e-glm-5.json           the same for GLM-5 (if run)
#   e2e.csv                  one line per point, both presets
#   summary.json             the flat summary keys (DeepSeek-V3.2), for scripts/merge_summary.py
#   tpot_vs_batch.png, peak_throughput.png, hbm_per_request.png
# The tables are printed last. Environment knobs (defaults in brackets):
#   E2E_HOST_POOL_GB [80]   pinned host pool budget (the machine has 128 GB; pinning ~4 GB/s)
#   E2E_DEADLINE [450]      seconds for the whole script; the runs get what the build leaves
#                           (about 45% of it for GLM-5); --time-limit skips the points that
#                           would not fit, and each JSON's notes count them
#   E2E_STEPS [8] E2E_WARMUP [2]    decode steps per point, the first E2E_WARMUP untimed
#   E2E_OFFLOAD_MAX_BATCH [8]       cap on page-offload's batch: its whole-page copies run at the
#                           PCIe limit from batch ~8 on (tokens/s flat, each step ~25-60 ms longer
#                           per request on DeepSeek-V3.2), so larger batches only cost time
#   E2E_EXTRA                extra flags for both runs (e.g. "--max-batch 64")
set -u -o pipefail

# shellcheck source=scripts/gpu-common.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-common.sh"
gpu_out gpu-bench-e2e-out
BUILD=build-e2e
DEADLINE=${E2E_DEADLINE:-450}
POOL=${E2E_HOST_POOL_GB:-80}
STEPS=${E2E_STEPS:-8}
WARMUP=${E2E_WARMUP:-2}
OFFLOAD_MAX=${E2E_OFFLOAD_MAX_BATCH:-8}
CAL_STEPS=${E2E_CALIBRATED_STEPS:-64}
CAL_WARMUP=${E2E_CALIBRATED_WARMUP:-48}
MODE=${1:-sweep}
case $MODE in
  sweep) ;;
  glm53) DEADLINE=${E2E_DEADLINE:-540} ;;
  v4pro) DEADLINE=${E2E_DEADLINE:-570} ;;
  *)
    echo "gpu-bench-e2e.sh: unknown mode '$MODE' (known: sweep, glm53, v4pro)" >&2
    exit 2
    ;;
esac
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

# glm53_main TOOL: GLM-5.3 and DeepSeek-V3.2 at 32K, calibrated, hybrid, against full-hbm; the
# time after the build split evenly (GLM-5.3's 78 layers run ~1.3x longer steps, DeepSeek-V3.2's
# larger batches as long), each run stopping its points 30 s before its share ends.
glm53_main() {
  local tool=$1 failed=0 preset
  local variants=full-hbm,sparsekv
  local common=(bench --backend cuda --host-pool-gb "$POOL" --page-tokens 1024
    --variants "$variants" --hybrid --locality calibrated --contexts 32768
    --steps "$CAL_STEPS" --warmup "$CAL_WARMUP")
  # shellcheck disable=SC2206 # the extra flags are meant to split
  common+=(${E2E_EXTRA:-})
  local runs=(deepseek-v3.2 glm-5.3) jsons=()
  for i in "${!runs[@]}"; do
    preset=${runs[$i]}
    local left=$((DEADLINE - SECONDS - 20))
    local share=$((left / (${#runs[@]} - i)))
    if ((share < 90)); then
      echo "=== $preset: skipped (${left}s left)"
      failed=1
      continue
    fi
    echo "=== $preset, 32K calibrated, hybrid (limit ${share}s)"
    "$tool" "${common[@]}" --preset "$preset" --time-limit $((share - 30)) \
      --json "$OUT/e2e-glm53-$preset.json" --csv "$TMP/$preset.csv" >"$TMP/$preset.txt" ||
      failed=1
    [[ -f $OUT/e2e-glm53-$preset.json ]] && jsons+=("$OUT/e2e-glm53-$preset.json")
  done
  cat "$TMP/deepseek-v3.2.csv" >"$OUT/e2e.csv" 2>/dev/null
  [[ -f $TMP/glm-5.3.csv ]] && tail -n +2 "$TMP/glm-5.3.csv" >>"$OUT/e2e.csv"
  if ((${#jsons[@]})); then
    echo "=== summary keys"
    python3 "$ROOT/scripts/merge_summary.py" --keys 'e2e_throughput_ratio_vs_full_hbm_*k_calibrated' \
      "$OUT/summary.json" "${jsons[@]}" || failed=1
  fi
  echo
  for preset in "${runs[@]}"; do [[ -f $TMP/$preset.txt ]] && cat "$TMP/$preset.txt"; done
  echo "=== total ${SECONDS}s"
  return "$failed"
}

# v4pro_main TOOL: DeepSeek-V4-Pro at 256K, 512K and 1M, calibrated, full-hbm against sparsekv,
# in one run that stops starting points 30 s before the deadline.
v4pro_main() {
  local tool=$1 failed=0
  local left=$((DEADLINE - SECONDS - 20))
  if ((left < 120)); then
    echo "=== deepseek-v4-pro: skipped (${left}s left)"
    return 1
  fi
  local variants=full-hbm,sparsekv contexts=262144,524288,1048576
  local args=(bench --backend cuda --preset deepseek-v4-pro --precision fp8
    --host-pool-gb "$POOL" --page-tokens 1024 --top-k 1024 --hot-slots 2048 --heads 128
    --variants "$variants" --locality calibrated --contexts "$contexts"
    --steps "${E2E_V4_STEPS:-32}" --warmup "${E2E_V4_WARMUP:-16}" --time-limit $((left - 30)))
  # shellcheck disable=SC2206 # the extra flags are meant to split
  args+=(${E2E_EXTRA:-})
  echo "=== deepseek-v4-pro, 256K / 512K / 1M calibrated (limit ${left}s)"
  "$tool" "${args[@]}" --json "$OUT/e2e-v4pro.json" --csv "$OUT/e2e.csv" >"$TMP/v4pro.txt" ||
    failed=1
  if [[ -f $OUT/e2e-v4pro.json ]]; then
    echo "=== summary keys"
    python3 "$ROOT/scripts/merge_summary.py" --keys v4pro "$OUT/summary.json" "$OUT/e2e-v4pro.json" ||
      failed=1
  fi
  echo
  [[ -f $TMP/v4pro.txt ]] && cat "$TMP/v4pro.txt"
  echo "=== total ${SECONDS}s"
  return "$failed"
}

main() {
  gpu_banner "gpu-bench-e2e $MODE" ", results in $OUT"
  nvidia-smi --query-gpu=name,driver_version,pcie.link.gen.current,pcie.link.width.current,clocks.sm,clocks.mem --format=csv
  echo "cores: $(nproc); memory: $(free -g | awk '/Mem:/ {print $2 " GiB total, " $7 " GiB available"}')"
  gpu_install_sysroot
  gpu_build gpu-bench-e2e "$BUILD" "$TMP/build.log" sparsekv_tool -- \
    -DSPARSEKV_BUILD_TESTS=OFF -DSPARSEKV_BUILD_TOOLS=ON || return 1
  echo "=== built in ${SECONDS}s"
  local tool=$BUILD/tools/sparsekv/sparsekv failed=0
  if [[ $MODE == glm53 || $MODE == v4pro ]]; then
    "${MODE}_main" "$tool" || failed=1
    if ((failed)); then echo "gpu-bench-e2e: FAILED"; else echo "gpu-bench-e2e: ok"; fi
    return "$failed"
  fi
  local common=(bench --backend cuda --host-pool-gb "$POOL" --page-tokens 1024
    --steps "$STEPS" --warmup "$WARMUP" --offload-max-batch "$OFFLOAD_MAX" --sweep)
  # shellcheck disable=SC2206 # the extra flags are meant to split
  common+=(${E2E_EXTRA:-})

  # The standard sweep for both presets. DeepSeek-V3.2 (the summary keys) first; GLM-5 (78 layers:
  # its steps are ~1.3x longer) gets what is left, at least 45% of the time after the build. Each
  # run stops starting points 30 s before its share ends (pinning the pool counts in it).
  local left=$((DEADLINE - SECONDS - 20))
  local glm_share=$((left * 45 / 100))
  echo "=== deepseek-v3.2 sweep (limit $((left - glm_share))s)"
  "$tool" "${common[@]}" --preset deepseek-v3.2 --time-limit $((left - glm_share - 30)) \
    --json "$OUT/e2e-deepseek-v3.2.json" --csv "$TMP/deepseek.csv" >"$TMP/deepseek.txt" || failed=1
  left=$((DEADLINE - SECONDS - 20))
  if ((left > 60)); then
    echo "=== glm-5 sweep (limit ${left}s)"
    "$tool" "${common[@]}" --preset glm-5 --time-limit $((left - 30)) \
      --json "$OUT/e2e-glm-5.json" --csv "$TMP/glm.csv" >"$TMP/glm.txt" || failed=1
  else
    echo "=== glm-5: skipped (${left}s left)"
  fi

  cat "$TMP/deepseek.csv" >"$OUT/e2e.csv" 2>/dev/null
  [[ -f $TMP/glm.csv ]] && tail -n +2 "$TMP/glm.csv" >>"$OUT/e2e.csv"
  if [[ -f $OUT/e2e-deepseek-v3.2.json ]]; then
    echo "=== summary keys"
    python3 "$ROOT/scripts/merge_summary.py" "$OUT/summary.json" "$OUT/e2e-deepseek-v3.2.json" ||
      failed=1
    local jsons=("$OUT/e2e-deepseek-v3.2.json")
    [[ -f $OUT/e2e-glm-5.json ]] && jsons+=("$OUT/e2e-glm-5.json")
    python3 "$ROOT/scripts/plot_bench.py" --out "$OUT" "${jsons[@]}" || echo "!!! plots failed"
  fi
  echo
  for t in "$TMP/deepseek.txt" "$TMP/glm.txt"; do [[ -f $t ]] && cat "$t"; done
  echo "=== total ${SECONDS}s"
  if ((failed)); then echo "gpu-bench-e2e: FAILED"; else echo "gpu-bench-e2e: ok"; fi
  return "$failed"
}

gpu_main "$OUT/e2e.txt"
