#!/usr/bin/env python3
"""Plots `sparsekv plan --json` output: TPOT and throughput vs batch per tier at each context, the
best throughput per tier across contexts, and (with --calibration) predicted vs measured TPOT.

usage: plot_plan.py [--out DIR] PLAN.json      (needs matplotlib)
"""
import argparse
import json
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def copies(plan):
    """How the plan treats the copies: `hidden_fraction` (older outputs: a boolean `overlap`)."""
    if "hidden_fraction" in plan:
        h = plan["hidden_fraction"]
        return "serial copies" if h == 0 else f"{h:.0%} of the transfer hidden"
    return "overlapped copies" if plan.get("overlap") else "serial copies"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("plan")
    ap.add_argument("--out", default=".")
    args = ap.parse_args()
    with open(args.plan) as f:
        plan = json.load(f)
    os.makedirs(args.out, exist_ok=True)
    cases = plan["cases"]
    contexts = sorted({c["context"] for c in cases})
    tiers = list(dict.fromkeys(c["tier"] for c in cases))

    fig, axes = plt.subplots(2, len(contexts), figsize=(3.2 * len(contexts), 6.5), squeeze=False)
    for i, ctx in enumerate(contexts):
        for c in (c for c in cases if c["context"] == ctx):
            label = c["tier"] + ("" if c["miss_rate"] is None else f" m={c['miss_rate']:g}")
            b = [p["batch"] for p in c["points"]]
            axes[0][i].plot(b, [p["tpot_ms"] for p in c["points"]], marker=".", label=label)
            axes[1][i].plot(b, [p["tokens_per_s"] for p in c["points"]], marker=".", label=label)
        if plan["tpot_slo_ms"] > 0:
            axes[0][i].axhline(plan["tpot_slo_ms"], color="grey", linestyle=":")
        axes[0][i].set_title(f"context {ctx // 1024}K")
        for ax in (axes[0][i], axes[1][i]):
            ax.set_xscale("log", base=2)
            ax.grid(alpha=0.3)
        axes[1][i].set_xlabel("batch")
    axes[0][0].set_ylabel("TPOT (ms)")
    axes[1][0].set_ylabel("tokens/s per GPU")
    axes[0][-1].legend(fontsize=7)
    fig.suptitle(f"sparsekv plan, {plan['preset']}: model, not measurement ({copies(plan)})")
    fig.tight_layout()
    fig.savefig(os.path.join(args.out, "plan_tpot_throughput.png"), dpi=110)

    fig, ax = plt.subplots(figsize=(7, 4))
    for tier in tiers:
        pts = [(c["context"], c["best"]["tokens_per_s"] if c["best"] else 0)
               for c in cases if c["tier"] == tier]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=tier)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("context (tokens)")
    ax.set_ylabel(f"best tokens/s per GPU (TPOT <= {plan['tpot_slo_ms']:g} ms)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(args.out, "plan_tiers_vs_context.png"), dpi=110)

    if "check" in plan:
        fig, ax = plt.subplots(figsize=(5, 5))
        for variant in ("full-hbm", "sparsekv", "no-cache"):
            pts = [p for p in plan["check"]["points"] if p["variant"] == variant]
            ax.scatter([p["measured_tpot_ms"] for p in pts], [p["predicted_tpot_ms"] for p in pts],
                       s=12, label=variant)
        top = max(p["measured_tpot_ms"] for p in plan["check"]["points"]) * 1.05
        ax.plot([0, top], [0, top], color="grey", linewidth=0.8)
        ax.plot([0, top], [0, top * 1.15], color="grey", linestyle=":", linewidth=0.8)
        ax.plot([0, top], [0, top * 0.85], color="grey", linestyle=":", linewidth=0.8)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("measured TPOT on H200 (ms)")
        ax.set_ylabel("predicted TPOT (ms)")
        ax.set_title(f"max |error| {plan['check']['max_abs_error_pct']:.1f}%, "
                     f"median {plan['check']['median_abs_error_pct']:.1f}%")
        ax.legend()
        fig.tight_layout()
        fig.savefig(os.path.join(args.out, "plan_calibration.png"), dpi=110)


if __name__ == "__main__":
    main()
