#!/usr/bin/env bash
# scripts/progress.sh (a ctest): a stage that runs for a while prints its elapsed time and its
# last build or test step, and the stage's exit status comes back.
set -euo pipefail
# shellcheck source=scripts/progress.sh
source "$(dirname "$0")/progress.sh"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export SPARSEKV_PROGRESS_EVERY=1

build() { for i in 1 2 3; do echo "[$i/3] Building CXX object x$i.o"; sleep 1; done; }
progress "demo build" "$work/build.log" build >"$work/out.txt"
grep -qE '^   demo build: [0-9]+ s, at \[[123]/3\]$' "$work/out.txt" ||
  { echo "no build progress line:"; cat "$work/out.txt"; exit 1; }
grep -q 'Building CXX object x3.o' "$work/build.log" || { echo "the log lost the output"; exit 1; }

tests() { echo "  2/9 Test  #2: a ...   Passed"; sleep 2; return 3; }
status=0
progress "demo ctest" "$work/ctest.log" tests >"$work/out.txt" || status=$?
((status == 3)) || { echo "status $status, not 3"; exit 1; }
grep -qE '^   demo ctest: [0-9]+ s, at 2/9 tests$' "$work/out.txt" ||
  { echo "no ctest progress line:"; cat "$work/out.txt"; exit 1; }

quick() { echo "[1/1] done"; }
progress "quick" "$work/quick.log" quick >"$work/out.txt"
[[ ! -s $work/out.txt ]] || { echo "a quick stage printed:"; cat "$work/out.txt"; exit 1; }
# filtered: pip's download lines are shown, the rest only logged; a failure shows the log's end.
pip_install() {
  echo "Collecting torch"
  echo "  Downloading torch-2.9.1-cp311-cp311-manylinux_2_28_x86_64.whl (899.7 MB)"
  echo "Requirement already satisfied: filelock"
  echo "Successfully installed torch-2.9.1"
}
filtered "$work/pip.log" '^ *(Collecting|Downloading|Using cached|Successfully)' pip_install \
  >"$work/out.txt"
if [[ $(wc -l <"$work/out.txt") -ne 3 ]] || grep -q 'Requirement' "$work/out.txt" ||
  ! grep -q '^  Downloading torch-2.9.1.*(899.7 MB)$' "$work/out.txt"; then
  echo "filtered showed:"
  cat "$work/out.txt"
  exit 1
fi
grep -q 'Requirement already satisfied' "$work/pip.log" || { echo "filtered lost the output"; exit 1; }
broken_install() { echo "Collecting nothing"; echo "ERROR: no such package"; return 4; }
status=0
filtered "$work/broken.log" '^Collecting' broken_install >"$work/out.txt" || status=$?
((status == 4)) || { echo "filtered returned $status, not 4"; exit 1; }
if ! grep -q '^failed (exit 4): broken_install; the end of ' "$work/out.txt" ||
  ! grep -q '^ERROR: no such package$' "$work/out.txt"; then
  echo "no failure report:"
  cat "$work/out.txt"
  exit 1
fi
echo "progress_test: OK"
