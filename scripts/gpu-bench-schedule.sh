#!/usr/bin/env bash
# The step schedule chosen by the library against every manual schedule, on a GPU machine, from
# the repository root (sparsekv at the host pool's batch, full-hbm at every batch it holds):
#   OUT=/some/dir bash scripts/gpu-bench-schedule.sh [MODE...]   (default: all)
# Builds the tool (Release, sm_90, no tests), then DeepSeek-V3.2 at 32K, the calibrated workload
# with --hybrid at the host pool's batch (SCHEDULE_BATCH [59]), sparsekv only:
#   auto:   --schedule auto;
#   manual: --schedule manual, cross-layer prefetch off/on x chunks none/8/16/32
#           (manual-off, manual-on: only those with the prefetch off, on); with
#           SCHEDULE_LAYERS_PER_INDEX > 1 (a shared indexer), prefetch off/on x planned copy
#           off / on the options' grid / on 16 blocks, without chunks (the bench takes no
#           --copy-chunk-rows with index groups);
# each beside full-hbm's whole sweep (its peak, for the ratio; its attention, for the check).
#   all:    auto and manual. Several modes run one after the other (e.g. `auto manual-off`).
# Every run above first checks attention against full-hbm bit for bit (the bench's check steps).
# The summary keys (scripts/schedule_summary.py, docs/schedule.md "Measuring it"):
#   sweep-calibrated, sweep-m20 (sweep: both): the automatic schedule and the eight manual ones,
#           each over the bench's own batch sweep at 32K (1, 2, 4, 8, 16, 32 and the host pool's
#           59), the calibrated workload or 20% uncorrelated misses; sparsekv only, except the
#           automatic run, which also runs full-hbm for the check. SCHEDULE_SWEEP_PREFETCH
#           [both] = off or on keeps the manual runs with the prefetch off or on (the automatic
#           run is in each), to split one sweep over two calls;
#   python: the package (CUDA, against the machine's torch) and bench/python_decode_bench.py
#           through its StepSchedule, with the bench's attention, proxy and top-k generator, at
#           32K, batch 59, the calibrated workload and 20% misses, each beside the C++ bench's
#           automatic run at the same point;
#   adapter: the same through sparsekv.sglang_adapter.SparseKVCoordinator (20% misses).
# Writes to $OUT: schedule.txt (everything printed), one JSON per run, and, after sweep, python
# or adapter, schedule-summary.json (the keys from every JSON in $OUT) merged into summary.json.
# Environment: SCHEDULE_STEPS [40], SCHEDULE_WARMUP [26] (the auto schedule measures its
# candidates in the warm-up), SCHEDULE_HOST_POOL_GB [80], SCHEDULE_BUILD [build-e2e],
# SCHEDULE_MISS_RATE (set: the miss-rate mode at that rate instead of the calibrated workload,
# for auto and manual), SCHEDULE_PYTHON_SITE [/tmp/sparsekv-python] (where python and adapter
# install the package), SCHEDULE_LAYERS_PER_INDEX [1] (> 1: auto, manual and the sweeps run with
# --layers-per-index N, the planned copy in the manual grid, and SCHEDULE_WARMUP defaults to 80:
# the automatic schedule's 72 calibration steps; keep such runs in an $OUT of their own, since the
# summary keys do not tell index groups apart).
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
LPI=${SCHEDULE_LAYERS_PER_INDEX:-1}
INDEX=()
if ((LPI > 1)); then
  INDEX=(--layers-per-index "$LPI")
  # The automatic schedule measures 36 candidates twice each (the planned copy triples them).
  WARMUP=${SCHEDULE_WARMUP:-80}
fi

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
    --contexts 32768 "${INDEX[@]}")
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
    manual_runs manual "${prefetches[@]}" -- --variants full-hbm,sparsekv --batch "$BATCH"
  fi
  local sweeps=() summarize=0
  wants sweep sweep-calibrated && sweeps+=(calibrated)
  wants sweep sweep-m20 && sweeps+=(m20)
  for sweep in "${sweeps[@]}"; do
    local load=(--locality calibrated)
    [[ $sweep == m20 ]] && load=(--miss-rate 0.2)
    common=(bench --backend cuda --preset deepseek-v3.2 --host-pool-gb "$POOL" --page-tokens 1024
      --hybrid --steps "$STEPS" --warmup "$WARMUP" "${load[@]}" --contexts 32768 "${INDEX[@]}")
    run "sweep-$sweep-auto" --variants full-hbm,sparsekv --schedule auto
    case ${SCHEDULE_SWEEP_PREFETCH:-both} in
      off | on) prefetches=("$SCHEDULE_SWEEP_PREFETCH") ;;
      *) prefetches=(off on) ;;
    esac
    manual_runs "sweep-$sweep-manual" "${prefetches[@]}" -- --variants sparsekv
    summarize=1
  done
  if wants python adapter; then
    python_runs || failed=1
    summarize=1
  fi
  if ((summarize)); then
    python3 "$ROOT/scripts/schedule_summary.py" --out "$OUT/schedule-summary.json" "$OUT"/*.json ||
      failed=1
    python3 "$ROOT/scripts/merge_summary.py" "$OUT/summary.json" "$OUT/schedule-summary.json" \
      >/dev/null || failed=1
  fi
  echo "=== done in ${SECONDS}s (failed=$failed)"
  return "$failed"
}

# manual_runs PREFIX PREFETCH... -- FLAGS...: a manual run per prefetch (off, on) and chunk size
# (none, 8, 16, 32), named PREFIX-prefetch-<off|on>-chunks<N>, each with FLAGS; with index groups
# (LPI > 1), per prefetch and planned copy (off, on the options' grid, on 16 blocks) instead,
# named PREFIX-prefetch-<off|on>[-planned<B>]-chunks0.
manual_runs() {
  local prefix=$1 prefetches=()
  shift
  while (($#)) && [[ $1 != -- ]]; do
    prefetches+=("$1")
    shift
  done
  shift
  local chunks=(0 8 16 32) planned=(-1)
  if ((LPI > 1)); then
    chunks=(0)
    planned=(-1 0 16)
  fi
  for prefetch in "${prefetches[@]}"; do
    for plan in "${planned[@]}"; do
      for chunk in "${chunks[@]}"; do
        local flags=("$@" --schedule manual) name="$prefix-prefetch-$prefetch"
        [[ $prefetch == on ]] && flags+=(--crosslayer-prefetch)
        if ((plan >= 0)); then
          flags+=(--planned-copy "$plan")
          name+="-planned$plan"
        fi
        ((chunk > 0)) && flags+=(--copy-chunk-rows "$chunk")
        run "$name-chunks$chunk" "${flags[@]}"
      done
    done
  done
}

# python_runs: the package built against the machine's torch (no network: no build isolation),
# then per workload (calibrated, 20% misses) the C++ bench's automatic run at 32K, batch 59 (the
# ratio's reference) and the Python benchmark at the same point with the C++ run's hot slots:
# python through the StepSchedule at both workloads, adapter at 20% misses.
python_runs() {
  local site=${SCHEDULE_PYTHON_SITE:-/tmp/sparsekv-python}
  rm -rf "$site"
  echo "=== pip install (CUDA) into $site (log: $OUT/python-build.log)"
  if ! python3 -m pip install --no-build-isolation --no-deps --target "$site" \
    -Ccmake.define.SPARSEKV_CUDA=ON "$ROOT" >"$OUT/python-build.log" 2>&1; then
    tail -n 40 "$OUT/python-build.log"
    return 1
  fi
  local name status=0
  for name in calibrated m20; do
    local cpp_flags=(--miss-rate 0.2) py_flags=(--miss-rate 0.2) paths=(schedule adapter)
    if [[ $name == calibrated ]]; then
      cpp_flags=(--locality calibrated)
      py_flags=(--locality calibrated)
      paths=(schedule)
    fi
    wants python || [[ $name == m20 ]] || continue
    common=(bench --backend cuda --preset deepseek-v3.2 --host-pool-gb "$POOL" --page-tokens 1024
      --hybrid --steps "$STEPS" --warmup "$WARMUP" "${cpp_flags[@]}" --contexts 32768)
    run "cpp-auto-$name-b$BATCH" --variants sparsekv --batch "$BATCH" --schedule auto
    local hot_slots
    hot_slots=$(python3 -c 'import json, sys
print(json.load(open(sys.argv[1]))["points"][0]["hot_slots"])' "$OUT/cpp-auto-$name-b$BATCH.json") ||
      return 1
    local path
    for path in "${paths[@]}"; do
      wants "$([[ $path == schedule ]] && echo python || echo adapter)" || continue
      echo "=== python $path: batch $BATCH, $name, $hot_slots hot slots (the C++ run's)"
      PYTHONPATH="$site" python3 "$ROOT/bench/python_decode_bench.py" --device cuda \
        --path "$path" --context 32768 --batch "$BATCH" "${py_flags[@]}" \
        --hot-slots "$hot_slots" --steps "$STEPS" --warmup "$WARMUP" \
        --json "$OUT/python-$path-$name.json" >"$OUT/python-$path-$name.txt" 2>&1 || status=1
      tail -n 3 "$OUT/python-$path-$name.txt"
    done
  done
  return "$status"
}

gpu_main -a "$OUT/schedule.txt"
