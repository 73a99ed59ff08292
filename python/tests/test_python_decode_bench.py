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


def test_the_miss_rate_feed_is_the_generators_miss_rate_mode():
    import numpy as np
    import sparsekv
    a = bench.parse_args(SMALL[:-1] + ["--context", "1000", "--top-k", "10", "--miss-rate", "0.3"])
    feed = bench.TopKFeed(a)
    o = sparsekv.TopKGeneratorOptions()
    o.top_k, o.seed, o.miss_rate, o.fresh_range = 10, a.seed, 0.3, 1000
    own = [sparsekv.LayerTopKGenerator(o, layer, a.batch) for layer in range(a.layers)]
    previous = None
    for step in range(3):
        lens = [1001 + step] * a.batch
        rows = feed.next(lens)
        for layer, g in enumerate(own):
            assert np.array_equal(rows[layer], g.next(lens))
        if previous is not None:  # 3 fresh positions, and the newest one, per row
            for new, old in zip(rows[0], previous[0]):
                assert len(set(new.tolist()) - set(old.tolist())) <= 4
        previous = rows


def test_the_calibrated_feed_chains_the_layers_as_the_cpp_feed():
    import numpy as np
    import sparsekv
    a = bench.parse_args(SMALL[:-1] + ["--locality", "calibrated"])
    feed = bench.TopKFeed(a)
    o = sparsekv.locality_preset("glm5-published")
    o.top_k, o.seed = a.top_k, a.seed
    assert o.cross_layer_overlap > 0
    own = [sparsekv.LayerTopKGenerator(o, layer, a.batch) for layer in range(a.layers)]
    lens = [a.context + 1] * a.batch
    rows = feed.next(lens)
    lower = None
    for layer, g in enumerate(own):
        lower = g.next(lens, lower)
        assert np.array_equal(rows[layer], lower)


def test_the_calibrated_workload_is_named_in_the_result():
    result = bench.run(bench.parse_args(SMALL + ["--locality", "calibrated"]), out=io.StringIO())
    (point,) = result["points"]
    assert point["workload"] == "calibrated" and point["miss_rate_target"] is None


@pytest.mark.parametrize("bad, message", [
    (["--warmup", "6"], "--warmup"),
    (["--miss-rate", "1.5"], "--miss-rate"),
    (["--batch", "0"], "--batch"),
    (["--path", "adapter", "--schedule", "chunks2"], "attention slices"),
    (["--locality", "uniform"], "--locality"),
])
def test_bad_options_are_refused_naming_the_option(bad, message, capsys):
    with pytest.raises(SystemExit):
        bench.parse_args(SMALL + bad)
    assert message in capsys.readouterr().err


def test_the_gpu_needs_a_row_format_the_attention_reads(capsys):
    with pytest.raises(SystemExit):
        bench.parse_args(["--device", "cuda", "--row-bytes", "16"])
    assert "--row-bytes" in capsys.readouterr().err


def test_check_needs_the_cpu(capsys):
    with pytest.raises(SystemExit):
        bench.parse_args(["--device", "cuda", "--check"])
    assert "--check" in capsys.readouterr().err


def test_the_adapters_path_reads_the_rows_written(tmp_path):
    pytest.importorskip("torch")  # the adapter is torch's
    result = bench.run(bench.parse_args(SMALL + ["--path", "adapter", "--schedule", "auto"]))
    assert result["driver"] == "adapter"
    assert result["points"][0]["timed_steps"] == 4
