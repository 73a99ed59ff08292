#!/usr/bin/env bash
# The node pool on a GPU machine (docs/scale-out.md, "Node pool"), from the repository root:
#   OUT=/some/dir bash scripts/gpu-bench-nodepool.sh
# Builds (Release, sm_90) the two benchmarks and, where .deps/googletest exists, the node pool's
# GPU tests, then:
#   1. node_pool_bench: a child process creates and fills a 4 GiB node pool of 656-B rows; this
#      process gathers random rows from it with IndexCopy, against the same gathers from its own
#      pinned pool (node_remote_gather_ratio_656: unsorted, 16384 rows);
#   2. node_pool_step_bench: DeepSeek-V3.2 decode steps at 32K context and 20% misses, batch 1
#      and 16, over prompts a child process wrote into a node pool against the same steps over
#      prompts in the process's own pool, both captured as CUDA graphs
#      (e2e_tpot_overhead_remote_vs_local_32k_m20: the worst batch);
#   3. the GPU tests: ManagerCudaTest.CapturedStepOverANodePoolReplaysExactly and, where a
#      redis-server exists, node_pool_test (prefill and decode processes; its CUDA cases).
# The GPU reads a pool through its own address translation, whose reach decides random gathers
# over large spans: the node pool's tmpfs pages are 2 MB only with shmem transparent huge pages,
# so the script sets /sys/kernel/mm/transparent_hugepage/shmem_enabled to "advise" for the run
# where it is writable (and restores it), and records the setting in the JSONs.
# Writes to $OUT: nodepool.txt (everything printed), node_pool_gather.json, node_pool_step.json,
# tests.log, summary.json (both summary keys, scripts/merge_summary.py).
# Environment: NODEPOOL_BUILD [build-nodepool] (e.g. gpu-check.sh's build-gpu, reused),
# NODEPOOL_DEADLINE [280] seconds for the measurements, NODEPOOL_GATHER_ARGS and
# NODEPOOL_STEP_ARGS (extra flags), NODEPOOL_SKIP_TESTS=1.
set -u -o pipefail

# shellcheck source=scripts/gpu-common.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-common.sh"
gpu_out gpu-bench-nodepool-out
BUILD=${NODEPOOL_BUILD:-build-nodepool}
DEADLINE=${NODEPOOL_DEADLINE:-280}
TMP=$(mktemp -d)
SHMEM_THP=/sys/kernel/mm/transparent_hugepage/shmem_enabled

main() {
  # main runs in the pipeline's subshell: its EXIT trap restores what it changed.
  local shmem_before=""
  trap '[[ -n $shmem_before ]] && echo "$shmem_before" >"$SHMEM_THP"; rm -rf "$TMP"' EXIT
  gpu_banner gpu-bench-nodepool ", results in $OUT"
  nvidia-smi --query-gpu=name,driver_version,pcie.link.gen.current,pcie.link.width.current --format=csv
  echo "memory: $(free -g | awk '/Mem:/ {print $2 " GiB total, " $7 " GiB available"}'); /dev/shm: $(df -h /dev/shm | awk 'NR == 2 {print $4 " free"}')"
  gpu_install_sysroot
  local tests=OFF gtest_src=$ROOT/.deps/googletest
  [[ ${NODEPOOL_SKIP_TESTS:-0} != 1 && -f $gtest_src/CMakeLists.txt ]] && tests=ON
  local targets=(node_pool_bench node_pool_step_bench)
  if ! gpu_configure "$BUILD" "$TMP/build.log" -DSPARSEKV_BUILD_TESTS=$tests \
    -DSPARSEKV_GTEST_SOURCE="$gtest_src" -DSPARSEKV_BUILD_TOOLS=ON; then
    tail -n 60 "$TMP/build.log"
    echo "gpu-bench-nodepool: CONFIGURE FAILED"
    return 1
  fi
  [[ $tests == ON ]] && targets+=(cuda_backend_test)
  # The multi-process test needs the Redis control plane (hiredis here, redis-server to run).
  if [[ $tests == ON ]] && command -v redis-server >/dev/null &&
    grep -q "^build tools/sparsekv/node_pool_test " "$BUILD/build.ninja"; then
    targets+=(node_pool_test)
  fi
  if ! gpu_build_targets "$BUILD" "$TMP/build.log" "${targets[@]}"; then
    tail -n 60 "$TMP/build.log"
    echo "gpu-bench-nodepool: BUILD FAILED"
    return 1
  fi
  echo "=== built ${targets[*]} in ${SECONDS}s"

  if [[ -w $SHMEM_THP ]] && grep -q '\[never\]' "$SHMEM_THP"; then
    shmem_before=never
    echo advise >"$SHMEM_THP" && echo "=== shmem transparent huge pages: never -> advise for this run"
  fi
  echo "=== shmem_enabled: $(cat "$SHMEM_THP" 2>/dev/null || echo unknown)"
  local failed=0 start=$SECONDS measured=$SECONDS
  # shellcheck disable=SC2086  # the extra flags are words
  timeout $((DEADLINE / 3)) "$BUILD/bench/node_pool_bench" --json "$OUT/node_pool_gather.json" \
    ${NODEPOOL_GATHER_ARGS:-} || { echo "!!! node_pool_bench failed"; failed=1; }
  echo "=== node_pool_bench: $((SECONDS - start)) s"
  start=$SECONDS
  # shellcheck disable=SC2086
  timeout $((DEADLINE - (SECONDS - measured))) "$BUILD/tools/sparsekv/node_pool_step_bench" \
    --context 32768 --miss-rate 0.2 --batches 1,16 --json "$OUT/node_pool_step.json" \
    ${NODEPOOL_STEP_ARGS:-} || { echo "!!! node_pool_step_bench failed"; failed=1; }
  echo "=== node_pool_step_bench: $((SECONDS - start)) s"
  python3 scripts/merge_summary.py "$OUT/summary.json" "$OUT/node_pool_gather.json" \
    "$OUT/node_pool_step.json" || failed=1

  if [[ $tests == ON ]]; then
    : >"$OUT/tests.log"
    "$BUILD/src/cuda_backend_test" --gtest_filter='*NodePool*' >>"$OUT/tests.log" 2>&1 || failed=1
    if [[ -x $BUILD/tools/sparsekv/node_pool_test ]]; then
      timeout 120 "$BUILD/tools/sparsekv/node_pool_test" >>"$OUT/tests.log" 2>&1 || failed=1
    else
      echo "no redis-server here: node_pool_test left out (it runs in CI on the CPU backend)" |
        tee -a "$OUT/tests.log"
    fi
    grep -E "^\[  (PASSED|FAILED|SKIPPED) " "$OUT/tests.log"
  fi
  echo "=== done in ${SECONDS}s, $( ((failed)) && echo FAILED || echo ok)"
  return $failed
}

gpu_main "$OUT/nodepool.txt"
