#!/usr/bin/env python3
"""Summarises scripts/gpu-profile-step.sh's output: for each batch and variant, each kernel's
launch count and median duration under Nsight Compute, and the plain run's TPOT per layer.

Usage: python3 scripts/profile_summary.py DIR
"""
import csv
import json
import pathlib
import re
import statistics
import sys


def kernels(path):
    """{kernel name: [durations in us]} from an ncu --csv log (lines before the header skipped)."""
    lines = path.read_text(errors="replace").splitlines()
    start = next((i for i, l in enumerate(lines) if l.startswith('"ID"')), None)
    out = {}
    if start is None:
        return out
    for row in csv.DictReader(lines[start:]):
        if row.get("Metric Name") != "gpu__time_duration.sum":
            continue
        value = float(row["Metric Value"].replace(",", ""))
        unit = row.get("Metric Unit", "ns")
        scale = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}
        out.setdefault(row["Kernel Name"], []).append(value * scale.get(unit, 1e-3))
    return out


def tpot(path):
    if not path.exists():
        return None, None
    d = json.loads(path.read_text())
    points = d.get("points", [])
    return (points[0]["tpot_ms"], d.get("layers")) if points else (None, d.get("layers"))


def main():
    out = pathlib.Path(sys.argv[1])
    for csv_path in sorted(out.glob("ncu-*.csv")):
        m = re.match(r"ncu-(.+)-b(\d+)\.csv", csv_path.name)
        variant, batch = m.group(1), int(m.group(2))
        t, layers = tpot(out / f"plain-{variant}-b{batch}.json")
        print(f"\n== {variant}, batch {batch}: TPOT {t} ms over {layers} layers"
              + (f" = {t * 1e3 / layers:.1f} us per layer" if t and layers else ""))
        print(f"  {'launches':>8} {'median us':>10} {'max us':>8}  kernel")
        for name, ds in sorted(kernels(csv_path).items(), key=lambda kv: -statistics.median(kv[1]) * len(kv[1])):
            print(f"  {len(ds):8d} {statistics.median(ds):10.2f} {max(ds):8.2f}  {name[:110]}")


if __name__ == "__main__":
    main()
