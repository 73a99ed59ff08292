#!/usr/bin/env bash
# The end-to-end benchmark on a GPU machine (docs/benchmark.md), from the repository root:
#   OUT=/some/dir bash scripts/gpu-bench-e2e.sh [sweep|glm53]   (default: sweep)
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
  *)
    echo "gpu-bench-e2e.sh: unknown mode '$MODE' (known: sweep, glm53)" >&2
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

main() {
  gpu_banner "gpu-bench-e2e $MODE" ", results in $OUT"
  nvidia-smi --query-gpu=name,driver_version,pcie.link.gen.current,pcie.link.width.current,clocks.sm,clocks.mem --format=csv
  echo "cores: $(nproc); memory: $(free -g | awk '/Mem:/ {print $2 " GiB total, " $7 " GiB available"}')"
  gpu_install_sysroot
  gpu_build gpu-bench-e2e "$BUILD" "$TMP/build.log" sparsekv_tool -- \
    -DSPARSEKV_BUILD_TESTS=OFF -DSPARSEKV_BUILD_TOOLS=ON || return 1
  echo "=== built in ${SECONDS}s"
  local tool=$BUILD/tools/sparsekv/sparsekv failed=0
  if [[ $MODE == glm53 ]]; then
    glm53_main "$tool" || failed=1
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
