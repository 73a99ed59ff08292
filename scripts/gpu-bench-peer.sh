#!/usr/bin/env bash
# The peer tier on a GPU machine (docs/peer-tier.md), from the repository root:
#   OUT=/some/dir bash scripts/gpu-bench-peer.sh
# Builds (Release, sm_90) peer_gather_bench, the sparsekv tool and, where .deps/googletest
# exists, the peer tier's tests, then:
#   1. how the GPUs are linked: nvidia-smi topo -m and nvlink --status (topology.txt);
#   2. peer_gather_bench: random 656-B and 1152-B rows gathered by IndexCopy from a region on the
#      peer GPU against the same gathers from pinned host memory, with both memcpy ceilings, in
#      one run (peer_gather.json; summary key peer_gather_to_host_gather_656);
#   3. `sparsekv bench` twice with the same flags: misses read from the host pool, then with
#      --peer-device (every prompt row also in a region on the peer GPU); full-hbm runs beside the
#      second so that its outputs are checked against full-hbm's; scripts/peer_summary.py then
#      writes the TPOT reduction at the largest common batch per context and miss rate
#      (e2e_tpot_reduction_peer_vs_host_16k_m20, ...) and plots TPOT against batch (peer.png);
#   4. the tests: peer_tier_test and peer_tier_process_test (two processes over CUDA IPC), then
#      compute-sanitizer memcheck on both.
# With one GPU the "peer" is the decode GPU itself: a same-GPU stand-in that exercises the path
# but measures no peer link (the JSONs say so), and the end-to-end runs are shrunk to fit the
# region beside everything else in one GPU's memory.
# Writes to $OUT: peer.txt (everything printed), topology.txt, peer_gather.json,
# e2e-host.json, e2e-peer.json, peer_e2e.json, peer.png, tests.log, summary.json.
# Environment: PEER_BUILD [build-peer], PEER_DEADLINE [560] seconds, PEER_DEVICE (default 1 with
# two GPUs, else 0), PEER_GATHER_ARGS, PEER_E2E_ARGS (replace the default e2e flags),
# PEER_SKIP_E2E=1, PEER_SKIP_TESTS=1.
set -u -o pipefail

# shellcheck source=scripts/gpu-common.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-common.sh"
gpu_out gpu-bench-peer-out
BUILD=${PEER_BUILD:-build-peer}
DEADLINE=${PEER_DEADLINE:-560}
TMP=$(mktemp -d)

main() {
  trap 'rm -rf "$TMP"' EXIT
  gpu_banner gpu-bench-peer ", results in $OUT"
  nvidia-smi --query-gpu=index,name,driver_version,pcie.link.gen.current,pcie.link.width.current --format=csv
  local gpus
  gpus=$(nvidia-smi --query-gpu=index --format=csv,noheader | wc -l)
  local peer=${PEER_DEVICE:-$((gpus > 1 ? 1 : 0))}
  {
    echo "GPUs: $gpus; decode device 0, peer device $peer"
    nvidia-smi topo -m
    nvidia-smi nvlink --status 2>&1 | head -n 40
  } >"$OUT/topology.txt" 2>&1
  cat "$OUT/topology.txt"
  gpu_install_sysroot
  local tests=OFF gtest_src=$ROOT/.deps/googletest
  [[ ${PEER_SKIP_TESTS:-0} != 1 && -f $gtest_src/CMakeLists.txt ]] && tests=ON
  local targets=(peer_gather_bench sparsekv_tool)
  [[ $tests == ON ]] && targets+=(peer_tier_test peer_tier_process_test peer_tier_process_test_child)
  gpu_build gpu-bench-peer "$BUILD" "$TMP/build.log" "${targets[@]}" -- \
    -DSPARSEKV_BUILD_TESTS=$tests -DSPARSEKV_GTEST_SOURCE="$gtest_src" \
    -DSPARSEKV_BUILD_TOOLS=ON || return 1
  echo "=== built ${targets[*]} in ${SECONDS}s"
  local failed=0 start=$SECONDS

  # shellcheck disable=SC2086  # the extra flags are words
  timeout 150 "$BUILD/bench/peer_gather_bench" --peer_device "$peer" \
    --json "$OUT/peer_gather.json" ${PEER_GATHER_ARGS:-} || { echo "!!! peer_gather_bench failed"; failed=1; }
  echo "=== peer_gather_bench: $((SECONDS - start)) s"
  python3 scripts/merge_summary.py "$OUT/summary.json" "$OUT/peer_gather.json" || failed=1

  if [[ $tests == ON ]]; then
    start=$SECONDS
    : >"$OUT/tests.log"
    for t in peer_tier_test peer_tier_process_test; do
      timeout 120 "$BUILD/src/peer/$t" >>"$OUT/tests.log" 2>&1 || failed=1
    done
    local sanitizer
    sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
    for t in peer_tier_test peer_tier_process_test; do
      timeout 150 "$sanitizer" --tool memcheck --error-exitcode 1 --print-limit 20 \
        "$BUILD/src/peer/$t" --gtest_filter='*/1:PeerTierProcessTest.*' --gtest_brief=1 \
        >>"$OUT/tests.log" 2>&1 || failed=1
    done
    grep -E "^\[  (PASSED|FAILED|SKIPPED) |ERROR SUMMARY" "$OUT/tests.log"
    echo "=== tests: $((SECONDS - start)) s"
  fi

  if [[ ${PEER_SKIP_E2E:-0} != 1 ]]; then
    local tool=$BUILD/tools/sparsekv/sparsekv
    local e2e
    if [[ -n ${PEER_E2E_ARGS:-} ]]; then
      # shellcheck disable=SC2206
      e2e=(${PEER_E2E_ARGS})
    elif ((peer != 0)); then
      e2e=(--sweep --contexts 16384,32768 --miss-rate 0.2,0.4 --host-pool-gb 80)
    else
      # One GPU: the region (every request's prompt) shares the GPU with the rest.
      e2e=(--contexts 16384 --miss-rate 0.2,0.4 --batch 16 --host-pool-gb 12 --weights-gb 40)
    fi
    local common=(bench --backend cuda --page-tokens 1024 --steps 16 --warmup 4 "${e2e[@]}")
    local left=$((DEADLINE - SECONDS - 20))
    echo "=== e2e, misses from host memory (limit $((left / 2))s)"
    "$tool" "${common[@]}" --variants sparsekv --time-limit $((left / 2 - 30)) \
      --json "$OUT/e2e-host.json" || failed=1
    left=$((DEADLINE - SECONDS - 20))
    echo "=== e2e, misses from peer device $peer (limit ${left}s)"
    "$tool" "${common[@]}" --variants full-hbm,sparsekv --peer-device "$peer" \
      --time-limit $((left - 30)) --json "$OUT/e2e-peer.json" || failed=1
    python3 scripts/peer_summary.py "$OUT/e2e-host.json" "$OUT/e2e-peer.json" \
      "$OUT/peer_e2e.json" "$OUT/peer.png" || failed=1
    python3 scripts/merge_summary.py "$OUT/summary.json" "$OUT/peer_e2e.json" || failed=1
  fi
  echo "=== done in ${SECONDS}s, $( ((failed)) && echo FAILED || echo ok)"
  return $failed
}

gpu_main "$OUT/peer.txt"
