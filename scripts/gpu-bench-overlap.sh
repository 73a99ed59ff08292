#!/usr/bin/env bash
# Transfer hiding on a GPU machine (docs/overlap.md), from the repository root:
#   OUT=/some/dir bash scripts/gpu-bench-overlap.sh
# The standard scenario (DeepSeek-V3.2 fp8, 84 GB proxy, 49 GB KV budget) at 32K context and 20%
# misses, full-hbm and sparsekv at batch 1 .. 64, once per configuration (OVERLAP_RUNS):
#   base        every layer its own top-k, copies on the critical path
#   share4      --layers-per-index 4 (a shared indexer: one top-k per 4 layers)
# and, composed with '-' from these parts (e.g. unsorted-share4, chunk8-cl85):
#   unsorted    --sort-misses false: Resolve never sorts each request's misses by host row
#   sorted      --sort-misses-min-batch 0: Resolve sorts them at every batch (the default sorts
#               from batch 32 on)
#   mtpN        --mtp N: N query tokens per request and step, one resolve of all their top-k
#   locality    no --miss-rate: the generator's locality parameters decide the misses
#   blocksN     --copy-blocks N: the miss and prefetch copies on a grid of at most N blocks
#   xlN         --cross-layer-overlap 0.N: adjacent layers' top-k share that share (0: none)
#   clN         the same and --crosslayer-prefetch: each layer's top-k prefetched into the next
#   smsN        --compute-sms N: sparsekv's attention and proxy GEMMs planned for N SMs
#   fusedN      --fused-copy-min-batch N: steps of N requests or more copy misses in the resolve
#   wide, warp, bulk  --copy-strategy lattice-wide / warp-rows / bulk
#   chunkN      --copy-chunk-rows N: a pipelined layer, chunks of N rows copied and attended in turn
#   pcbN        --prefetch-copy-blocks N: the prefetch copies alone on at most N blocks
# Each run measures its own full-hbm, so every overhead is a ratio within one run. Writes
# overlap-<name>.json and overlap.txt to $OUT; scripts/overlap_summary.py turns the JSONs into the
# table of docs/overlap.md and the summary keys. The bench's --overlap and --prefetch experiments
# (and so the runs gather, merge, share4-copies, share4-gather and prefetchN) were retired on
# 2026-12-04: every sparsekv step runs through the library's StepSchedule, whose choices (the
# pipelined layer, chunkN; the cross-layer prefetch, clN) replace them.
# Knobs: OVERLAP_HOST_POOL_GB [90], OVERLAP_STEPS [8], OVERLAP_WARMUP [2], OVERLAP_RUNS (names),
# OVERLAP_MAX_BATCH [64], OVERLAP_EXTRA (more flags for every run, e.g. "--batch 59"),
# OVERLAP_BUILD [build-e2e] (a build directory with the tool, e.g. gpu-check.sh's build-gpu).
set -u -o pipefail

# shellcheck source=scripts/gpu-common.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-common.sh"
gpu_out gpu-bench-overlap-out
BUILD=${OVERLAP_BUILD:-build-e2e}
POOL=${OVERLAP_HOST_POOL_GB:-90}
STEPS=${OVERLAP_STEPS:-8}
WARMUP=${OVERLAP_WARMUP:-2}
RUNS=${OVERLAP_RUNS:-"base share4 chunk8 cl85 chunk8-cl85"}
MAX_BATCH=${OVERLAP_MAX_BATCH:-64}
EXTRA=${OVERLAP_EXTRA:-}

flags_of() {
  case $1 in
    base) echo "--miss-rate 0.2" ;;
    unsorted) echo "--miss-rate 0.2 --sort-misses false" ;;
    unsorted-*) echo "--sort-misses false $(flags_of "${1#unsorted-}")" ;;
    sorted) echo "--miss-rate 0.2 --sort-misses-min-batch 0" ;;
    sorted-*) echo "--sort-misses-min-batch 0 $(flags_of "${1#sorted-}")" ;;
    locality) echo "" ;;
    locality-*) flags_of "${1#locality-}" | sed 's/--miss-rate 0.2//' ;;
    blocks*-*) local rest=${1#blocks}; echo "--copy-blocks ${rest%%-*} $(flags_of "${rest#*-}")" ;;
    blocks*) echo "--miss-rate 0.2 --copy-blocks ${1#blocks}" ;;
    xl*-*) local rest=${1#xl}; echo "--cross-layer-overlap 0.${rest%%-*} $(flags_of "${rest#*-}")" ;;
    xl*) echo "--miss-rate 0.2 --cross-layer-overlap 0.${1#xl}" ;;
    cl*-*)
      local rest=${1#cl}
      echo "--cross-layer-overlap 0.${rest%%-*} --crosslayer-prefetch $(flags_of "${rest#*-}")"
      ;;
    cl*) echo "--miss-rate 0.2 --cross-layer-overlap 0.${1#cl} --crosslayer-prefetch" ;;
    sms*-*) local rest=${1#sms}; echo "--compute-sms ${rest%%-*} $(flags_of "${rest#*-}")" ;;
    sms*) echo "--miss-rate 0.2 --compute-sms ${1#sms}" ;;
    fused*-*) local rest=${1#fused}; echo "--fused-copy-min-batch ${rest%%-*} $(flags_of "${rest#*-}")" ;;
    fused*) echo "--miss-rate 0.2 --fused-copy-min-batch ${1#fused}" ;;
    chunk*-*) local rest=${1#chunk}; echo "--copy-chunk-rows ${rest%%-*} $(flags_of "${rest#*-}")" ;;
    chunk*) echo "--miss-rate 0.2 --copy-chunk-rows ${1#chunk}" ;;
    pcb*-*) local rest=${1#pcb}; echo "--prefetch-copy-blocks ${rest%%-*} $(flags_of "${rest#*-}")" ;;
    pcb*) echo "--miss-rate 0.2 --prefetch-copy-blocks ${1#pcb}" ;;
    wide-*) echo "--copy-strategy lattice-wide $(flags_of "${1#wide-}")" ;;
    warp-*) echo "--copy-strategy warp-rows $(flags_of "${1#warp-}")" ;;
    bulk-*) echo "--copy-strategy bulk $(flags_of "${1#bulk-}")" ;;
    mtp*) echo "--miss-rate 0.2 --mtp ${1#mtp}" ;;
    share4) echo "--miss-rate 0.2 --layers-per-index 4" ;;
  esac
}

main() {
  gpu_banner gpu-bench-overlap
  gpu_install_sysroot >/dev/null
  gpu_build gpu-bench-overlap "$BUILD" /tmp/overlap-build.log sparsekv_tool -- \
    -DSPARSEKV_BUILD_TESTS=OFF -DSPARSEKV_BUILD_TOOLS=ON || return 1
  echo "=== built in ${SECONDS}s"
  local tool=$BUILD/tools/sparsekv/sparsekv failed=0
  for run in $RUNS; do
    echo "=== $run: $(flags_of "$run")"
    # shellcheck disable=SC2046 # the flags are meant to split
    "$tool" bench --backend cuda --preset deepseek-v3.2 --host-pool-gb "$POOL" --page-tokens 1024 \
      --contexts 32768 --variants full-hbm,sparsekv --max-batch "$MAX_BATCH" \
      --steps "$STEPS" --warmup "$WARMUP" $(flags_of "$run") $EXTRA \
      --json "$OUT/overlap-$run.json" || failed=1
  done
  echo "=== done in ${SECONDS}s"
  return $failed
}

gpu_main "$OUT/overlap.txt"
