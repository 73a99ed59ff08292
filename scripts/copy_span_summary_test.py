#!/usr/bin/env python3
"""Tests of scripts/copy_span_summary.py (a ctest), on resolve_bench JSON written here in the shape
resolve_bench --json writes it. Python 3 standard library only.
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
import copy_span_summary  # noqa: E402


def result(ctx, batch, rate, row, us, multiple, strategy="library", verified=True):
    return {"strategy": strategy, "context": ctx, "batch": batch, "row_bytes": row,
            "miss_rate": rate, "resolve_copy": {"median_ms": us / 1e3},
            "time_to_floor": multiple, "verified": verified}


def run(results):
    return {"config": {"span_bytes": int(14.1 * 2**30)}, "results": results}


def every_peer_point(multiple):
    return [result(*key, 500.0, multiple) for key in copy_span_summary.PEER]


class CopySpanSummaryTest(unittest.TestCase):
    def test_ratio_to_the_peer_is_the_worst_of_its_points(self):
        results = every_peer_point(1.0)
        results[0]["time_to_floor"] = 2.28  # 128K b64 20% 656: the peer's 2.15
        results.append(result(32768, 1, 0.0, 656, 12.0, None))  # hits only: no multiple
        keys, rows, verified = copy_span_summary.summarize(run(results))
        self.assertTrue(verified)
        self.assertAlmostEqual(keys["resolve_copy_span_to_floor_over_peer_max"], 2.28 / 2.15)
        self.assertAlmostEqual(keys["resolve_copy_span_to_floor_max"], 2.28)
        self.assertAlmostEqual(keys["resolve_copy_span_to_floor_128k_b64_m20_656"], 2.28)
        self.assertEqual(len(rows), len(copy_span_summary.PEER) + 1)

    def test_a_missing_peer_point_leaves_the_ratio_null(self):
        keys, _, _ = copy_span_summary.summarize(run(every_peer_point(1.2)[1:]))
        self.assertIsNone(keys["resolve_copy_span_to_floor_over_peer_max"])
        self.assertIsNone(keys["resolve_copy_span_to_floor_128k_b64_m20_656"])
        self.assertAlmostEqual(keys["resolve_copy_span_to_floor_max"], 1.2)

    def test_the_library_strategy_speaks_for_its_point(self):
        results = every_peer_point(1.0)
        results.append(result(32768, 100, 0.2, 656, 100.0, 0.5, strategy="fused"))
        keys, _, _ = copy_span_summary.summarize(run(results))
        self.assertAlmostEqual(keys["resolve_copy_span_to_floor_32k_b100_m20_656"], 1.0)

    def test_an_unverified_point_fails_the_run(self):
        results = every_peer_point(1.0)
        results[1]["verified"] = False
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "span.json")
            out = os.path.join(d, "keys.json")
            with open(path, "w") as f:
                json.dump(run(results), f)
            with contextlib.redirect_stdout(io.StringIO()), \
                    contextlib.redirect_stderr(io.StringIO()):
                self.assertEqual(copy_span_summary.main(["--out", out, path]), 1)
            with open(out) as f:
                self.assertIn("resolve_copy_span_to_floor_over_peer_max", json.load(f))


if __name__ == "__main__":
    unittest.main()
