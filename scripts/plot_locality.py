#!/usr/bin/env python3
"""Plots the calibrated top-k generator's LRU miss rate against the hot cache's size
(docs/workload.md), from `sparsekv replay --json` output.

usage: plot_locality.py [--out DIR] [--trace JSON] [--trace-preset JSON] CALIBRATED_JSON...

CALIBRATED_JSON: replays of `--synthetic-locality calibrated` (one per context); --trace: a
replay of the recorded SmolLM2 trace; --trace-preset: the `smollm2` preset at the trace's shape.
Slots are drawn in units of top-k so that the top-64 trace and the top-2048 curve share an axis.

Writes into DIR (default: the first JSON's folder):
  miss_rate_vs_slots.png  the fitted curve per context, the published GLM-5.1 points, the trace
                          and the smollm2 preset
  locality.json           the curves, the measured adjacent-layer overlaps and the summary keys
                          calibrated_miss_rate_{2048,4096,8192} (32K) and
                          crosslayer_overlap_smollm2
"""
import argparse
import json
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

# GLM-5.1, top-2048, LRU, as reported from the HiSparse paper (arXiv 2608.07009).
PUBLISHED = [(2048, 0.30), (4096, 0.134), (8192, 0.067)]
PUBLISHED_TOP_K = 2048


def load(path):
    with open(path) as f:
        return json.load(f)


def curve(replay):
    return [(p["hot_slots"], p["miss_rate"]) for p in replay["lru_miss_curve"]]


def context_of(replay):
    return json.loads(replay["metadata"])["context"]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out")
    parser.add_argument("--trace")
    parser.add_argument("--trace-preset")
    parser.add_argument("calibrated", nargs="+")
    args = parser.parse_args()
    out = args.out or os.path.dirname(os.path.abspath(args.calibrated[0]))
    os.makedirs(out, exist_ok=True)

    result = {"published": [{"hot_slots": s, "miss_rate": m} for s, m in PUBLISHED],
              "calibrated": {}, "summary": {}}
    fig, ax = plt.subplots(figsize=(7, 4.5))
    runs = sorted((load(p) for p in args.calibrated), key=context_of)
    for replay in runs:
        context = context_of(replay)
        top_k = replay["trace"]["top_k"]
        points = curve(replay)
        result["calibrated"][str(context)] = {
            "top_k": top_k, "lru_miss_curve": replay["lru_miss_curve"],
            "layer_overlap": replay.get("layer_overlap", {}).get("mean")}
        style = "-" if context == 32768 else ":"
        ax.plot([s / top_k for s, _ in points], [100 * m for _, m in points], style, marker="o",
                markersize=3, label=f"generator, glm5-published, {context // 1024}K")
        if context == 32768:
            for slots, miss in points:
                if slots in (2048, 4096, 8192):
                    result["summary"][f"calibrated_miss_rate_{slots}"] = miss
    ax.plot([s / PUBLISHED_TOP_K for s, _ in PUBLISHED], [100 * m for _, m in PUBLISHED], "k*",
            markersize=12, label="GLM-5.1 published (HiSparse)")
    for path, name, style in ((args.trace, "SmolLM2 trace (top-64, 2K)", "s-"),
                              (args.trace_preset, "generator, smollm2 preset", "x--")):
        if not path:
            continue
        replay = load(path)
        top_k = replay["trace"]["top_k"]
        points = curve(replay)
        ax.plot([s / top_k for s, _ in points], [100 * m for _, m in points], style,
                markersize=4, label=name)
        key = "smollm2_trace" if path == args.trace else "smollm2_preset"
        overlap = replay.get("layer_overlap", {})
        result[key] = {"top_k": top_k, "lru_miss_curve": replay["lru_miss_curve"],
                       "layer_overlap": overlap}
        if path == args.trace and "mean" in overlap:
            result["summary"]["crosslayer_overlap_smollm2"] = overlap["mean"]
    ax.set_xscale("log", base=2)
    ax.set_xlabel("hot slots per request and layer / top-k")
    ax.set_ylabel("LRU miss rate (%)")
    ax.set_title("Top-k locality: LRU miss rate vs hot-cache size")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "miss_rate_vs_slots.png"), dpi=120)
    with open(os.path.join(out, "locality.json"), "w") as f:
        json.dump(result, f, indent=2)
        f.write("\n")


if __name__ == "__main__":
    main()
