#!/usr/bin/env bash
# Every `sparsekv ...` command line shown in README.md and docs/*.md, run (a ctest). Each runs as
# documented, with output paths moved to a temporary directory, and the traces (`my.skvt`, and the
# committed smollm2 trace, whose full replays take minutes on 2 cores; plot_scripts_test replays
# that one) replaced by a small trace written first, and fewer steps for the synthetic replays.
# A command for the GPU only is checked to be refused cleanly (exit 2, naming the flags) when no
# GPU is usable; where a GPU runs it, it runs with two steps and no new point after a few seconds
# (the full runs are what scripts/gpu-bench-*.sh do). First, every command line in the docs must
# be listed here, so that a newly documented command cannot go untested.
#
# usage: documented_commands_test.sh SPARSEKV_TOOL
set -uo pipefail
tool=$1
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
failed=0

# The documented lines (their first line, as written), each covered by a run below.
covered=(
  "build/tools/sparsekv/sparsekv bench --sweep --page-tokens 1024 --json e2e.json --csv e2e.csv"
  "build/tools/sparsekv/sparsekv bench --contexts 32768 --miss-rate 0.05,0.2 --batch 16"
  "build/tools/sparsekv/sparsekv --version     # 0.1.0"
  "build/tools/sparsekv/sparsekv replay --trace my.skvt --hot-slots 4096,6144 --json replay.json"
  "build/tools/sparsekv/sparsekv plan --miss-rates 0.2 --contexts 32768,131072 --json plan.json \\"
  "sparsekv replay --trace bench/results/traces/smollm2-135m-gpl3.skvt --synthetic-like \\"
  "sparsekv replay --trace bench/results/traces/smollm2-135m-gpl3.skvt --policies lru \\"
  "sparsekv replay --synthetic-locality calibrated --hot-slots 2048,4096,8192 --policies lru"
  "sparsekv replay --synthetic-locality calibrated --cross-layer-overlap 0 --layer-overlap"
  "sparsekv replay --trace my.skvt --hot-slots 64,128,256 --policies lru --layer-overlap --fit-locality"
  "sparsekv bench --locality calibrated [--cross-layer-overlap 0.85]"
  "build/tools/sparsekv/sparsekv bench --contexts 32768 --batch 4 --miss-rate 0.2 --variants full-hbm,sparsekv --host-pool-gb 8 --trace-step trace.json"
  "sparsekv bench --backend cpu --config cache.json --batch 2 --context 8192 --steps 4 --warmup 1"
  "sparsekv plan --contexts 32768,131072 --miss-rates 0.064,0.2 --copy-chunk-rows 8 --crosslayer-prefetch --tier pcie-dram:250:55"
  "sparsekv replay --preset deepseek-v4-pro --context 1048320 [--synthetic-locality uncorrelated]"
)
while IFS= read -r line; do
  line="${line#"${line%%[![:space:]]*}"}"
  found=0
  for c in "${covered[@]}"; do [[ $line == "$c" ]] && found=1; done
  if ((!found)); then
    echo "documented but not tested here: $line" >&2
    failed=1
  fi
done < <(grep -hE '^\s*(build/tools/sparsekv/)?sparsekv (bench|plan|replay|multi-turn|pool|--[a-z])' "$root/README.md" "$root"/docs/*.md)

# No documented command writes over a committed result: a reader who runs it must not lose the
# file the docs quote (the commands write into the current directory instead).
if grep -nE '(--json|--csv|--out|--write-trace|--trace-step) +bench/results/' "$root/README.md" \
  "$root"/docs/*.md; then
  echo "documented commands above write into bench/results/ (write elsewhere)" >&2
  failed=1
fi

# The small trace: 4 layers x 64 steps, top-k 64, from the synthetic generator.
trace="$out/small.skvt"
"$tool" replay --layers 4 --steps 64 --context 4096 --top-k 64 --policies lru \
  --write-trace "$trace" >/dev/null || { echo "cannot write the small trace" >&2; exit 1; }

run() {  # run WHERE ARGS...: exits 0
  local where=$1
  shift
  if ! "$tool" "$@" >"$out/last.txt" 2>&1; then
    echo "FAILED ($where): sparsekv $*" >&2
    tail -n 20 "$out/last.txt" >&2
    failed=1
  fi
}

# What a GPU-only command gets on top of its documented flags. The CPU's refusal names every GPU-only
# flag given, so it still names the documented one.
gpu_scale_down=(--steps 2 --warmup 1 --time-limit 5)

gpu_only() {  # gpu_only WHERE FLAG ARGS...: refused with exit 2 naming FLAG, unless a GPU runs it
  local where=$1 flag=$2
  shift 2
  "$tool" "$@" "${gpu_scale_down[@]}" >"$out/last.txt" 2>&1
  local code=$?
  if ((code == 0)) && ! grep -q "CPU reference backend" "$out/last.txt"; then
    return  # a GPU ran it
  fi
  if ((code != 2)) || ! grep -q -- "$flag" "$out/last.txt"; then
    echo "FAILED ($where): sparsekv $* should be refused on the CPU naming $flag (exit $code)" >&2
    tail -n 20 "$out/last.txt" >&2
    failed=1
  fi
}

# README.md: scripts/demo.sh runs plain `sparsekv bench` (scaled down on the CPU), and the help.
# --steps and --warmup are read by both backends: on the CPU (scaled down already) they shorten it.
run "README.md (scripts/demo.sh)" bench --steps 2 --warmup 1
run "README.md" bench --help
# README.md, docs/install.md.
run "docs/install.md" --version
grep -qx "[0-9]*\.[0-9]*\.[0-9]*" "$out/last.txt" || { echo "--version printed: $(cat "$out/last.txt")" >&2; failed=1; }

# docs/benchmark.md: the GPU benchmark's two command lines.
gpu_only "docs/benchmark.md" --sweep bench --sweep --page-tokens 1024 --json "$out/e2e.json" \
  --csv "$out/e2e.csv"
gpu_only "docs/benchmark.md" --contexts bench --contexts 32768 --miss-rate 0.05,0.2 --batch 16
gpu_only "docs/benchmark.md" --trace-step bench --contexts 32768 --batch 4 --miss-rate 0.2 \
  --variants full-hbm,sparsekv --host-pool-gb 8 --trace-step "$out/trace.json"

# docs/planning.md.
run "docs/planning.md" replay --trace "$trace" --hot-slots 4096,6144 --json "$out/replay.json"
run "docs/planning.md" plan --miss-rates 0.2 --contexts 32768,131072 --json "$out/plan.json" \
  --calibration "$root/bench/results/2026-11-30-e2e-sweep/e2e-deepseek-v3.2.json" \
  --calibration "$root/bench/results/2026-11-30-e2e-sweep/e2e-glm-5.json"
run "docs/planning.md" replay --trace "$trace" --synthetic-like --json "$out/replay-smollm2.json"
run "docs/planning.md" plan
run "docs/planning.md" plan --contexts 32768,131072 --miss-rates 0.064,0.2 --copy-chunk-rows 8 \
  --crosslayer-prefetch --tier pcie-dram:250:55

# docs/prefetch.md.
run "docs/prefetch.md" replay --trace "$trace" --policies lru --hot-slots 64,128,256 \
  --prefetch window-exit,neighbours,evicted,dropped,combined --json "$out/prefetch-smollm2.json"

# docs/prefix-sharing.md.
run "docs/prefix-sharing.md" multi-turn --json "$out/multi_turn.json"
run "docs/prefix-sharing.md" multi-turn --preset deepseek-v4-pro --json "$out/multi_turn_v4.json"

# docs/workload.md (the synthetic replays at fewer steps: the defaults take minutes on 2 cores).
run "docs/workload.md" replay --synthetic-locality calibrated --hot-slots 2048,4096,8192 \
  --policies lru --steps 48 --warmup 16
run "docs/workload.md" replay --synthetic-locality calibrated --cross-layer-overlap 0 \
  --layer-overlap --steps 48 --warmup 16
run "docs/workload.md" replay --trace "$trace" --hot-slots 64,128,256 --policies lru \
  --layer-overlap --fit-locality
run "docs/workload.md" replay --preset deepseek-v4-pro --context 1048320 --steps 8 --warmup 2
run "docs/workload.md" replay --preset deepseek-v4-pro --context 1048320 --steps 8 --warmup 2 \
  --synthetic-locality uncorrelated
gpu_only "docs/workload.md" --locality bench --locality calibrated
gpu_only "docs/workload.md" --cross-layer-overlap bench --locality calibrated \
  --cross-layer-overlap 0.85

# docs/config.md: the bench over the page's complete config, as cache.json.
awk '/A complete config:/ {f = 1} f && /^```json/ {g = 1; next} g && /^```/ {exit} g' \
  "$root/docs/config.md" >"$out/cache.json"
run "docs/config.md" bench --backend cpu --config "$out/cache.json" --batch 2 --context 8192 \
  --steps 4 --warmup 1

# docs/scale-out.md's `sparsekv pool --node-id pool-a --control-plane 127.0.0.1:6379 ...` needs a
# Redis server and UCX; scale_out_test runs it (tools/sparsekv/pool/). Only its usage check here:
"$tool" pool >/dev/null 2>&1
(($? == 2)) || { echo "FAILED (docs/scale-out.md): sparsekv pool without --node-id should exit 2" >&2; failed=1; }

exit $failed
