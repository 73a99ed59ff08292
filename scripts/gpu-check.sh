#!/usr/bin/env bash
# The one command to run on a GPU machine, from the repository root:
#   OUT=/some/dir bash scripts/gpu-check.sh
# Builds everything (Release, sm_90, CUDA on), runs all tests, the three operator benchmarks and
# compute-sanitizer (memcheck, racecheck) on the CUDA backend tests, and collects the results in
# $OUT (default ./gpu-check-out), in up to 10 files (more than the device tool brings back one by
# one: pack $OUT into one archive there):
#   gpu-check.txt     everything printed here: device, toolchain, bench tables, step table
#   build.log         cmake configure + build
#   ctest.log         ctest --output-on-failure
#   sanitizer.log     compute-sanitizer memcheck + racecheck
#   index_copy.json   index_copy_bench results       resolve.json   resolve_bench results
#   index_copy_modes.json  index_copy_bench on each kind of host memory
#   copy_overlap.json copy_overlap_bench results (small copies; a copy beside the weight GEMM)
#   summary.json      the summary keys of the benchmarks (scripts/merge_summary.py)
#   python.log        pip install of the Python package (CUDA), its pytest suite, the torch example
# Every step runs even if an earlier one failed (except those that need a build that failed);
# the exit status is non-zero if any step failed. The benchmarks run before the sanitizers so that
# a slow sanitizer cannot cost the numbers; every step is capped so the whole run stays under
# GPU_CHECK_DEADLINE seconds.
#
# Environment (all optional):
#   GPU_CHECK_ONLY_BENCH=1        build (incrementally) and run the benchmarks only
#   GPU_CHECK_SKIP_BUILD=1        reuse an existing build directory as it is
#   GPU_CHECK_SKIP_TESTS=1        no ctest
#   GPU_CHECK_TESTS               ctest -R regex: only the tests it matches (e.g. "Cuda")
#   GPU_CHECK_SKIP_BENCH=1        no benchmarks
#   GPU_CHECK_SKIP_SANITIZER=1    no compute-sanitizer
#   GPU_CHECK_SKIP_PYTHON=1       no Python package build, tests and example
#   GPU_CHECK_BUILD_DIR           build directory (build-gpu)
#   GPU_CHECK_DEADLINE            seconds for the whole script (540)
#   GPU_CHECK_INDEX_COPY_ARGS     extra flags for index_copy_bench (e.g. "--pool_gib 8")
#   GPU_CHECK_RESOLVE_ARGS        extra flags for resolve_bench (e.g. "--contexts 32768"); its
#                                 standard sweep sorts misses as the library does by default (from
#                                 batch 32) and copies them as the library does (strategy
#                                 "library": fused from CacheOptions::fused_copy_min_batch);
#                                 scripts/gpu-bench-copy.sh compares the strategies
#   GPU_CHECK_COPY_OVERLAP_ARGS   extra flags for copy_overlap_bench (e.g. "--blocks 8,16,0")
#   GPU_CHECK_MEMCHECK_FILTER     gtest filter for memcheck (default: all but the three longest)
#   GPU_CHECK_RACECHECK_FILTER    gtest filter for racecheck (default: the kernel tests)
#   GPU_CHECK_SANITIZER_TIMEOUT   seconds per sanitizer tool (120)
set -u -o pipefail

# shellcheck source=scripts/gpu-common.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-common.sh"
gpu_out gpu-check-out
BUILD=${GPU_CHECK_BUILD_DIR:-build-gpu}
DEADLINE=${GPU_CHECK_DEADLINE:-540}

ONLY_BENCH=${GPU_CHECK_ONLY_BENCH:-0}
SKIP_BUILD=${GPU_CHECK_SKIP_BUILD:-0}
SKIP_TESTS=${GPU_CHECK_SKIP_TESTS:-$ONLY_BENCH}
TESTS=${GPU_CHECK_TESTS:-}
SKIP_BENCH=${GPU_CHECK_SKIP_BENCH:-0}
SKIP_SANITIZER=${GPU_CHECK_SKIP_SANITIZER:-$ONLY_BENCH}
MEMCHECK_FILTER=${GPU_CHECK_MEMCHECK_FILTER:-"-CudaResolveTest.MatchesReferenceOverManySteps:CudaResolveTest.FusedCopyMatchesReference:ManagerCudaTest.RandomOperationsMatchTheCpuBackend:ManagerCudaTest.ProductionShapesMatchTheCpuBackend"}
RACECHECK_FILTER=${GPU_CHECK_RACECHECK_FILTER:-"CudaIndexCopyTest.*:CudaResolveTest.ZeroWindow:CudaResolveTest.LargestShapes:CudaResolveTest.FusedCopySmallShapes:CudaResolveTest.ClockSmallShapes:CudaAssembleTest.*"}
SANITIZER_TIMEOUT=${GPU_CHECK_SANITIZER_TIMEOUT:-120}
SANITIZER=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)

STEP_NAMES=()
STEP_RESULTS=()
FAILED=0

record() {  # record NAME RESULT SECONDS
  STEP_NAMES+=("$1")
  STEP_RESULTS+=("$(printf '%-12s %5ss' "$2" "$3")")
  case $2 in ok | skipped) ;; *) FAILED=1 ;; esac
}

# Reserves GiB of 2 MB pages (vm.nr_hugepages) for the pool if the system lets us, and prints the
# state either way. The benchmarks then use them through HostMemoryKind::kAuto.
reserve_huge_pages() {
  local gib=$1 f=/proc/sys/vm/nr_hugepages
  if ((gib > 0)) && [[ -w $f ]]; then
    echo $((gib * 512)) >"$f" 2>/dev/null || true
  fi
  echo "huge pages: $(grep -E 'HugePages_(Total|Free)|Hugepagesize' /proc/meminfo | tr -s ' ' | tr '\n' ' ')"
  echo "transparent huge pages: $(cat /sys/kernel/mm/transparent_hugepage/enabled 2>/dev/null)"
}

# Seconds left before the deadline, minus a margin for the final summary.
remaining() { echo $((DEADLINE - SECONDS - 15)); }

# step NAME LOG TIMEOUT CMD... : runs CMD (output appended to LOG, or shown here if LOG is "-")
# under a TIMEOUT-second limit (capped by the deadline) and records ok / FAIL(rc) / TIMEOUT.
step() {
  local name=$1 log=$2 limit=$3
  shift 3
  local left
  left=$(remaining)
  if ((left < 20)); then
    echo "=== $name: not started, deadline reached"
    record "$name" "NO-TIME" 0
    return 1
  fi
  ((limit > left)) && limit=$left
  echo "=== $name ($(date +%T), limit ${limit}s)"
  local t0=$SECONDS rc
  if [[ $log == - ]]; then
    timeout -k 10 "$limit" "$@"
    rc=$?
  else
    echo "=== $name: $*" >>"$log"
    timeout -k 10 "$limit" "$@" >>"$log" 2>&1
    rc=$?
  fi
  local took=$((SECONDS - t0)) result=ok
  if ((rc == 124 || rc == 137)); then
    result=TIMEOUT
  elif ((rc != 0)); then
    result="FAIL($rc)"
  fi
  record "$name" "$result" "$took"
  if [[ $result != ok && $log != - ]]; then
    echo "--- last lines of $(basename "$log"):"
    tail -n 40 "$log"
  fi
  [[ $result == ok ]]
}

main() {
  gpu_banner gpu-check " in $ROOT, results in $OUT"
  nvidia-smi -L
  nvidia-smi --query-gpu=name,driver_version,pcie.link.gen.current,pcie.link.width.current,clocks.sm,clocks.mem,temperature.gpu --format=csv
  nvcc --version | tail -n 2
  cmake --version | head -n 1
  echo "cores: $(nproc); memory: $(free -g | awk '/Mem:/ {print $2 " GiB total, " $7 " GiB available"}')"
  gpu_tree
  gpu_install_sysroot

  # Tests need GoogleTest: from .deps/googletest (no network on the GPU machine).
  local want_tests=1 gtest_src=$ROOT/.deps/googletest
  [[ $SKIP_TESTS == 1 && $SKIP_SANITIZER == 1 ]] && want_tests=0
  if ((want_tests)) && [[ ! -f $gtest_src/CMakeLists.txt ]]; then
    echo "!!! $gtest_src is missing: building without tests"
    want_tests=0
    record "googletest" "MISSING" 0
  fi
  local tests_flag=OFF
  ((want_tests)) && tests_flag=ON
  local cmake_args=(-S "$ROOT" -B "$BUILD" "${GPU_CMAKE_ARGS[@]}"
    -DSPARSEKV_BUILD_TOOLS="${GPU_CHECK_TOOLS:-ON}" -DSPARSEKV_BUILD_TESTS="$tests_flag"
    -DSPARSEKV_GTEST_SOURCE="$gtest_src")

  local built=1
  if [[ $SKIP_BUILD == 1 ]]; then
    record "build" "skipped" 0
  else
    : >"$OUT/build.log"
    if ! step "configure" "$OUT/build.log" 180 cmake "${cmake_args[@]}"; then
      # The CLI tool needs packages the GPU machine may lack; the rest (tests, benchmarks) does
      # not. The failed configure stays recorded; build what can be built.
      if grep -qE "CLI11|nlohmann_json" "$OUT/build.log"; then
        step "configure-no-tools" "$OUT/build.log" 180 cmake "${cmake_args[@]}" \
          -DSPARSEKV_BUILD_TOOLS=OFF || built=0
      else
        built=0
      fi
    fi
    if ((built)); then
      step "build" "$OUT/build.log" 420 cmake --build "$BUILD" -j "$(nproc)" || built=0
    fi
  fi

  if [[ $SKIP_TESTS == 1 || $want_tests == 0 ]]; then
    record "ctest" "skipped" 0
  elif ((!built)); then
    record "ctest" "NO-BUILD" 0
  else
    : >"$OUT/ctest.log"
    # The control-plane and scale-out tests start a redis-server; a GPU machine without one
    # leaves them to CI (where scripts/install-deps.sh installs it) rather than failing them.
    local exclude=()
    if ! command -v redis-server >/dev/null; then
      echo "no redis-server here: ControlPlane*, ScaleOut* and NodePoolProcess* tests left out (they run in CI)"
      exclude=(-E "ControlPlane|ScaleOut|NodePoolProcess")
    fi
    local only=()
    [[ -n $TESTS ]] && only=(-R "$TESTS")
    step "ctest" "$OUT/ctest.log" 300 \
      ctest --test-dir "$BUILD" --output-on-failure -j 8 --timeout 240 "${exclude[@]}" "${only[@]}"
    grep -E "tests passed|tests failed|Total Test time" "$OUT/ctest.log" | tail -n 3
  fi

  if [[ $SKIP_BENCH == 1 ]]; then
    record "index_copy" "skipped" 0
    record "resolve" "skipped" 0
    record "copy_overlap" "skipped" 0
  elif ((!built)); then
    record "index_copy" "NO-BUILD" 0
    record "resolve" "NO-BUILD" 0
    record "copy_overlap" "NO-BUILD" 0
  else
    rm -f "$OUT/index_copy.json" "$OUT/index_copy_modes.json" "$OUT/resolve.json" \
      "$OUT/copy_overlap.json"
    # The pool's backing decides the gather speed at large spans (translation reach): reserve
    # 2 MB pages so that the library's default (HostMemoryKind::kAuto) can use them, and compare
    # the three kinds of host memory once, for 656-B rows.
    reserve_huge_pages "${GPU_CHECK_HUGEPAGES_GIB:-40}"
    # shellcheck disable=SC2086 # the extra flags are meant to split
    step "index_copy" - 200 "$BUILD/bench/index_copy_bench" --json "$OUT/index_copy.json" \
      ${GPU_CHECK_INDEX_COPY_ARGS:-}
    if [[ ${GPU_CHECK_SKIP_MODES:-0} != 1 ]]; then
      for mode in thp hostalloc vmm; do
        step "ic_$mode" - 120 "$BUILD/bench/index_copy_bench" --host_memory "$mode" \
          --row_bytes 656 --span_gib 2 --reps 10 --json "$OUT/ic_$mode.tmp.json"
      done
      python3 - "$OUT" <<'PY'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
modes = {}
for f in sorted(out.glob("ic_*.tmp.json")):
    modes[f.name[3:-9]] = json.loads(f.read_text())
    f.unlink()
(out / "index_copy_modes.json").write_text(json.dumps(modes, indent=1))
PY
    fi
    # shellcheck disable=SC2086
    step "resolve" - 200 "$BUILD/bench/resolve_bench" --json "$OUT/resolve.json" \
      ${GPU_CHECK_RESOLVE_ARGS:-}
    # shellcheck disable=SC2086
    step "copy_overlap" - 120 "$BUILD/bench/copy_overlap_bench" --json "$OUT/copy_overlap.json" \
      ${GPU_CHECK_COPY_OVERLAP_ARGS:-}
    if [[ ${GPU_CHECK_PROFILE:-0} == 1 ]]; then
      # Hardware counters of one hits-only Resolve at B = 64 (clocks left alone).
      local ncu_bin
      ncu_bin=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
      step "ncu_resolve" - 150 "$ncu_bin" --clock-control none -k regex:ResolveKernel \
        --launch-skip 4 --launch-count 1 --section SpeedOfLight --section WarpStateStats \
        --section LaunchStats --section Occupancy --section SchedulerStats \
        "$BUILD/bench/resolve_bench" --contexts 32768 --batches 64 --miss_rates 0 \
        --row_bytes 656 --warmup 1 --reps 2 --max_pool_gib 4
    fi
  fi

  if [[ $SKIP_SANITIZER == 1 || $want_tests == 0 ]]; then
    record "memcheck" "skipped" 0
    record "racecheck" "skipped" 0
  elif ((!built)); then
    record "memcheck" "NO-BUILD" 0
    record "racecheck" "NO-BUILD" 0
  else
    local test_bin=$BUILD/src/cuda_backend_test
    : >"$OUT/sanitizer.log"
    step "memcheck" "$OUT/sanitizer.log" "$SANITIZER_TIMEOUT" \
      "$SANITIZER" --tool memcheck --error-exitcode 1 --print-limit 20 \
      "$test_bin" --gtest_filter="$MEMCHECK_FILTER" --gtest_brief=1
    step "racecheck" "$OUT/sanitizer.log" "$SANITIZER_TIMEOUT" \
      "$SANITIZER" --tool racecheck --error-exitcode 1 --print-limit 20 \
      "$test_bin" --gtest_filter="$RACECHECK_FILTER" --gtest_brief=1
    grep -E "ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED" "$OUT/sanitizer.log" | tail -n 6
  fi

  # The Python package with the CUDA backend, built against the torch installed there (no network:
  # build requirements come from the machine's Python), its GPU tests and the CUDA-graph example.
  if [[ ${GPU_CHECK_SKIP_PYTHON:-0} == 1 ]]; then
    record "python" "skipped" 0
  else
    local site=/tmp/sparsekv-python
    rm -rf "$site"
    step "python-build" "$OUT/python.log" 240 python3 -m pip install --no-build-isolation \
      --no-deps --target "$site" -Ccmake.define.SPARSEKV_CUDA=ON "$ROOT"
    step "pytest" "$OUT/python.log" 120 env PYTHONPATH="$site" python3 -m pytest -ra \
      -p no:cacheprovider "$ROOT/python/tests"
    step "torch-example" "$OUT/python.log" 120 env PYTHONPATH="$site" python3 \
      "$ROOT/examples/torch_dsa_decoder.py"
    grep -E "passed|failed|match|MATCH|mismatch" "$OUT/python.log" | tail -n 6
  fi

  echo
  echo "=== summary keys ($OUT/summary.json)"
  local inputs=()
  for f in "$OUT/index_copy.json" "$OUT/resolve.json" "$OUT/copy_overlap.json"; do
    [[ -f $f ]] && inputs+=("$f")
  done
  if ((${#inputs[@]})); then
    python3 "$ROOT/scripts/merge_summary.py" "$OUT/summary.json" "${inputs[@]}" || FAILED=1
  else
    echo "  (no benchmark results)"
  fi

  echo
  echo "=== steps (total ${SECONDS}s)"
  for i in "${!STEP_NAMES[@]}"; do
    printf '  %-12s %s\n' "${STEP_NAMES[$i]}" "${STEP_RESULTS[$i]}"
  done
  if ((FAILED)); then echo "gpu-check: FAILED"; else echo "gpu-check: all steps ok"; fi
  return "$FAILED"
}

gpu_main "$OUT/gpu-check.txt"
