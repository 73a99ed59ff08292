#!/usr/bin/env bash
# The hot cache's hit rate for DeepSeek-V4's compressed (CSA) entries, replayed on the CPU, from
# the repository root:
#   OUT=bench/results/2026-12-04-v4-entry-replay bash scripts/v4-entry-replay.sh [BUILD_DIR]
# For deepseek-v4-pro and deepseek-v4-flash, every CSA layer, hot caches of 2 x top-k entries,
# every policy, histories ending at 128K, 256K, 512K and 1M tokens, two workloads
# (docs/workload.md, "Compressed entries"):
#   calibrated:   the glm5-published locality applied to entries;
#   uncorrelated: every row drawn uniformly (the worst case: hit rate (C + 1) / entries).
# Each point is one request of V4_STEPS [256] decode steps (V4_WARMUP [16] not counted) whose
# history starts at the context minus the steps. Writes $OUT/<preset>-<context>-<workload>.json,
# $OUT/replay.txt (everything printed) and $OUT/table.md (scripts/v4_entry_table.py).
# Needs the sparsekv tool built in BUILD_DIR [build-cpu] (target sparsekv_tool). About 3 minutes on
# a shared 2-core machine.
set -eu -o pipefail

BUILD=${1:-build-cpu}
OUT=${OUT:?set OUT to the output folder}
STEPS=${V4_STEPS:-256}
WARMUP=${V4_WARMUP:-16}
TOOL="$BUILD/tools/sparsekv/sparsekv"
mkdir -p "$OUT"
: >"$OUT/replay.txt"
for preset in deepseek-v4-pro deepseek-v4-flash; do
  for context in 131072 262144 524288 1048576; do
    for workload in calibrated uncorrelated; do
      args=(replay --preset "$preset" --context $((context - STEPS)) --steps "$STEPS"
        --warmup "$WARMUP" --synthetic-locality "$workload"
        --json "$OUT/$preset-$context-$workload.json")
      echo "\$ sparsekv ${args[*]}" >>"$OUT/replay.txt"
      "$TOOL" "${args[@]}" >>"$OUT/replay.txt" 2>/dev/null
    done
  done
done
python3 "$(dirname "${BASH_SOURCE[0]}")/v4_entry_table.py" "$OUT" >"$OUT/table.md"
cat "$OUT/table.md"
