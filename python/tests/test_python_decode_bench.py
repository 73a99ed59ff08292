"""bench/python_decode_bench.py on the CPU backend at small sizes: every row attention reads is the
row written (--check), in the automatic schedule and in fixed ones, and the result has the C++
bench's tok/s definition and JSON point shape (what scripts/schedule_summary.py reads)."""

import importlib.util
import io
import json
import os

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
BENCH = os.path.join(HERE, "..", "..", "bench", "python_decode_bench.py")


def load_bench():
    spec = importlib.util.spec_from_file_location("python_decode_bench", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


bench = load_bench()

SMALL = ["--device", "cpu", "--context", "40", "--batch", "3", "--layers", "2", "--row-bytes",
         "16", "--top-k", "6", "--hot-slots", "9", "--window", "2", "--page-tokens", "8",
         "--heads", "2", "--copy-chunk-rows", "1", "--weights-gb", "0", "--steps", "6",
         "--warmup", "2", "--miss-rate", "0.5", "--check"]


@pytest.mark.parametrize("schedule", ["auto", "serial", "prefetch", "chunks2", "prefetch+chunks1"])
def test_the_decode_reads_the_rows_written_and_reports_the_benchs_tokens_per_second(
        schedule, tmp_path):
    path = tmp_path / "python.json"
    out = io.StringIO()
    result = bench.run(bench.parse_args(SMALL + ["--schedule", schedule, "--json", str(path)]),
                       out=out)
    assert json.loads(path.read_text()) == result
    assert result["driver"] == "schedule"
    (point,) = result["points"]
    assert point["variant"] == "sparsekv" and point["batch"] == 3 and point["context"] == 40
    assert point["timed_steps"] == 4
    assert point["tokens_per_s"] == pytest.approx(3 * 1e3 / point["tpot_ms"])
    assert 0 < point["miss_rate"] < 1  # fresh positions miss, repeated ones hit
    if schedule != "auto":
        assert point["schedule"] == schedule
    assert "tok/s" in out.getvalue()


def test_the_feed_replaces_the_miss_rates_share_of_each_top_k():
    import numpy as np
    rng = np.random.default_rng(3)
    feed = bench.TopKFeed(rng, batch=2, top_k=10, context=1000, rate=0.3)
    before = feed.topk.copy()
    after = feed.next([1000, 1000])
    changed = (before != after).sum(axis=1)
    assert all(c <= 3 for c in changed)  # 3 replaced per request (a fresh one may repeat one)
    assert (after >= 0).all() and (after < 1000).all()


@pytest.mark.parametrize("bad, message", [
    (["--warmup", "6"], "--warmup"),
    (["--miss-rate", "1.5"], "--miss-rate"),
    (["--batch", "0"], "--batch"),
    (["--path", "adapter", "--schedule", "chunks2"], "attention slices"),
])
def test_bad_options_are_refused_naming_the_option(bad, message, capsys):
    with pytest.raises(SystemExit):
        bench.parse_args(SMALL + bad)
    assert message in capsys.readouterr().err


def test_check_needs_the_cpu(capsys):
    with pytest.raises(SystemExit):
        bench.parse_args(["--device", "cuda", "--check"])
    assert "--check" in capsys.readouterr().err


def test_the_adapters_path_reads_the_rows_written(tmp_path):
    pytest.importorskip("torch")  # the adapter is torch's
    result = bench.run(bench.parse_args(SMALL + ["--path", "adapter", "--schedule", "auto"]))
    assert result["driver"] == "adapter"
    assert result["points"][0]["timed_steps"] == 4
