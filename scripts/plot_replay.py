#!/usr/bin/env python3
"""Plots `sparsekv replay --json` output: hit rate vs hot-cache size per policy, hit rate per
layer, and hit rate per step (lru and the best policy, at the reference cache size).

usage: plot_replay.py [--out DIR] [--name NAME] REPLAY.json   (needs matplotlib)
"""
import argparse
import json
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("replay")
    ap.add_argument("--out", default=".")
    ap.add_argument("--name", default="replay")
    args = ap.parse_args()
    with open(args.replay) as f:
        replay = json.load(f)
    os.makedirs(args.out, exist_ok=True)
    traces = [("trace", replay["trace"])]
    if "synthetic_like" in replay:
        traces.append(("synthetic (fitted)", replay["synthetic_like"]))
    ref = replay["summary"]["replay_reference_hot_slots"]
    best = replay["summary"]["replay_best_policy"]

    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for title, t in traces:
        style = "-" if title == "trace" else "--"
        policies = list(dict.fromkeys(r["policy"] for r in t["results"]))
        for pol in policies:
            rs = [r for r in t["results"] if r["policy"] == pol]
            axes[0].plot([r["hot_slots"] / t["top_k"] for r in rs], [r["hit_rate"] for r in rs],
                         style, marker="o", label=f"{pol} ({title})")
        for r in t["results"]:
            if r["hot_slots"] == ref and r["policy"] in ("lru", best):
                axes[1].plot(r["layer_hit_rate"], style, marker=".", label=f"{r['policy']} ({title})")
                axes[2].plot(r["step_hit_rate"], style, linewidth=0.8,
                             label=f"{r['policy']} ({title})")
    axes[0].set_xlabel("hot slots / top-k")
    axes[0].set_ylabel("hit rate")
    axes[1].set_xlabel("layer")
    axes[1].set_ylabel(f"hit rate at {ref} slots")
    axes[2].set_xlabel("decode step")
    axes[2].set_ylabel(f"hit rate at {ref} slots")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"sparsekv replay: {replay['source']}")
    fig.tight_layout()
    fig.savefig(os.path.join(args.out, f"{args.name}.png"), dpi=110)


if __name__ == "__main__":
    main()
