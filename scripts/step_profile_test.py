#!/usr/bin/env python3
"""Tests of scripts/step_profile.py (a ctest): on scripts/testdata/step_trace.json, the file the
tool's writer is checked against (tools/sparsekv/bench/step_trace_test.cc), and on small traces
built here. Python 3.11 standard library only; the timeline test needs matplotlib (else skipped).
"""
import copy
import io
import json
import os
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import step_profile  # noqa: E402

FIXTURE = os.path.join(HERE, "testdata", "step_trace.json")


def run(*argv):
    out = io.StringIO()
    code = step_profile.main(list(argv), out=out)
    return code, out.getvalue()


def record(name, start, end, lane, kind="kernel"):
    return {"kind": kind, "name": name, "start_ns": start, "end_ns": end, "lane": lane,
            "stream_id": 7, "graph_node_id": 1 + start}


class StepProfileTest(unittest.TestCase):
    def setUp(self):
        with open(FIXTURE) as f:
            self.data = json.load(f)

    def test_summary_agrees_with_the_tools(self):
        # The tool writes its own summary beside the records: the script's, from the records, is
        # the same (names in the same order with the same totals).
        for point in self.data["points"]:
            mine = step_profile.summarize(point["records"])
            theirs = point["summary"]
            self.assertEqual(set(mine), set(theirs))
            for key, value in theirs.items():
                if key == "names":
                    self.assertEqual(len(mine["names"]), len(value))
                    for a, b in zip(mine["names"], value):
                        self.assertEqual(set(a), set(b))
                        for k in b:
                            if isinstance(b[k], float):
                                self.assertAlmostEqual(a[k], b[k], places=9, msg=(b["name"], k))
                            else:
                                self.assertEqual(a[k], b[k], (b["name"], k))
                else:
                    self.assertAlmostEqual(mine[key], value, places=9, msg=key)

    def test_table_is_per_layer(self):
        code, text = run(FIXTURE)
        self.assertEqual(code, 0)
        lines = text.splitlines()
        header = next(i for i, line in enumerate(lines) if line.split()[:2] == ["name", "streams"])
        table = [line.split() for line in lines[header + 1:] if line.startswith("   ")]
        rows = {row[0]: row for row in table}
        # copy: 2 side records, 3.5 us in a 9.5-us step of 2 layers, 1.5 us hidden, 2.0 exposed.
        self.assertEqual(rows["copy"][1:], ["side", "2", "1.00", "3.5", "1.75", "36.8", "0.75",
                                            "1.00"])
        self.assertEqual(rows["attn"][1:], ["main", "2", "1.00", "3.0", "1.50", "31.6", "-", "-"])
        self.assertEqual(rows["stray"][1], "?")
        self.assertIn("8 records, 1 of unknown stream, 1 without timestamps", text)
        self.assertIn("main stream busy 0.006 ms (63.2%), 2 gaps 0.003 ms (31.6%, largest 2.0 us",
                      text)
        self.assertIn("side streams busy 0.004 ms: hidden 0.002 ms, exposed 0.002 ms", text)
        self.assertIn("over 2 layers: 4.8 us per layer", text)
        # Rows by total time, largest first; equal totals by name.
        self.assertEqual([row[0] for row in table],
                         ["copy", "attn", "proxy", "memcpy", "resolve", "stray"])

    def test_points_are_selected_by_key_prefix(self):
        data = copy.deepcopy(self.data)
        other = copy.deepcopy(data["points"][0])
        other.update(key="full-hbm/32768/4/-", variant="full-hbm", miss_rate_target=None,
                     records=[record("attn", 100, 300, 0)])
        data["points"].append(other)
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "trace.json")
            with open(path, "w") as f:
                json.dump(data, f)
            code, text = run(path, "--point", "full-hbm")
            self.assertEqual(code, 0)
            self.assertIn("== full-hbm/32768/4/-: full-hbm, context 32768, batch 4\n", text)
            self.assertNotIn("sparsekv/32768", text)
            code, text = run(path)
            self.assertEqual(text.count("\n== "), 2)
            self.assertEqual(run(path, "--point", "no-cache")[0], 2)

    def test_rejects_other_json(self):
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "e2e.json")
            with open(path, "w") as f:
                json.dump({"points": []}, f)
            self.assertEqual(run(path)[0], 2)

    def test_short_names(self):
        self.assertEqual(step_profile.short_name(
            "void sparsekv::cuda::(anonymous namespace)::ResolveKernel<true, 4>(sparsekv::View, "
            "int)"), "ResolveKernel<true, 4>")
        self.assertEqual(step_profile.short_name("sm90_xmma_gemm_bf16bf16_bf16f32"),
                         "sm90_xmma_gemm_bf16bf16_bf16f32")
        self.assertEqual(step_profile.short_name("ns::Kernel<ns::A<1>>(ns::B)"), "Kernel<ns::A<1>>")
        self.assertEqual(step_profile.short_name("memcpy HtoD"), "memcpy HtoD")

    def test_side_record_spanning_main_records_and_a_gap(self):
        s = step_profile.summarize([record("m", 100, 200, 0), record("m", 300, 400, 0),
                                    record("copy", 150, 350, 1)])
        self.assertAlmostEqual(s["hidden_us"], 0.1)      # [150, 200) + [300, 350)
        self.assertAlmostEqual(s["exposed_us"], 0.1)     # [200, 300)
        self.assertAlmostEqual(s["main_gap_side_us"], 0.1)
        self.assertEqual(s["main_gaps"], 1)
        self.assertAlmostEqual(s["idle_us"], 0.0)

    @unittest.skipUnless(__import__("importlib").util.find_spec("matplotlib"), "no matplotlib")
    def test_timeline_png(self):
        with tempfile.TemporaryDirectory() as tmp:
            code, _ = run(FIXTURE, "--timeline", tmp)
            self.assertEqual(code, 0)
            png = os.path.join(tmp, "sparsekv_32768_4_0.2.png")
            self.assertGreater(os.path.getsize(png), 1000)


if __name__ == "__main__":
    unittest.main()
