#!/usr/bin/env python3
"""Merges benchmark summary keys into one summary JSON file, keeping the keys already there.

usage: merge_summary.py [--keys PATTERN[,PATTERN...]|SET] OUTPUT INPUT [INPUT...]

Each INPUT is either a benchmark's JSON output (its "summary" object is merged) or a flat summary
file (all of its top-level keys are merged), so the same script collects a run's benchmarks into
$OUT/summary.json and later merges that file into bench/results/summary.json. A key set by an
input replaces the same key in OUTPUT; every other key of OUTPUT is kept. A missing or unreadable
input is reported and skipped, and the exit status is then 1. Prints the merged keys last.
With --keys, only the inputs' keys that match one of the shell-style patterns are merged (e.g.
'e2e_throughput_ratio_vs_full_hbm_*k_calibrated': DeepSeek-V3.2's and GLM-5.3's calibrated ratios,
without the keys a run of one context would set for every context). --keys may instead name a
set of patterns (KEY_SETS): "v4pro" is DeepSeek-V4-Pro's ratio per context, the same points'
ideal ratio and its minimum ratio (scripts/gpu-bench-e2e.sh v4pro), without its "_calibrated"
duplicates.
"""
import fnmatch
import json
import os
import sys


KEY_SETS = {
    "v4pro": [
        "e2e_throughput_ratio_vs_full_hbm_v4pro_*[km]",
        "e2e_ideal_ratio_vs_full_hbm_v4pro_*[km]",
        "e2e_min_ratio_vs_full_hbm_v4pro",
    ],
}


def load(path):
    with open(path) as f:
        return json.load(f)


def main(argv):
    args = argv[1:]
    patterns = None
    if args and args[0] == "--keys":
        if len(args) < 2:
            print(__doc__.strip(), file=sys.stderr)
            return 2
        patterns = KEY_SETS.get(args[1]) or [p for p in args[1].split(",") if p]
        args = args[2:]
    if len(args) < 2:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    out_path, inputs = args[0], args[1:]
    merged = load(out_path) if os.path.exists(out_path) else {}
    ok = True
    for path in inputs:
        try:
            data = load(path)
        except (OSError, ValueError) as e:
            print(f"merge_summary: skipping {path}: {e}", file=sys.stderr)
            ok = False
            continue
        summary = data.get("summary", data)
        if not isinstance(summary, dict):
            print(f"merge_summary: skipping {path}: no summary object", file=sys.stderr)
            ok = False
            continue
        if patterns is not None:
            summary = {k: v for k, v in summary.items()
                       if any(fnmatch.fnmatchcase(k, p) for p in patterns)}
        merged.update(summary)
    os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
    tmp = out_path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(merged, f, indent=2, sort_keys=True)
        f.write("\n")
    os.replace(tmp, out_path)
    width = max((len(k) for k in merged), default=0)
    for key in sorted(merged):
        value = merged[key]
        text = f"{value:.4g}" if isinstance(value, float) else json.dumps(value)
        print(f"  {key:<{width}}  {text}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
