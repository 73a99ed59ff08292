#!/usr/bin/env bash
# A timeline of one decode step on a GPU machine (docs/benchmark.md, "Profile a step"), from the
# repository root (after scripts/prepare-gpu-deps.sh on the machine that prepares the tree):
#   OUT=/some/dir bash scripts/gpu-trace-step.sh
# Builds the tool and gpu_trace_test (Release, sm_90, CUPTI as the toolkit has it), runs the test
# (the tracer on a two-stream graph), then per run of TRACE_RUNS the same `sparsekv bench` twice,
# with and without --trace-step, so that the TPOTs of the two say what tracing costs the later
# points' timed steps; then scripts/step_profile.py on each trace. Runs:
#   base      DeepSeek-V3.2 fp8, 32K, batch 4, 20% misses, full-hbm and sparsekv (the defaults:
#             miss copies on the main stream; write-back on the manager's side stream)
#   xl85      adjacent layers' top-k share 85% (--cross-layer-overlap 0.85), nothing hidden
#   cl85-pcb16  the same with the cross-layer prefetch, its copies on 16 blocks
#   chunk16-blocks16  a pipelined layer: chunks of 16 rows copied (on 16 blocks) and attended in
#             turn, uncorrelated layers
# Writes to $OUT: build.log, gpu_trace_test.log, trace-<run>.json (the traces), bench-<run>.json
# and plain-<run>.json (the two runs' reports), profile-<run>.txt (step_profile.py), timelines
# under timeline-<run>/ when matplotlib is there, and gpu-trace-step.txt (all that is printed).
# (The run `overlap`, --overlap copies, went with that flag on 2026-12-04: the step schedule's
# pipelined layer, chunk16-blocks16, is its replacement.)
# Knobs: TRACE_BUILD [build-e2e], TRACE_RUNS ["base chunk16-blocks16"], TRACE_ARGS (replaces the common
# flags below), TRACE_EXTRA (added to every run), TRACE_TIMEOUT [300] (seconds per command: a
# CUPTI older than 13.0 Update 1 can deadlock when kernel tracing is disabled, per its notes).
set -u -o pipefail

# shellcheck source=scripts/gpu-common.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-common.sh"
gpu_out gpu-trace-step-out
BUILD=${TRACE_BUILD:-build-e2e}
RUNS=${TRACE_RUNS:-"base chunk16-blocks16"}
ARGS=${TRACE_ARGS:-"--preset deepseek-v3.2 --contexts 32768 --batch 4 --miss-rate 0.2 --steps 4 --warmup 2 --host-pool-gb 8 --variants full-hbm,sparsekv"}
EXTRA=${TRACE_EXTRA:-}
LIMIT=${TRACE_TIMEOUT:-300}

flags_of() {
  case $1 in
    base) echo "" ;;
    xl85) echo "--cross-layer-overlap 0.85" ;;
    cl85-pcb16) echo "--cross-layer-overlap 0.85 --crosslayer-prefetch --prefetch-copy-blocks 16" ;;
    chunk16-blocks16) echo "--cross-layer-overlap 0 --copy-chunk-rows 16 --copy-blocks 16" ;;
    *) echo "unknown run $1" >&2; return 1 ;;
  esac
}

main() {
  gpu_banner gpu-trace-step
  nvidia-smi -L
  gpu_install_sysroot >/dev/null
  local tests=OFF targets=(sparsekv_tool)
  if [[ -f $ROOT/.deps/googletest/CMakeLists.txt ]]; then
    tests=ON
    targets+=(gpu_trace_test)
  fi
  gpu_build gpu-trace-step "$BUILD" "$OUT/build.log" "${targets[@]}" -- \
    -DSPARSEKV_BUILD_TOOLS=ON -DSPARSEKV_BUILD_TESTS="$tests" \
    -DSPARSEKV_GTEST_SOURCE="$ROOT/.deps/googletest" || return 1
  grep "CUPTI step tracing" "$OUT/build.log"
  echo "=== built in ${SECONDS}s"
  local failed=0
  if [[ $tests == ON ]]; then
    timeout "$LIMIT" "$BUILD/tools/sparsekv/gpu_trace_test" >"$OUT/gpu_trace_test.log" 2>&1 ||
      failed=1
    tail -n 3 "$OUT/gpu_trace_test.log"
  fi
  local tool=$BUILD/tools/sparsekv/sparsekv
  for run in $RUNS; do
    local flags
    flags=$(flags_of "$run") || { failed=1; continue; }
    echo "=== $run: $ARGS $flags $EXTRA"
    # shellcheck disable=SC2086 # the flags are meant to split
    timeout "$LIMIT" "$tool" bench --backend cuda $ARGS $flags $EXTRA \
      --json "$OUT/plain-$run.json" >/dev/null || failed=1
    # shellcheck disable=SC2086
    timeout "$LIMIT" "$tool" bench --backend cuda $ARGS $flags $EXTRA \
      --json "$OUT/bench-$run.json" --trace-step "$OUT/trace-$run.json" || failed=1
    [[ -f $OUT/trace-$run.json ]] || continue
    local timeline=()
    python3 -c 'import matplotlib' 2>/dev/null && timeline=(--timeline "$OUT/timeline-$run")
    python3 scripts/step_profile.py "${timeline[@]}" "$OUT/trace-$run.json" |
      tee "$OUT/profile-$run.txt" || failed=1
    # TPOT with and without the tracer, point by point.
    python3 - "$OUT/plain-$run.json" "$OUT/bench-$run.json" <<'PY' || failed=1
import json, sys
plain, traced = (json.load(open(p))["points"] for p in sys.argv[1:3])
key = lambda p: (p["variant"], p["context"], p["batch"], p.get("miss_rate_target"))
by_key = {key(p): p for p in plain}
for p in traced:
    q = by_key.get(key(p))
    if q:
        print(f"TPOT {key(p)}: {q['tpot_ms']:.3f} ms plain, {p['tpot_ms']:.3f} ms in the traced run"
              f" ({p['tpot_ms'] / q['tpot_ms'] - 1:+.1%})")
PY
  done
  echo "=== done in ${SECONDS}s"
  return $failed
}

gpu_main "$OUT/gpu-trace-step.txt"
