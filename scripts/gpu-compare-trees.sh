#!/usr/bin/env bash
# Before/after on one GPU machine, in one run: builds a baseline tree (a source archive made with
# `git archive --format=tar.gz -o BASE.tar.gz COMMIT`) and this tree, then runs the same
# resolve_bench points and the same end-to-end `sparsekv bench` points on both, alternating
# (base, new, base, new) so that drift of the machine shows as a difference between the two runs
# of one tree. From the repository root on the GPU machine:
#   OUT=/some/dir bash scripts/gpu-compare-trees.sh BASE.tar.gz
# Writes to $OUT: compare.txt (everything printed), resolve-{base,new}-{1,2}.json,
# e2e-{base,new}-{1,2}.json. Environment: COMPARE_RESOLVE_ARGS, COMPARE_BENCH_ARGS override the
# points (defaults below); COMPARE_NEW_RESOLVE_ARGS, COMPARE_NEW_BENCH_ARGS are added for this tree
# only (a flag the base tree lacks, e.g. `--config` with the base tree's default eviction);
# COMPARE_ROUNDS [2].
# Same eviction as a tree from before the clock became the default (segmented LRU):
#   COMPARE_RESOLVE_ARGS="... --eviction slru" \
#   COMPARE_NEW_BENCH_ARGS="--config scripts/testdata/eviction-slru.json" \
#   OUT=... bash scripts/gpu-compare-trees.sh BASE.tar.gz
set -u -o pipefail

# shellcheck source=scripts/gpu-common.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-common.sh"
BASE=${1:?usage: gpu-compare-trees.sh BASE.tar.gz}
gpu_out gpu-compare-out
ROUNDS=${COMPARE_ROUNDS:-2}
RESOLVE_ARGS=${COMPARE_RESOLVE_ARGS:-"--contexts 32768 --batches 1,8,64,100 --miss_rates 0,0.2 --row_bytes 656 --reps 20"}
BENCH_ARGS=${COMPARE_BENCH_ARGS:-"--backend cuda --preset deepseek-v3.2 --contexts 32768 --batch 16 --miss-rate 0.2 --variants full-hbm,sparsekv --host-pool-gb 40 --page-tokens 1024 --steps 8 --warmup 2"}
NEW_RESOLVE_ARGS=${COMPARE_NEW_RESOLVE_ARGS:-}
NEW_BENCH_ARGS=${COMPARE_NEW_BENCH_ARGS:-}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

build() {  # build NAME SOURCE_DIR
  cmake -S "$2" -B "$WORK/build-$1" "${GPU_CMAKE_ARGS[@]}" -DSPARSEKV_BUILD_TESTS=OFF \
    -DSPARSEKV_BUILD_TOOLS=ON >"$WORK/build-$1.log" 2>&1 &&
    cmake --build "$WORK/build-$1" -j "$(nproc)" --target sparsekv_tool resolve_bench \
      >>"$WORK/build-$1.log" 2>&1
}

main() {
  gpu_banner gpu-compare-trees ": base $BASE against $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo 'this tree')"
  nvidia-smi --query-gpu=name,driver_version,pcie.link.gen.current,clocks.sm,clocks.mem --format=csv
  gpu_install_sysroot
  mkdir -p "$WORK/base" && tar -xzf "$BASE" -C "$WORK/base" || return 1
  build base "$WORK/base" & local base_pid=$!
  build new "$ROOT" || { tail -n 40 "$WORK/build-new.log"; echo "new tree: BUILD FAILED"; return 1; }
  wait "$base_pid" || { tail -n 40 "$WORK/build-base.log"; echo "base tree: BUILD FAILED"; return 1; }
  echo "=== built both in ${SECONDS}s"
  local failed=0 round tree
  for ((round = 1; round <= ROUNDS; ++round)); do
    for tree in base new; do
      local b=$WORK/build-$tree resolve_args=$RESOLVE_ARGS bench_args=$BENCH_ARGS
      if [[ $tree == new ]]; then
        resolve_args+=" $NEW_RESOLVE_ARGS"
        bench_args+=" $NEW_BENCH_ARGS"
      fi
      echo "=== round $round, $tree: resolve_bench $resolve_args"
      # shellcheck disable=SC2086 # the arguments are meant to split
      "$b/bench/resolve_bench" $resolve_args --json "$OUT/resolve-$tree-$round.json" ||
        failed=1
      echo "=== round $round, $tree: sparsekv bench $bench_args"
      # shellcheck disable=SC2086
      "$b/tools/sparsekv/sparsekv" bench $bench_args --json "$OUT/e2e-$tree-$round.json" ||
        failed=1
    done
  done
  echo "=== total ${SECONDS}s"
  return "$failed"
}

gpu_main "$OUT/compare.txt"
