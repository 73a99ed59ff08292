#!/usr/bin/env bash
# The README's test command: installs dependencies, then
#   1. build/      Release, CUDA AUTO (the CUDA backend compiles when nvcc exists; its tests skip
#                  without a GPU), ctest;
#      then `cmake --install build` into build/install and examples/cpp built and run against
#      that installed tree (CMake package and pkg-config);
#   2. build-asan/ Debug, AddressSanitizer + UBSan, CPU only, ctest;
#   3. build-fuzz/ the manager's libFuzzer target (clang, ASan + UBSan, CPU only), run for
#      SPARSEKV_FUZZ_SECONDS (default 60) on a copy of fuzz/corpus/manager (docs/fuzzing.md);
#   4. the Python package: `pip install .` into build/python-venv and pytest
#      (scripts/python-test.sh).
# Prints each ctest summary; exits non-zero on any failure. Every stage says when it starts and
# how long it took, and a stage that runs for long prints a line every 30 s (its elapsed time and
# the last build or test step in its log), so that nothing is silent for minutes.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/install-deps.sh

jobs=$(nproc)
summaries=()
start=$SECONDS

# progress NAME LOG COMMAND...: COMMAND's output into LOG, a line every 30 s while it runs.
# shellcheck source=scripts/progress.sh
source scripts/progress.sh

# configure_and_build DIR CMAKE_ARGS...
configure_and_build() {
  local dir=$1
  shift
  cmake -S . -B "$dir" -G Ninja "$@" && cmake --build "$dir" -j"$jobs"
}

# run_suite NAME DIR CMAKE_ARGS...: configure, build and ctest one build directory.
run_suite() {
  local name=$1 dir=$2
  shift 2
  local log="$dir/test-build.log"
  mkdir -p "$dir"
  local begin=$SECONDS
  echo "== $name: configure + build in $dir/ (log: $log)"
  if ! progress "$name build" "$log" configure_and_build "$dir" "$@"; then
    tail -n 80 "$log"
    echo "== $name: build FAILED (full log: $log)" >&2
    exit 1
  fi
  echo "== $name: built in $((SECONDS - begin)) s; ctest"
  local out="$dir/ctest.log" rc=0
  begin=$SECONDS
  progress "$name ctest" "$out" ctest --test-dir "$dir" -j"$jobs" --output-on-failure \
    --timeout 600 || rc=$?
  echo "== $name: ctest took $((SECONDS - begin)) s"
  # Failures in full; otherwise ctest's summary lines (skipped tests counted, not listed).
  if [[ $rc -ne 0 ]]; then
    cat "$out"
  else
    grep -E 'tests passed|Total Test time' "$out" || true
    local skipped
    skipped=$(grep -c '(Skipped)' "$out" || true)
    [[ $skipped -eq 0 ]] || echo "$skipped tests skipped (e.g. CUDA tests without a GPU)"
  fi
  summaries+=("$name: $(grep -E 'tests passed|tests failed' "$out" | tail -n 1)")
  if [[ $rc -ne 0 ]]; then
    echo "== $name: ctest FAILED" >&2
    exit "$rc"
  fi
}

run_suite "release" build -DCMAKE_BUILD_TYPE=Release -DSPARSEKV_CUDA=AUTO

# The installed C++ package, used as another project would (docs/install.md).
echo "== install: cmake --install build, then examples/cpp against build/install"
install_log=build/install-test.log
# shellcheck disable=SC2046  # pkg-config's flags are words
install_and_build_example() {
  rm -rf build/install build/example &&
    cmake --install build --prefix build/install &&
    cmake -S examples/cpp -B build/example -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_PREFIX_PATH="$PWD/build/install" &&
    cmake --build build/example &&
    build/example/decode_example &&
    PKG_CONFIG_PATH="$(dirname "$(find build/install -name sparsekv.pc)")" &&
    export PKG_CONFIG_PATH &&
    g++ -std=c++20 -O1 examples/cpp/decode_example.cc -o build/example/decode_example_pc \
      $(pkg-config --cflags --libs sparsekv) &&
    build/example/decode_example_pc
}
if ! progress "install" "$install_log" install_and_build_example; then
  tail -n 40 "$install_log"
  echo "== install: FAILED (full log: $install_log)" >&2
  exit 1
fi
grep '^decode_example:' "$install_log" | tail -n 1
summaries+=("install: examples/cpp against build/install OK (CMake package and pkg-config)")
ASAN_OPTIONS=detect_leaks=1 LSAN_OPTIONS=suppressions=$PWD/scripts/lsan-suppressions.txt \
  UBSAN_OPTIONS=print_stacktrace=1 \
  run_suite "asan" build-asan -DCMAKE_BUILD_TYPE=Debug -DSPARSEKV_SANITIZE=ON -DSPARSEKV_CUDA=OFF

# run_fuzz: a small clang build of the library and the fuzz target only, then a bounded run on a
# copy of the committed corpus (the repository is not modified). A crash fails the script; its
# input is left in build-fuzz/artifacts/.
run_fuzz() {
  local dir=build-fuzz seconds=${SPARSEKV_FUZZ_SECONDS:-60}
  local log="$dir/test-build.log"
  mkdir -p "$dir"
  echo "== fuzz: configure + build in $dir/ (log: $log)"
  build_fuzz() {
    cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      -DCMAKE_CXX_COMPILER=clang++ -DSPARSEKV_FUZZ=ON -DSPARSEKV_CUDA=OFF \
      -DSPARSEKV_BUILD_TESTS=OFF -DSPARSEKV_BUILD_TOOLS=OFF -DSPARSEKV_BUILD_PYTHON=OFF &&
      cmake --build "$dir" -j"$jobs" --target manager_fuzz
  }
  local begin=$SECONDS
  if ! progress "fuzz build" "$log" build_fuzz; then
    tail -n 80 "$log"
    echo "== fuzz: build FAILED (full log: $log)" >&2
    exit 1
  fi
  local work
  work=$(mktemp -d)
  cp fuzz/corpus/manager/* "$work/"
  rm -rf "$dir/artifacts"
  mkdir -p "$dir/artifacts"
  echo "== fuzz: built in $((SECONDS - begin)) s; manager_fuzz for ${seconds} s"
  local out="$dir/fuzz.log" rc=0
  "$dir/fuzz/manager_fuzz" -max_total_time="$seconds" -max_len=8192 -timeout=30 \
    -artifact_prefix="$dir/artifacts/" "$work" >"$out" 2>&1 || rc=$?
  rm -rf "$work"
  local done_line
  done_line=$(grep -a 'DONE' "$out" | tail -n 1 || true)
  if [[ $rc -ne 0 ]]; then
    tail -n 60 "$out"
    echo "== fuzz: manager_fuzz FAILED (input in $dir/artifacts/, log: $out)" >&2
    exit 1
  fi
  echo "$done_line"
  summaries+=("fuzz: no crash in ${seconds} s ($(grep -ao 'Done [0-9]* runs' "$out" | tail -n 1))")
}
run_fuzz

echo "== python: pip install . + pytest"
py_log=build/python-test.log
# Its progress lines (steps, downloads, compiled files) are shown as they come; the rest is logged.
if ! bash scripts/python-test.sh 2>&1 | tee "$py_log" |
  { grep --line-buffered -E '^python-test:|^ *(Collecting|Downloading|Using cached) |^ *\[[0-9]+/[0-9]+\]' ||
    true; }; then
  tail -n 80 "$py_log"
  echo "== python: FAILED (full log: $py_log)" >&2
  exit 1
fi
tail -n 1 "$py_log"
summaries+=("python: $(tail -n 1 "$py_log")")
summaries+=("the Python package is installed in build/python-venv:" \
  "  build/python-venv/bin/python -c 'import sparsekv' (or . build/python-venv/bin/activate)")

echo
echo "== summary ($((SECONDS - start)) s)"
printf '  %s\n' "${summaries[@]}"
