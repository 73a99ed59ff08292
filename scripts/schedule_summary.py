#!/usr/bin/env python3
"""Summary keys of the step schedule's GPU measurements, from the runs' JSON files.

usage: schedule_summary.py [--out SUMMARY.json] JSON...

Each JSON is a `sparsekv bench --json` output (scripts/gpu-bench-schedule.sh writes one per run)
or a Python decode benchmark's (bench/python_decode_bench.py --json). A bench run is the automatic
schedule's if its command has `--schedule auto`, a manual one's if `--schedule manual`; its
sparsekv points give tok/s per workload and batch. A workload is named by context and miss rate:
"32k_calibrated" (no miss-rate target: the calibrated locality) or "32k_m20" (20% misses).

Keys (null where the runs needed are missing):
  e2e_auto_to_best_manual_min            min over every workload and batch that both an automatic
                                         and a manual run measured of
                                         auto tok/s / max over the manual runs of tok/s
                                         (several automatic runs of one point: the lowest);
  e2e_auto_to_best_manual_min_<workload> the same over one workload's batches;
  e2e_python_to_cpp_tokens_ratio_32k     the Python benchmark's tok/s through the package's
                                         StepSchedule (driver "schedule") at 32K, batch 59, over
                                         the automatic C++ run's at the same workload and batch:
                                         the calibrated one where the Python benchmark ran it
                                         (python_decode_bench.py --locality calibrated), else
                                         20% misses;
  e2e_adapter_to_cpp_tokens_ratio_32k_m20  the same for the SGLang-shaped adapter
                                         (driver "adapter") at 32K with 20% misses.
Prints a table of every point, then the keys as one JSON object; --out also writes them there
(merge them into bench/results/summary.json with scripts/merge_summary.py). Exits 1 if a file
cannot be read.
"""
import json
import sys

PYTHON_BATCH = 59


def workload(point):
    rate = point.get("miss_rate_target")
    name = "calibrated" if rate is None else f"m{rate * 100:.0f}"
    return f"{point['context'] // 1024}k_{name}"


def kind(data):
    """'auto', 'manual', 'python:<driver>', or None for a run that is none of them."""
    if "driver" in data:
        return "python:" + data["driver"]
    command = data.get("command", "")
    words = command.split()
    for i, w in enumerate(words[:-1]):
        if w == "--schedule":
            return words[i + 1] if words[i + 1] in ("auto", "manual") else None
    return None


def collect(paths):
    """{kind: {(workload, batch): [(tok/s, schedule, path)]}}, and whether every file was read."""
    runs, ok = {}, True
    for path in paths:
        try:
            with open(path) as f:
                data = json.load(f)
        except (OSError, ValueError) as e:
            print(f"schedule_summary: skipping {path}: {e}", file=sys.stderr)
            ok = False
            continue
        k = kind(data)
        if k is None:
            continue
        for p in data.get("points", []):
            if p.get("variant") != "sparsekv" or not p.get("tokens_per_s"):
                continue
            key = (workload(p), p["batch"])
            runs.setdefault(k, {}).setdefault(key, []).append(
                (p["tokens_per_s"], p.get("schedule", ""), path))
    return runs, ok


def summarize(runs):
    auto, manual = runs.get("auto", {}), runs.get("manual", {})
    ratios = {}  # (workload, batch) -> ratio
    for key in sorted(set(auto) & set(manual)):
        best = max(t for t, _, _ in manual[key])
        ratios[key] = min(t for t, _, _ in auto[key]) / best
    keys = {"e2e_auto_to_best_manual_min": min(ratios.values()) if ratios else None}
    for name in sorted({w for w, _ in ratios}):
        keys[f"e2e_auto_to_best_manual_min_{name}"] = min(
            r for (w, _), r in ratios.items() if w == name)

    def python_ratio(driver, names):
        for name in names:
            point = (name, PYTHON_BATCH)
            python = runs.get("python:" + driver, {}).get(point)
            cpp = auto.get(point)
            if python and cpp:
                return min(t for t, _, _ in python) / min(t for t, _, _ in cpp)
        return None

    keys["e2e_python_to_cpp_tokens_ratio_32k"] = python_ratio(
        "schedule", ["32k_calibrated", "32k_m20"])
    keys["e2e_adapter_to_cpp_tokens_ratio_32k_m20"] = python_ratio("adapter", ["32k_m20"])
    return keys, ratios


def table(runs, ratios, out):
    out.write(f"{'run':<18} {'workload':<16} {'batch':>5} {'tok/s':>9}  schedule\n")
    for k in sorted(runs):
        for (name, batch), rows in sorted(runs[k].items()):
            for tokens, schedule, _ in rows:
                out.write(f"{k:<18} {name:<16} {batch:>5} {tokens:>9.1f}  {schedule}\n")
    for (name, batch), r in sorted(ratios.items()):
        out.write(f"auto / best manual  {name:<16} {batch:>5} {r:>9.3f}\n")


def main(argv, out=sys.stdout):
    args = list(argv[1:])
    out_path = None
    if args[:1] == ["--out"]:
        if len(args) < 2:
            print(__doc__.strip(), file=sys.stderr)
            return 2
        out_path, args = args[1], args[2:]
    if not args:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    runs, ok = collect(args)
    keys, ratios = summarize(runs)
    table(runs, ratios, out)
    text = json.dumps(keys, indent=2, sort_keys=True)
    out.write(text + "\n")
    if out_path:
        with open(out_path, "w") as f:
            f.write(text + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
