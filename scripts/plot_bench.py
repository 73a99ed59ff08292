#!/usr/bin/env python3
"""Plots the end-to-end benchmark's JSON (`sparsekv bench --json`, docs/benchmark.md).

usage: plot_bench.py [--out DIR] JSON [JSON...]

Writes three PNGs into DIR (default: the first JSON's folder):
  tpot_vs_batch.png     TPOT against batch at 16K and 32K, one panel per (context, miss rate),
                        every variant (log scales); the first JSON's preset
  peak_throughput.png   peak tokens/s per variant and context (sparsekv and page-offload at each
                        miss rate)
  hbm_per_request.png   HBM per request per variant and context
"""
import argparse
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

COLORS = {"full-hbm": "tab:blue", "sparsekv": "tab:green", "no-cache": "tab:red",
          "page-offload": "tab:orange"}


def label(point):
    rate = point.get("miss_rate_target")
    return point["variant"] if rate is None else f"{point['variant']} {rate:.0%}"


def plot_tpot(data, path):
    points = data["points"]
    contexts = [c for c in (16384, 32768) if any(p["context"] == c for p in points)]
    rates = sorted({p["miss_rate_target"] for p in points if p["miss_rate_target"] is not None})
    rates = rates or [None]
    if not contexts:
        return False
    fig, axes = plt.subplots(len(contexts), len(rates), squeeze=False,
                             figsize=(4.5 * len(rates), 3.6 * len(contexts)))
    for i, context in enumerate(contexts):
        for j, rate in enumerate(rates):
            ax = axes[i][j]
            for variant, color in COLORS.items():
                series = [p for p in points if p["context"] == context and p["variant"] == variant
                          and (p["miss_rate_target"] is None or p["miss_rate_target"] == rate)]
                series.sort(key=lambda p: p["batch"])
                if series:
                    ax.plot([p["batch"] for p in series], [p["tpot_ms"] for p in series], "o-",
                            color=color, label=variant)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")  # page-offload's steps are an order of magnitude longer
            ax.set_xlabel("batch")
            ax.set_ylabel("TPOT (ms)")
            title = f"{context // 1024}K" + (f", misses {rate:.0%}" if rate is not None else "")
            ax.set_title(title)
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=8)
    fig.suptitle(f"{data['preset']} on {data['device']} (proxy: {proxy_text(data)})", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def proxy_text(data):
    proxy = data["proxy"]
    return f"{proxy['weights_gb_per_step']:.0f} GB weights/step" if proxy["enabled"] else "off"


def peaks(data):
    """{(context, label): (tokens/s, batch)} over each series' batches."""
    best = {}
    for p in data["points"]:
        key = (p["context"], label(p))
        if key not in best or p["tokens_per_s"] > best[key][0]:
            best[key] = (p["tokens_per_s"], p["batch"])
    return best


def plot_bars(datasets, path, value, ylabel, title):
    fig, axes = plt.subplots(1, len(datasets), squeeze=False, figsize=(7 * len(datasets), 4))
    for ax, data in zip(axes[0], datasets):
        values = value(data)
        contexts = sorted({c for c, _ in values})
        labels = sorted({lab for _, lab in values})
        width = 0.8 / max(len(labels), 1)
        for k, lab in enumerate(labels):
            xs = [i + k * width for i, c in enumerate(contexts) if (c, lab) in values]
            ys = [values[(c, lab)][0] for c in contexts if (c, lab) in values]
            bars = ax.bar(xs, ys, width, label=lab)
            for bar, c in zip(bars, [c for c in contexts if (c, lab) in values]):
                extra = values[(c, lab)][1]
                if extra is not None:
                    ax.annotate(f"B={extra}", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                                ha="center", va="bottom", fontsize=6)
        ax.set_xticks([i + width * (len(labels) - 1) / 2 for i in range(len(contexts))])
        ax.set_xticklabels([f"{c // 1024}K" for c in contexts])
        ax.set_ylabel(ylabel)
        ax.set_title(f"{title}: {data['preset']}", fontsize=10)
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def hbm(data):
    out = {}
    for p in data["points"]:
        out[(p["context"], p["variant"])] = (p["hbm_bytes_per_request"] / 1e9, p["max_batch"])
    return out


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="folder for the PNGs")
    parser.add_argument("json", nargs="+")
    args = parser.parse_args(argv)
    datasets = []
    for path in args.json:
        with open(path) as f:
            datasets.append(json.load(f))
    datasets = [d for d in datasets if d.get("points")]
    if not datasets:
        print("plot_bench: no points to plot", file=sys.stderr)
        return 1
    out = args.out or os.path.dirname(os.path.abspath(args.json[0]))
    os.makedirs(out, exist_ok=True)
    written = []
    if plot_tpot(datasets[0], os.path.join(out, "tpot_vs_batch.png")):
        written.append("tpot_vs_batch.png")
    plot_bars(datasets, os.path.join(out, "peak_throughput.png"), peaks, "peak tokens/s",
              "peak decode throughput (B = batch of the peak)")
    written.append("peak_throughput.png")
    plot_bars(datasets, os.path.join(out, "hbm_per_request.png"), hbm, "GB per request",
              "HBM per request (B = max batch under the budget)")
    written.append("hbm_per_request.png")
    print("plot_bench: wrote " + ", ".join(written) + " to " + out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
