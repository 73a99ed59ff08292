#!/usr/bin/env python3
"""The hit-rate table of scripts/v4-entry-replay.sh: one row per preset, context and policy, a
column per workload, from the JSON files `sparsekv replay --json` wrote into the folder given."""
import json
import pathlib
import sys

LABELS = {131072: "128K", 262144: "256K", 524288: "512K", 1048576: "1M"}


def main(folder):
    runs = {}
    for path in sorted(pathlib.Path(folder).glob("deepseek-v4-*.json")):
        preset, context, workload = path.stem.rsplit("-", 2)
        runs[(preset, int(context), workload)] = json.loads(path.read_text())
    print("| preset | context (entries) | hot slots | policy | hit rate, calibrated | "
          "hit rate, uncorrelated | (C + 1) / entries |")
    print("|---|---|---|---|---|---|---|")
    for preset in ("deepseek-v4-pro", "deepseek-v4-flash"):
        for context, label in LABELS.items():
            calibrated = runs.get((preset, context, "calibrated"))
            uncorrelated = runs.get((preset, context, "uncorrelated"))
            if calibrated is None or uncorrelated is None:
                continue
            worst = {r["policy"]: r for r in uncorrelated["trace"]["results"]}
            history = uncorrelated["summary"]["uncorrelated_mean_history"]
            for r in calibrated["trace"]["results"]:
                u = worst[r["policy"]]
                expected = min(1.0, (r["hot_slots"] + 1) / history)
                print(f"| {preset} | {label} ({context // 4}) | {r['hot_slots']} | "
                      f"{r['policy']} | {r['hit_rate']:.4f} | {u['hit_rate']:.4f} | "
                      f"{expected:.4f} |")


if __name__ == "__main__":
    main(sys.argv[1])
