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
# Prints each ctest summary; exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/install-deps.sh

jobs=$(nproc)
summaries=()
start=$SECONDS

# run_suite NAME DIR CMAKE_ARGS...: configure, build and ctest one build directory.
run_suite() {
  local name=$1 dir=$2
  shift 2
  local log="$dir/test-build.log"
  mkdir -p "$dir"
  echo "== $name: configure + build in $dir/"
  if ! { cmake -S . -B "$dir" -G Ninja "$@" && cmake --build "$dir" -j"$jobs"; } >"$log" 2>&1; then
    tail -n 80 "$log"
    echo "== $name: build FAILED (full log: $log)" >&2
    exit 1
  fi
  echo "== $name: ctest"
  local out="$dir/ctest.log" rc=0
  ctest --test-dir "$dir" -j"$jobs" --output-on-failure --timeout 600 >"$out" 2>&1 || rc=$?
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
if ! {
  rm -rf build/install build/example &&
    cmake --install build --prefix build/install &&
    cmake -S examples/cpp -B build/example -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_PREFIX_PATH="$PWD/build/install" &&
    cmake --build build/example &&
    build/example/decode_example &&
    PKG_CONFIG_PATH="$(dirname "$(find build/install -name sparsekv.pc)")" &&
    export PKG_CONFIG_PATH &&
    # shellcheck disable=SC2046  # pkg-config's flags are words
    g++ -std=c++20 -O1 examples/cpp/decode_example.cc -o build/example/decode_example_pc \
      $(pkg-config --cflags --libs sparsekv) &&
    build/example/decode_example_pc
} >"$install_log" 2>&1; then
  tail -n 40 "$install_log"
  echo "== install: FAILED (full log: $install_log)" >&2
  exit 1
fi
grep '^decode_example:' "$install_log" | tail -n 1
summaries+=("install: examples/cpp against build/install OK (CMake package and pkg-config)")
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
  run_suite "asan" build-asan -DCMAKE_BUILD_TYPE=Debug -DSPARSEKV_SANITIZE=ON -DSPARSEKV_CUDA=OFF

# run_fuzz: a small clang build of the library and the fuzz target only, then a bounded run on a
# copy of the committed corpus (the repository is not modified). A crash fails the script; its
# input is left in build-fuzz/artifacts/.
run_fuzz() {
  local dir=build-fuzz seconds=${SPARSEKV_FUZZ_SECONDS:-60}
  local log="$dir/test-build.log"
  mkdir -p "$dir"
  echo "== fuzz: configure + build in $dir/"
  if ! { cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
           -DCMAKE_CXX_COMPILER=clang++ -DSPARSEKV_FUZZ=ON -DSPARSEKV_CUDA=OFF \
           -DSPARSEKV_BUILD_TESTS=OFF -DSPARSEKV_BUILD_TOOLS=OFF -DSPARSEKV_BUILD_PYTHON=OFF &&
         cmake --build "$dir" -j"$jobs" --target manager_fuzz; } >"$log" 2>&1; then
    tail -n 80 "$log"
    echo "== fuzz: build FAILED (full log: $log)" >&2
    exit 1
  fi
  local work
  work=$(mktemp -d)
  cp fuzz/corpus/manager/* "$work/"
  rm -rf "$dir/artifacts"
  mkdir -p "$dir/artifacts"
  echo "== fuzz: manager_fuzz for ${seconds} s"
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
  { grep --line-buffered -E '^python-test:|^Downloading|^ *\[[0-9]+/[0-9]+\]' || true; }; then
  tail -n 80 "$py_log"
  echo "== python: FAILED (full log: $py_log)" >&2
  exit 1
fi
tail -n 1 "$py_log"
summaries+=("python: $(tail -n 1 "$py_log")")

echo
echo "== summary ($((SECONDS - start)) s)"
printf '  %s\n' "${summaries[@]}"
