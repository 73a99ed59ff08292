#!/usr/bin/env python3
"""Where one decode step's time goes: reads `sparsekv bench --trace-step` JSON (docs/benchmark.md,
"Profile a step") and prints, per traced point, the step's figures and a table of its kernels,
copies and memsets averaged per layer.

usage: step_profile.py [--point KEY ...] [--full-names] [--timeline DIR] TRACE_JSON

Per point: the traced step's span (first start to last end; the timed TPOT beside it), the busy
time of the main stream (the one the step is launched on), its gaps (idle time between its
consecutive kernels, and how much of it a side stream was running), the side streams' busy time
split into hidden (while the main stream was busy) and exposed (while it was not). Then one row per
name: the streams it ran on (main, side, main+side; "?" for nodes captured outside the trace's
view), count per step and per layer, microseconds per step and per layer, share of the step's span
(rows can sum past 100% where streams overlap), and of its side-stream time, the hidden and exposed
microseconds per layer. Everything is computed from the records, with the same definitions as the
summary the tool writes beside them.

--point KEY      only the points whose key ("sparsekv/32768/4/0.2") starts with KEY (repeatable)
--full-names     kernel names as demangled (default: without namespaces, return type, arguments)
--timeline DIR   also draw each point's step as DIR/<key>.png, one row per stream (matplotlib)

Python 3.11 standard library only (matplotlib for --timeline).
"""
import argparse
import json
import os
import sys

FORMAT = "sparsekv step trace 1"
MAIN = 0


def merge(intervals):
    """Sorted, disjoint [start, end) intervals covering the same time (touching ones merge)."""
    out = []
    for start, end in sorted(intervals):
        if out and start <= out[-1][1]:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return out


def measure(merged):
    return sum(end - start for start, end in merged)


def intersection(a, b):
    """|a ∩ b| for two merged lists."""
    total, i, j = 0, 0, 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        total += max(0, hi - lo)
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def valid(record):
    start, end = record.get("start_ns"), record.get("end_ns")
    return start is not None and end is not None and end >= start


def summarize(records):
    """The step's figures (in µs) and per-name totals, as the tool's summary defines them."""
    timed = [r for r in records if valid(r)]
    lane = lambda r: r.get("lane", -1)  # noqa: E731
    all_ = merge([r["start_ns"], r["end_ns"]] for r in timed)
    main = merge([r["start_ns"], r["end_ns"]] for r in timed if lane(r) == MAIN)
    side = merge([r["start_ns"], r["end_ns"]] for r in timed if lane(r) > MAIN)
    gaps = [[main[k - 1][1], main[k][0]] for k in range(1, len(main))]
    span = all_[-1][1] - all_[0][0] if all_ else 0
    hidden = intersection(side, main)
    s = {
        "records": len(timed),
        "invalid_records": len(records) - len(timed),
        "unknown_lane_records": sum(1 for r in timed if lane(r) < MAIN),
        "span_us": span / 1e3,
        "idle_us": (span - measure(all_)) / 1e3,
        "main_busy_us": measure(main) / 1e3,
        "side_busy_us": measure(side) / 1e3,
        "hidden_us": hidden / 1e3,
        "exposed_us": (measure(side) - hidden) / 1e3,
        "main_gaps": len(gaps),
        "main_gap_us": measure(gaps) / 1e3,
        "main_gap_max_us": max((e - b for b, e in gaps), default=0) / 1e3,
        "main_gap_side_us": intersection(gaps, side) / 1e3,
    }
    names = {}
    for r in timed:
        n = names.setdefault(r["name"], {"name": r["name"], "kind": r["kind"], "count": 0,
                                         "main_count": 0, "side_count": 0, "total_us": 0.0,
                                         "main_us": 0.0, "side_us": 0.0, "unknown_us": 0.0,
                                         "hidden_us": 0.0, "exposed_us": 0.0})
        us = (r["end_ns"] - r["start_ns"]) / 1e3
        n["count"] += 1
        n["total_us"] += us
        if lane(r) == MAIN:
            n["main_count"] += 1
            n["main_us"] += us
        elif lane(r) > MAIN:
            n["side_count"] += 1
            n["side_us"] += us
            covered = intersection([[r["start_ns"], r["end_ns"]]], main) / 1e3
            n["hidden_us"] += covered
            n["exposed_us"] += us - covered
        else:
            n["unknown_us"] += us
    s["names"] = sorted(names.values(), key=lambda n: (-n["total_us"], n["name"]))
    return s


def short_name(name):
    """`void ns::(anonymous namespace)::Kernel<true, 4>(View, int)` -> `Kernel<true, 4>`."""
    if name.endswith(")"):  # the argument list: from its matching "("
        depth = 0
        for i in range(len(name) - 1, -1, -1):
            depth += {")": 1, "(": -1}.get(name[i], 0)
            if depth == 0:
                name = name[:i]
                break
    if name.startswith("void "):
        name = name[len("void "):]
    depth, cut = 0, 0
    for i, ch in enumerate(name):  # the last "::" outside template arguments and parentheses
        if ch in "<(":
            depth += 1
        elif ch in ">)":
            depth -= 1
        elif depth == 0 and name.startswith("::", i):
            cut = i + 2
    return name[cut:] or name


def streams(n):
    roles = [role for role, count in (("main", n["main_count"]), ("side", n["side_count"])) if count]
    if n["count"] > n["main_count"] + n["side_count"]:
        roles.append("?")
    return "+".join(roles)


def describe(point):
    rate = point.get("miss_rate_target")
    return (f"{point['variant']}, context {point['context']}, batch {point['batch']}"
            + ("" if rate is None else f", {rate:.0%} misses"))


def report(point, layers, full_names, out):
    s = summarize(point["records"])
    span = s["span_us"]
    pct = lambda us: 100 * us / span if span > 0 else 0.0  # noqa: E731
    per = lambda v: v / layers  # noqa: E731
    print(f"== {point['key']}: {describe(point)}", file=out)
    print(f"   traced step {span / 1e3:.3f} ms (timed TPOT {point['tpot_ms']:.3f} ms) over "
          f"{layers} layers: {per(span):.1f} us per layer; {s['records']} records"
          + (f", {s['unknown_lane_records']} of unknown stream" if s["unknown_lane_records"] else "")
          + (f", {s['invalid_records']} without timestamps" if s["invalid_records"] else "")
          + (f", {point['dropped_records']} dropped" if point.get("dropped_records") else ""),
          file=out)
    print(f"   main stream busy {s['main_busy_us'] / 1e3:.3f} ms ({pct(s['main_busy_us']):.1f}%), "
          f"{s['main_gaps']} gaps {s['main_gap_us'] / 1e3:.3f} ms ({pct(s['main_gap_us']):.1f}%, "
          f"largest {s['main_gap_max_us']:.1f} us, a side stream running in "
          f"{s['main_gap_side_us'] / 1e3:.3f} ms of them)", file=out)
    print(f"   side streams busy {s['side_busy_us'] / 1e3:.3f} ms: hidden "
          f"{s['hidden_us'] / 1e3:.3f} ms, exposed {s['exposed_us'] / 1e3:.3f} ms; GPU idle "
          f"{s['idle_us'] / 1e3:.3f} ms", file=out)
    rows = [("name", "streams", "n/step", "n/layer", "us/step", "us/layer", "% step",
             "hidden us/layer", "exposed us/layer")]
    for n in s["names"]:
        name = n["name"] if full_names else short_name(n["name"])
        side = n["side_count"] > 0
        rows.append((name, streams(n), f"{n['count']}", f"{per(n['count']):.2f}",
                     f"{n['total_us']:.1f}", f"{per(n['total_us']):.2f}",
                     f"{pct(n['total_us']):.1f}",
                     f"{per(n['hidden_us']):.2f}" if side else "-",
                     f"{per(n['exposed_us']):.2f}" if side else "-"))
    width = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    if not full_names:
        width[0] = min(width[0], 60)
    for r in rows:
        name = r[0] if len(r[0]) <= width[0] else r[0][:width[0] - 3] + "..."
        print("   " + name.ljust(width[0]) + "  " + r[1].ljust(width[1]) + "  "
              + "  ".join(c.rjust(w) for c, w in zip(r[2:], width[2:])), file=out)
    return s


def timeline(point, path, full_names):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = [r for r in point["records"] if valid(r)]
    lanes = sorted({r.get("lane", -1) for r in records}, key=lambda l: (l < 0, l))
    totals = summarize(records)["names"]
    top = [n["name"] for n in totals[:9]]
    colors = {name: f"C{i}" for i, name in enumerate(top)}
    fig, ax = plt.subplots(figsize=(14, 1.0 + 0.6 * max(1, len(lanes))))
    for row, lane in enumerate(lanes):
        for name in top + [None]:
            bars = [(r["start_ns"] / 1e3, (r["end_ns"] - r["start_ns"]) / 1e3) for r in records
                    if r.get("lane", -1) == lane and (r["name"] == name if name else r["name"] not in colors)]
            if bars:
                ax.broken_barh(bars, (row - 0.4, 0.8), color=colors.get(name, "0.6"))
    ax.set_yticks(range(len(lanes)))
    ax.set_yticklabels(["main" if l == MAIN else ("?" if l < 0 else f"side {l}") for l in lanes])
    ax.invert_yaxis()
    ax.set_xlabel("us from the step's first record")
    ax.set_title(f"{point['key']}: {describe(point)}")
    handles = [plt.Rectangle((0, 0), 1, 1, color=colors[n]) for n in top]
    labels = [(n if full_names else short_name(n))[:50] for n in top]
    if handles:
        ax.legend(handles + [plt.Rectangle((0, 0), 1, 1, color="0.6")], labels + ["other"],
                  loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None, out=sys.stdout):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace")
    parser.add_argument("--point", action="append", default=[])
    parser.add_argument("--full-names", action="store_true")
    parser.add_argument("--timeline", metavar="DIR")
    args = parser.parse_args(argv)
    with open(args.trace) as f:
        data = json.load(f)
    if data.get("format") != FORMAT:
        print(f"step_profile: {args.trace}: not a step trace ({FORMAT!r} expected)", file=sys.stderr)
        return 2
    points = [p for p in data["points"]
              if not args.point or any(p["key"].startswith(k) for k in args.point)]
    if not points:
        keys = ", ".join(p["key"] for p in data["points"]) or "none"
        print(f"step_profile: no point matches {args.point} (points: {keys})", file=sys.stderr)
        return 2
    layers = max(1, data.get("layers") or 1)
    print(f"{data.get('preset')} on {data.get('device')}: {data.get('command')}", file=out)
    for point in points:
        print(file=out)
        report(point, layers, args.full_names, out)
        if args.timeline:
            os.makedirs(args.timeline, exist_ok=True)
            timeline(point, os.path.join(args.timeline, point["key"].replace("/", "_") + ".png"),
                     args.full_names)
    return 0


if __name__ == "__main__":
    sys.exit(main())
