#!/usr/bin/env bash
# Compares the ways of copying one layer's misses (resolve_bench --strategies; docs/index-copy.md)
# at the points of the standard sweep that decide the defaults. On a GPU machine, from the
# repository root:
#   OUT=/some/dir bash scripts/gpu-bench-copy.sh
# Builds resolve_bench (Release, sm_90) unless COPY_BENCH_SKIP_BUILD=1, then runs, for every
# strategy, with the misses sorted as the library sorts them by default (from batch 32):
#   1. 32K context: batch 1, 8, 64, 100; 0% and 20% misses; 656- and 1152-B rows
#      ($OUT/copy-32k.json);
#   2. 128K context: batch 64, 20% misses, 656- and 1152-B rows ($OUT/copy-128k.json);
#   3. 32K, batch 1, 20% misses with the fused strategy held to batches of 32 or more, so that its
#      Resolve appends the misses and the IndexCopy copies them: what the fused kernel costs where
#      it does not copy ($OUT/copy-b1-threshold.json).
#   4. the library's copy over one pool span for every point (--span_gib 14.1, what 128K x batch
#      100 x 1152 B needs): contexts 32K and 128K, batch 1, 8, 64, 100, 0/20/40% misses, 656- and
#      1152-B rows ($OUT/copy-span.json), then scripts/copy_span_summary.py: every point's multiple
#      of the floor beside SGLang HiSparse's kernel where it was measured over the same span
#      ($OUT/copy-span-summary.json; resolve_copy_span_to_floor_over_peer_max <= 1: at or past it).
# It prints a compact table (resolve + copy in µs and × the PCIe floor, per strategy) and writes
# everything printed to $OUT/copy.txt and the summary keys to $OUT/copy-summary.json. Every
# benchmark checks its results against the CPU reference; "WRONG" in the table marks a failure.
#
# Environment (all optional):
#   COPY_BENCH_STRATEGIES   strategies (library,separate,separate8,warp,bulk,fused,fused_nosort)
#   COPY_BENCH_REPS         timed replays per point (20)
#   COPY_BENCH_BUILD_DIR    build directory (build-gpu; configured here if it has no CMakeCache.txt)
#   COPY_BENCH_SKIP_BUILD=1 use the resolve_bench already built there
set -u -o pipefail

# shellcheck source=scripts/gpu-common.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-common.sh"
gpu_out gpu-bench-copy-out
BUILD=${COPY_BENCH_BUILD_DIR:-build-gpu}
STRATEGIES=${COPY_BENCH_STRATEGIES:-library,separate,separate8,warp,bulk,fused,fused_nosort}
REPS=${COPY_BENCH_REPS:-20}

main() {
  local failed=0
  gpu_banner gpu-bench-copy " in $ROOT, results in $OUT"
  nvidia-smi -L
  gpu_tree
  if [[ ${COPY_BENCH_SKIP_BUILD:-0} != 1 ]]; then
    if [[ ! -f $BUILD/CMakeCache.txt ]]; then
      gpu_configure "$BUILD" "$OUT/build.log" -DSPARSEKV_BUILD_TOOLS=OFF \
        -DSPARSEKV_BUILD_TESTS=OFF || {
        tail -n 30 "$OUT/build.log"
        return 1
      }
    fi
    echo "=== build resolve_bench ($(date +%T))"
    gpu_build_targets "$BUILD" "$OUT/build.log" resolve_bench || {
      tail -n 30 "$OUT/build.log"
      return 1
    }
  fi
  local bench=$BUILD/bench/resolve_bench common=(--strategies "$STRATEGIES" --reps "$REPS")
  rm -f "$OUT"/copy-*.json

  echo "=== 32K context ($(date +%T))"
  timeout -k 10 150 "$bench" "${common[@]}" --contexts 32768 --batches 1,8,64,100 \
    --miss_rates 0,0.2 --row_bytes 656,1152 --json "$OUT/copy-32k.json" || failed=1
  echo "=== 128K context, batch 64 ($(date +%T))"
  timeout -k 10 90 "$bench" "${common[@]}" --contexts 131072 --batches 64 --miss_rates 0.2 \
    --row_bytes 656,1152 --json "$OUT/copy-128k.json" || failed=1
  echo "=== batch 1, fused held to batches >= 32 ($(date +%T))"
  timeout -k 10 60 "$bench" --strategies separate,fused --fused_min_batch 32 --reps "$REPS" \
    --contexts 32768 --batches 1 --miss_rates 0.2 --row_bytes 656,1152 \
    --json "$OUT/copy-b1-threshold.json" || failed=1

  echo "=== one 14.1 GiB span for every point ($(date +%T))"
  timeout -k 10 240 "$bench" --strategies library --reps "$REPS" --span_gib 14.1 \
    --contexts 32768,131072 --batches 1,8,64,100 --miss_rates 0,0.2,0.4 --row_bytes 656,1152 \
    --json "$OUT/copy-span.json" || failed=1
  python3 "$ROOT/scripts/copy_span_summary.py" --out "$OUT/copy-span-summary.json" \
    "$OUT/copy-span.json" || failed=1

  python3 - "$OUT" <<'PY' || failed=1
import json, pathlib, sys

out = pathlib.Path(sys.argv[1])
failed = False
runs = ["copy-32k.json", "copy-128k.json", "copy-b1-threshold.json"]
summary = {}
for name in runs:
    path = out / name
    if not path.exists():
        print(f"{name}: missing")
        continue
    data = json.loads(path.read_text())
    config = data["config"]
    print(f"\n{name}: {data['device']}, sort_misses={int(config['sort_misses'])} from batch "
          f"{config['sort_min_batch']}, fused_min_batch {config['fused_min_batch']}; "
          f"µs of resolve + copy (x PCIe floor), medians of {config['reps']} graph replays")
    strategies = config["strategies"].split(",")
    points = {}
    for r in data["results"]:
        key = (r["context"], r["batch"], r["miss_rate"], r["row_bytes"])
        points.setdefault(key, {})[r["strategy"]] = r
    header = f"{'ctx':>6} {'B':>4} {'miss':>4} {'row':>5} {'resolve':>8}"
    print(header + "".join(f" {s:>18}" for s in strategies))
    for (ctx, batch, rate, row), by in sorted(points.items()):
        first = next(iter(by.values()))
        line = f"{ctx // 1024:>5}K {batch:>4} {rate:>4.2f} {row:>5} {first['resolve']['median_ms'] * 1e3:>8.1f}"
        for s in strategies:
            r = by.get(s)
            if r is None:
                line += f" {'-':>18}"
                continue
            us = r["resolve_copy"]["median_ms"] * 1e3
            ratio = r["time_to_floor"]
            cell = f"{us:.1f}" + (f" ({ratio:.2f}x)" if ratio is not None else "")
            if not r["verified"]:
                cell += " WRONG"
            line += f" {cell:>18}"
        print(line)
    # Each run sets the keys of its points (the others are null there); the threshold run's
    # fused key is renamed.
    for key, value in data["summary"].items():
        if value is None:
            continue
        if name == "copy-b1-threshold.json":
            if key.startswith("resolve_copy_us_b1_m20_fused"):
                summary[key.replace("_fused", "_fused_from_b32")] = value
        else:
            summary[key] = value
    wrong = data["wrong_results"]
    if wrong["count"]:
        print(f"WRONG RESULTS in {name}: {wrong['count']}, first: {wrong['first'][:3]}")
        failed = True
(out / "copy-summary.json").write_text(json.dumps(summary, indent=1, sort_keys=True) + "\n")
print("\nsummary keys (copy-summary.json):")
for key in sorted(summary):
    value = summary[key]
    print(f"  {key:<48} {value:.4g}" if isinstance(value, float) else f"  {key:<48} {value}")
sys.exit(1 if failed else 0)
PY
  if ((failed)); then echo "gpu-bench-copy: FAILED"; else echo "gpu-bench-copy: ok"; fi
  return "$failed"
}

gpu_main "$OUT/copy.txt"
