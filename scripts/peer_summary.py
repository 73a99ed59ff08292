#!/usr/bin/env python3
"""TPOT with misses read from a peer GPU against TPOT with misses read from host memory.

usage: peer_summary.py HOST_JSON PEER_JSON OUT_JSON [PLOT_PNG]

HOST_JSON and PEER_JSON are `sparsekv bench --json` reports of the same sweep, without and with
--peer-device. For every (context, miss-rate target) of sparsekv's points found in both, at the
largest batch both measured, writes
  e2e_tpot_reduction_peer_vs_host_<ctx>k_m<pct> = 1 - TPOT(peer) / TPOT(host)
(and the batch and both TPOTs beside it) into OUT_JSON's "summary", with every common point in
"points". When the peer run's notes say its region was on the decode GPU itself (a same-GPU
stand-in, which measures no peer link), every key ends in _same_gpu and the plot says so. With PLOT_PNG (and matplotlib), plots TPOT against batch, host memory against the peer,
one panel per context and miss rate.
"""
import json
import sys


def points(path):
    with open(path) as f:
        report = json.load(f)
    out = {}
    for p in report.get("points", []):
        if p.get("variant") != "sparsekv" or p.get("miss_rate_target") is None:
            continue
        out[(p["context"], round(p["miss_rate_target"], 4), p["batch"])] = p["tpot_ms"]
    return out, report.get("notes", [])


def main(argv):
    if len(argv) not in (4, 5):
        print(__doc__.strip(), file=sys.stderr)
        return 2
    host, _ = points(argv[1])
    peer, notes = points(argv[2])
    same_gpu = any("same-GPU stand-in" in n for n in notes)
    suffix = "_same_gpu" if same_gpu else ""
    common = sorted(set(host) & set(peer))
    summary, rows, series = {}, [], {}
    for ctx, miss, batch in common:
        rows.append({"context": ctx, "miss_rate_target": miss, "batch": batch,
                     "tpot_host_ms": host[(ctx, miss, batch)],
                     "tpot_peer_ms": peer[(ctx, miss, batch)]})
        series.setdefault((ctx, miss), []).append(rows[-1])
    for (ctx, miss), rs in sorted(series.items()):
        last = max(rs, key=lambda r: r["batch"])
        key = "e2e_tpot_reduction_peer_vs_host_%dk_m%d%s" % (ctx // 1024, round(miss * 100), suffix)
        summary[key] = 1 - last["tpot_peer_ms"] / last["tpot_host_ms"]
        summary[key + "_batch"] = last["batch"]
        print("%s = %.3f (batch %d: host %.2f ms, peer %.2f ms)" %
              (key, summary[key], last["batch"], last["tpot_host_ms"], last["tpot_peer_ms"]))
    if not common:
        print("peer_summary: no common sparsekv points", file=sys.stderr)
    with open(argv[3], "w") as f:
        json.dump({"summary": summary, "points": rows, "same_gpu": same_gpu,
                   "peer_run_notes": notes}, f, indent=1)
        f.write("\n")
    if len(argv) == 5 and series:
        try:
            import matplotlib
            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            print("peer_summary: no matplotlib, no plot", file=sys.stderr)
            return 0 if common else 1
        keys = sorted(series)
        fig, axes = plt.subplots(1, len(keys), figsize=(4.5 * len(keys), 3.6), squeeze=False)
        for ax, key in zip(axes[0], keys):
            rs = sorted(series[key], key=lambda r: r["batch"])
            b = [r["batch"] for r in rs]
            ax.plot(b, [r["tpot_host_ms"] for r in rs], "o-", label="misses from host DRAM (PCIe)")
            peer_label = ("misses from a region on the same GPU (stand-in, no peer link)"
                          if same_gpu else "misses from a peer GPU")
            ax.plot(b, [r["tpot_peer_ms"] for r in rs], "s-", label=peer_label)
            ax.set_title("%dK context, %d%% misses" % (key[0] // 1024, round(key[1] * 100)))
            ax.set_xlabel("batch")
            ax.set_ylabel("TPOT (ms)")
            ax.grid(alpha=0.3)
        axes[0][0].legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(argv[4], dpi=120)
    return 0 if common else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
