#!/usr/bin/env bash
# The documented plot steps, end to end (a ctest): `sparsekv plan --json` and `sparsekv replay
# --json` on this machine, then scripts/plot_plan.py and scripts/plot_replay.py on their output,
# and scripts/plot_bench.py on a committed GPU benchmark JSON (the CPU bench writes no sweep).
# Each must write its PNGs. Exits 77 (skipped) when matplotlib is missing.
#
# usage: plot_scripts_test.sh SPARSEKV_TOOL
set -euo pipefail
tool=$1
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# The first python3 that has matplotlib: PATH's, else Debian's (python3-matplotlib).
python=""
for candidate in python3 /usr/bin/python3; do
  if "$candidate" -c 'import matplotlib' 2>/dev/null; then
    python=$candidate
    break
  fi
done
if [[ -z $python ]]; then
  echo "matplotlib is not installed (scripts/install-deps.sh installs python3-matplotlib)"
  exit 77
fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

expect() {  # expect FILE...: each exists and is not empty
  for f in "$@"; do
    [[ -s "$out/$f" ]] || { echo "missing: $f" >&2; exit 1; }
  done
}

"$tool" plan --json "$out/plan.json" >/dev/null
"$python" "$root/scripts/plot_plan.py" --out "$out/plain" "$out/plan.json"
expect plain/plan_tpot_throughput.png plain/plan_tiers_vs_context.png

# As docs/planning.md runs it: calibrated, with the predicted-vs-measured check.
"$tool" plan --miss-rates 0.2 --contexts 32768,131072 --json "$out/plan-cal.json" \
  --calibration "$root/bench/results/2026-11-30-e2e-sweep/e2e-deepseek-v3.2.json" \
  --calibration "$root/bench/results/2026-11-30-e2e-sweep/e2e-glm-5.json" >/dev/null
"$python" "$root/scripts/plot_plan.py" --out "$out/cal" "$out/plan-cal.json"
expect cal/plan_tpot_throughput.png cal/plan_tiers_vs_context.png cal/plan_calibration.png

"$tool" replay --trace "$root/bench/results/traces/smollm2-135m-gpl3.skvt" \
  --json "$out/replay.json" >/dev/null
"$python" "$root/scripts/plot_replay.py" --out "$out/replay" "$out/replay.json"
[[ -n "$(find "$out/replay" -name '*.png')" ]] || { echo "plot_replay.py wrote no PNG" >&2; exit 1; }

"$tool" replay --synthetic-locality calibrated --layers 2 --steps 32 --warmup 8 --context 4096 \
  --top-k 128 --hot-slots 128,256,512 --policies lru --window-split 0 --layer-overlap \
  --json "$out/locality.json" >/dev/null
"$python" "$root/scripts/plot_locality.py" --out "$out/locality" "$out/locality.json"
expect locality/miss_rate_vs_slots.png locality/locality.json

"$python" "$root/scripts/plot_bench.py" --out "$out/bench" "$root/bench/results/2026-11-30-e2e-sweep/e2e-deepseek-v3.2.json"
expect bench/tpot_vs_batch.png bench/peak_throughput.png bench/hbm_per_request.png
echo "plot scripts: plan, calibrated plan, replay, locality and bench plots written"
