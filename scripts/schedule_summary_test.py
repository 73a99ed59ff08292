#!/usr/bin/env python3
"""Tests of scripts/schedule_summary.py (a ctest): the summary keys from bench JSON files written
here in the shape `sparsekv bench --json` and bench/python_decode_bench.py --json write them.
Python 3 standard library only.
"""
import io
import json
import os
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import schedule_summary  # noqa: E402

BENCH = ("sparsekv bench --backend cuda --preset deepseek-v3.2 --contexts 32768 --variants "
         "sparsekv")


def bench_run(schedule, points, extra=""):
    return {
        "command": f"{BENCH} --schedule {schedule}{extra} --json x.json",
        "points": [{"variant": "full-hbm", "context": 32768, "miss_rate_target": None,
                    "batch": 30, "tokens_per_s": 1041.0}] + [
            {"variant": "sparsekv", "context": 32768, "miss_rate_target": rate, "batch": batch,
             "tokens_per_s": tokens, "schedule": "chunks16"}
            for rate, batch, tokens in points],
    }


def python_run(driver, rate, batch, tokens):
    return {"driver": driver, "points": [
        {"variant": "sparsekv", "context": 32768, "miss_rate_target": rate, "batch": batch,
         "tokens_per_s": tokens, "schedule": "serial"}]}


class ScheduleSummaryTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()

    def tearDown(self):
        self.dir.cleanup()

    def write(self, name, data):
        path = os.path.join(self.dir.name, name)
        with open(path, "w") as f:
            json.dump(data, f)
        return path

    def run_summary(self, *paths):
        out = io.StringIO()
        summary = os.path.join(self.dir.name, "summary.json")
        code = schedule_summary.main(["schedule_summary.py", "--out", summary, *paths], out=out)
        with open(summary) as f:
            return code, json.load(f), out.getvalue()

    def test_auto_over_the_best_manual_run_at_each_batch_and_its_minimum(self):
        paths = [
            self.write("auto.json", bench_run("auto", [(None, 8, 400.0), (None, 59, 1254.0),
                                                       (0.2, 59, 900.0)])),
            self.write("serial.json", bench_run("manual", [(None, 8, 420.0), (None, 59, 1198.0),
                                                           (0.2, 59, 1000.0)])),
            self.write("chunks16.json", bench_run("manual", [(None, 8, 380.0), (None, 59, 1234.0),
                                                             (0.2, 59, 950.0)],
                                                  " --copy-chunk-rows 16")),
        ]
        code, keys, text = self.run_summary(*paths)
        self.assertEqual(code, 0)
        # calibrated: 400 / 420 at batch 8, 1254 / 1234 at 59; 20% misses: 900 / 1000.
        self.assertAlmostEqual(keys["e2e_auto_to_best_manual_min_32k_calibrated"], 400 / 420)
        self.assertAlmostEqual(keys["e2e_auto_to_best_manual_min_32k_m20"], 0.9)
        self.assertAlmostEqual(keys["e2e_auto_to_best_manual_min"], 0.9)
        self.assertIsNone(keys["e2e_python_to_cpp_tokens_ratio_32k"])
        self.assertIn("auto / best manual  32k_calibrated      59     1.016", text)

    def test_batches_without_both_kinds_of_run_are_left_out(self):
        paths = [
            self.write("auto.json", bench_run("auto", [(None, 4, 100.0), (None, 59, 1200.0)])),
            self.write("manual.json", bench_run("manual", [(None, 59, 1250.0)])),
        ]
        _, keys, _ = self.run_summary(*paths)
        self.assertAlmostEqual(keys["e2e_auto_to_best_manual_min"], 1200 / 1250)

    def test_the_lowest_of_several_automatic_runs_counts(self):
        paths = [
            self.write("a1.json", bench_run("auto", [(None, 59, 1200.0)])),
            self.write("a2.json", bench_run("auto", [(None, 59, 1100.0)])),
            self.write("m.json", bench_run("manual", [(None, 59, 1000.0)])),
        ]
        _, keys, _ = self.run_summary(*paths)
        self.assertAlmostEqual(keys["e2e_auto_to_best_manual_min"], 1.1)

    def test_python_and_adapter_runs_over_the_automatic_cpp_run(self):
        paths = [
            self.write("auto.json", bench_run("auto", [(None, 59, 1250.0), (0.2, 59, 1000.0)])),
            self.write("python.json", python_run("schedule", None, 59, 1000.0)),
            self.write("adapter.json", python_run("adapter", 0.2, 59, 800.0)),
            self.write("python-b8.json", python_run("schedule", None, 8, 10.0)),  # not batch 59
        ]
        code, keys, _ = self.run_summary(*paths)
        self.assertEqual(code, 0)
        self.assertAlmostEqual(keys["e2e_python_to_cpp_tokens_ratio_32k"], 0.8)
        self.assertAlmostEqual(keys["e2e_adapter_to_cpp_tokens_ratio_32k_m20"], 0.8)
        self.assertIsNone(keys["e2e_auto_to_best_manual_min"])  # no manual run

    def test_the_python_ratio_prefers_the_calibrated_workload(self):
        paths = [
            self.write("auto.json", bench_run("auto", [(None, 59, 1000.0), (0.2, 59, 1000.0)])),
            self.write("python-m20.json", python_run("schedule", 0.2, 59, 500.0)),
            self.write("python-cal.json", python_run("schedule", None, 59, 900.0)),
        ]
        _, keys, _ = self.run_summary(*paths)
        self.assertAlmostEqual(keys["e2e_python_to_cpp_tokens_ratio_32k"], 0.9)

    def test_an_unreadable_file_is_reported_and_fails_the_exit_status(self):
        bad = self.write("bad.json", {})
        with open(bad, "w") as f:
            f.write("{not json")
        good = self.write("auto.json", bench_run("auto", [(None, 59, 1.0)]))
        code, keys, _ = self.run_summary(bad, good)
        self.assertEqual(code, 1)
        self.assertIsNone(keys["e2e_auto_to_best_manual_min"])

    def test_runs_of_other_benchmarks_are_ignored(self):
        other = {"command": f"{BENCH} --json y.json",
                 "points": [{"variant": "sparsekv", "context": 32768, "miss_rate_target": None,
                             "batch": 59, "tokens_per_s": 5.0}]}
        paths = [self.write("other.json", other),
                 self.write("auto.json", bench_run("auto", [(None, 59, 10.0)])),
                 self.write("manual.json", bench_run("manual", [(None, 59, 20.0)]))]
        _, keys, _ = self.run_summary(*paths)
        self.assertAlmostEqual(keys["e2e_auto_to_best_manual_min"], 0.5)


if __name__ == "__main__":
    unittest.main()
