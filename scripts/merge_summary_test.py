#!/usr/bin/env python3
"""Tests of scripts/merge_summary.py (a ctest): benchmark JSON and flat summaries merged into one
summary file, all keys or those --keys names. Python 3 standard library only.
"""
import contextlib
import io
import json
import os
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import merge_summary  # noqa: E402

CALIBRATED = "e2e_throughput_ratio_vs_full_hbm_*k_calibrated"


class MergeSummaryTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.addCleanup(self.dir.cleanup)

    def write(self, name, data):
        path = os.path.join(self.dir.name, name)
        with open(path, "w") as f:
            json.dump(data, f)
        return path

    def merge(self, *args):
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            return merge_summary.main(["merge_summary.py", *args])

    def test_benchmark_summaries_replace_their_keys_and_keep_the_others(self):
        out = self.write("summary.json", {"kept": 1, "e2e_min_ratio_vs_full_hbm": 0.9})
        run = self.write("run.json", {"points": [], "summary": {"e2e_min_ratio_vs_full_hbm": 0.95}})
        self.assertEqual(self.merge(out, run), 0)
        with open(out) as f:
            self.assertEqual(json.load(f), {"kept": 1, "e2e_min_ratio_vs_full_hbm": 0.95})

    def test_keys_merges_only_the_matching_keys_of_both_models(self):
        out = os.path.join(self.dir.name, "new", "summary.json")
        v32 = self.write("v32.json", {"summary": {
            "e2e_throughput_ratio_vs_full_hbm_32k_calibrated": 1.2,
            "e2e_min_ratio_vs_full_hbm": 0.93}})
        glm = self.write("glm.json", {"summary": {
            "e2e_throughput_ratio_vs_full_hbm_glm53_32k_calibrated": 1.4,
            "e2e_min_ratio_vs_full_hbm": 0.91}})
        self.assertEqual(self.merge("--keys", CALIBRATED, out, v32, glm), 0)
        with open(out) as f:
            self.assertEqual(json.load(f), {
                "e2e_throughput_ratio_vs_full_hbm_32k_calibrated": 1.2,
                "e2e_throughput_ratio_vs_full_hbm_glm53_32k_calibrated": 1.4})

    def test_the_v4pro_set_merges_its_ratios_ideals_and_minimum_only(self):
        out = self.write("summary.json", {"kept": 1})
        run = self.write("v4pro.json", {"summary": {
            "e2e_throughput_ratio_vs_full_hbm_v4pro_256k": 1.9,
            "e2e_throughput_ratio_vs_full_hbm_v4pro_512k": None,
            "e2e_throughput_ratio_vs_full_hbm_v4pro_1m": 2.5,
            "e2e_throughput_ratio_vs_full_hbm_v4pro_1m_calibrated": 2.5,
            "e2e_ideal_ratio_vs_full_hbm_v4pro_1m": 3.1,
            "e2e_min_ratio_vs_full_hbm_v4pro": 0.9,
            "e2e_min_ratio_vs_full_hbm": 0.9,
            "e2e_throughput_ratio_vs_full_hbm_32k_m20": None}})
        self.assertEqual(self.merge("--keys", "v4pro", out, run), 0)
        with open(out) as f:
            self.assertEqual(json.load(f), {
                "kept": 1,
                "e2e_throughput_ratio_vs_full_hbm_v4pro_256k": 1.9,
                "e2e_throughput_ratio_vs_full_hbm_v4pro_512k": None,
                "e2e_throughput_ratio_vs_full_hbm_v4pro_1m": 2.5,
                "e2e_ideal_ratio_vs_full_hbm_v4pro_1m": 3.1,
                "e2e_min_ratio_vs_full_hbm_v4pro": 0.9})

    def test_a_missing_input_is_skipped_and_fails_the_merge(self):
        out = self.write("summary.json", {})
        run = self.write("run.json", {"summary": {"a": 1}})
        self.assertEqual(self.merge(out, os.path.join(self.dir.name, "none.json"), run), 1)
        with open(out) as f:
            self.assertEqual(json.load(f), {"a": 1})

    def test_keys_without_patterns_is_a_usage_error(self):
        self.assertEqual(self.merge("--keys"), 2)


if __name__ == "__main__":
    unittest.main()
