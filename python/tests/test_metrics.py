"""sparsekv.metrics.SparseKVCollector in a fresh prometheus_client registry, over a CPU manager
driven through a step schedule and a node pool: the exposition has every metric docs/metrics.md
documents for them, typed as documented, with the statistics' values; a real HTTP scrape
(prometheus_client.start_http_server, urllib) shows the same; bad arguments raise.
"""

import os
import re
import socket
import urllib.request

import numpy as np
import pytest

prometheus_client = pytest.importorskip("prometheus_client")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

import sparsekv  # noqa: E402
from sparsekv.metrics import SparseKVCollector  # noqa: E402
from conftest import LAYERS, TOP_K, make_options  # noqa: E402

DOCS = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "metrics.md")
STEPS = 5
_pools = iter(range(1000))


def documented():
    """(name, type, source) of every row of docs/metrics.md's tables."""
    rows = []
    with open(DOCS) as f:
        for line in f:
            if line.startswith("| `sparsekv_"):
                cells = [c.strip() for c in line.strip().strip("|").split("|")]
                rows.append((cells[0].strip("`"), cells[1], cells[3]))
    return rows


def samples(text):
    """{(name, frozenset of labels): value} and {family name: type} of an exposition."""
    values, types = {}, {}
    for family in text_string_to_metric_families(text):
        # The parser names a counter family without _total; the documented name has it.
        name = family.name + ("_total" if family.type == "counter" else "")
        types[name] = family.type
        for s in family.samples:
            if s.name.endswith("_created"):
                continue
            values[(s.name, frozenset(s.labels.items()))] = s.value
    return values, types


@pytest.fixture
def driven(tmp_path):
    """A manager over a node pool with two requests, STEPS steps through an automatic schedule."""
    options = make_options(copy_chunk_rows=1, max_prefetch=TOP_K)
    backend = sparsekv.cpu_backend()
    pool = sparsekv.NodePool.create(options, 8, f"sparsekv-metrics-{os.getpid()}-{next(_pools)}", backend)
    manager = sparsekv.SparseKVCacheManager(pool.with_shape(options), backend, pool=pool)
    schedule = sparsekv.StepSchedule(manager, candidates=["serial", "prefetch"], trials=1)
    rng = np.random.default_rng(1)
    batch = [1, 2]
    for rid in batch:
        manager.admit(rid, 12, 20)
        for layer, (_, stride) in enumerate(LAYERS):
            manager.ingest_prompt(rid, layer, rng.integers(0, 256, (12, stride), dtype=np.uint8))
    for _ in range(STEPS):
        schedule.plan_step(batch)
        for layer, (_, stride) in enumerate(LAYERS):
            topk = rng.integers(0, 12, (2, TOP_K), dtype=np.int32)
            topk[:, -1] = -1
            slots = np.zeros((2, TOP_K), np.int32)
            schedule.run_layer(layer, rng.integers(0, 256, (2, stride), dtype=np.uint8), topk,
                               slots, lambda *args: None)
        schedule.finish_step()
    yield manager, schedule, pool
    del schedule, manager, pool


def test_the_exposition_has_every_documented_metric_with_the_statistics_values(driven):
    manager, schedule, pool = driven
    registry = prometheus_client.CollectorRegistry()
    registry.register(SparseKVCollector(manager, schedule=schedule, pool=pool,
                                        labels={"tp_rank": "0"}))
    values, types = samples(prometheus_client.generate_latest(registry).decode())

    for name, kind, source in documented():
        if source in ("pool server",):
            continue
        assert types.get(name) == kind, (name, source)
    assert set(types) <= {name for name, _, _ in documented()}

    def value(name, **labels):
        return values[(name, frozenset({"tp_rank": "0", **labels}.items()))]

    stats = manager.read_stats()
    t = stats.total
    assert t.misses > 0
    assert value("sparsekv_topk_lookups_total", result="hit") == t.hits
    assert value("sparsekv_topk_lookups_total", result="window_hit") == t.window_hits
    assert value("sparsekv_topk_lookups_total", result="miss") == t.misses
    assert value("sparsekv_topk_skipped_entries_total", reason="padding") == 2 * STEPS * len(LAYERS)
    assert value("sparsekv_transfer_bytes_total", direction="host_to_device") == \
        stats.bytes_host_to_device
    assert value("sparsekv_transfer_bytes_total", direction="device_to_host") == \
        2 * STEPS * sum(row_bytes for row_bytes, _ in LAYERS)
    assert value("sparsekv_ingested_bytes_total") == stats.bytes_ingested
    assert value("sparsekv_hot_cache_used_blocks") == 2
    assert stats.prefetch_rows > 0
    assert value("sparsekv_prefetch_rows_total") == stats.prefetch_rows
    assert value("sparsekv_prefetch_useful_rows_total") == stats.prefetch_useful_rows
    assert value("sparsekv_prefetch_wasted_rows_total") == stats.prefetch_wasted_rows
    assert value("sparsekv_prefetch_missed_rows_total") == stats.prefetch_missed_rows
    assert stats.prefetch_useful_rows + stats.prefetch_wasted_rows <= stats.prefetch_rows
    assert stats.prefetch_precision() == stats.prefetch_useful_rows / stats.prefetch_rows
    assert value("sparsekv_device_memory_bytes") == stats.device_bytes
    d, h = stats.device_memory, stats.host_memory
    assert sum(value("sparsekv_device_memory_use_bytes", use=u) for u in (
        "resident_rows", "hot_cache_rows", "indexer_keys", "free_rows", "replacement_state",
        "tables", "plan", "counters")) == stats.device_bytes
    assert value("sparsekv_device_memory_use_bytes", use="hot_cache_rows") == d.hot_cache_rows
    assert sum(value("sparsekv_host_pool_use_bytes", use=u)
               for u in ("private", "shared", "retained", "free")) == h.total > 0
    assert value("sparsekv_host_pool_use_bytes", use="private") == h.private_pages > 0
    assert value("sparsekv_retained_entries_bytes") == h.retained_entries == 0  # no resident layer
    assert value("sparsekv_host_pool_capacity_pages") == pool.total_pages
    assert value("sparsekv_host_pool_used_pages") == pool.total_pages - pool.free_pages > 0
    assert value("sparsekv_host_pool_capacity_bytes") == pool.bytes > 0
    assert value("sparsekv_host_pool_capacity_owners") == pool.max_owners == 8
    assert value("sparsekv_host_pool_used_owners") == 2
    assert value("sparsekv_node_pool_live_processes") == 1

    s = schedule.stats()
    assert s.steps == STEPS and s.calibration_steps >= 2
    assert sum(value("sparsekv_schedule_steps_total", choice=c) for c in s.steps_by_choice) == STEPS
    assert value("sparsekv_schedule_calibration_steps_total") == s.calibration_steps
    assert value("sparsekv_schedule_last_choice_info", choice=str(s.last_choice)) == 1
    assert value("sparsekv_stats_read_errors_total") == 0
    assert value("sparsekv_stats_timestamp_seconds") > 1.7e9


def test_a_real_scrape_over_http_shows_the_same(driven):
    manager, schedule, pool = driven
    registry = prometheus_client.CollectorRegistry()
    collector = SparseKVCollector(manager, schedule=schedule, read_on_collect=False)
    registry.register(collector)
    with socket.socket() as s:  # a free port
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server, thread = prometheus_client.start_http_server(port, addr="127.0.0.1", registry=registry)
    try:
        url = f"http://127.0.0.1:{port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as response:
            assert response.status == 200
            assert response.headers["Content-Type"].startswith("text/plain")
            assert response.read() == b""  # nothing read yet: update() was not called
        collector.update()
        with urllib.request.urlopen(url, timeout=10) as response:
            text = response.read().decode()
    finally:
        server.shutdown()
        thread.join(10)
    values, types = samples(text)
    assert values == samples(prometheus_client.generate_latest(registry).decode())[0]
    for name, kind, source in documented():
        if source in ("manager", "schedule"):
            assert types.get(name) == kind, name
    # Without a pool: the pool's pages from the manager's statistics, no owners.
    stats = manager.read_stats()
    assert values[("sparsekv_host_pool_used_pages", frozenset())] == stats.host_pages_used
    assert "sparsekv_host_pool_capacity_owners" not in types
    assert re.search(r"^# TYPE sparsekv_topk_lookups_total counter$", text, re.M)


def test_a_failing_read_shows_the_last_snapshot_and_counts_the_error(driven):
    manager, schedule, pool = driven

    class Failing:
        def __init__(self):
            self.fail = False

        def read_stats(self):
            if self.fail:
                raise sparsekv.FailedPreconditionError("gone")
            return manager.read_stats()

    failing = Failing()
    registry = prometheus_client.CollectorRegistry()
    registry.register(SparseKVCollector(failing))
    first, _ = samples(prometheus_client.generate_latest(registry).decode())
    failing.fail = True
    second, _ = samples(prometheus_client.generate_latest(registry).decode())
    assert second.pop(("sparsekv_stats_read_errors_total", frozenset())) == 1
    assert first.pop(("sparsekv_stats_read_errors_total", frozenset())) == 0
    assert first == second


def test_bad_arguments_raise(manager):
    with pytest.raises(ValueError, match="give a manager"):
        SparseKVCollector()
    with pytest.raises(ValueError, match="prefix"):
        SparseKVCollector(manager, prefix="9lives")
    with pytest.raises(ValueError, match="one the metrics use"):
        SparseKVCollector(manager, labels={"result": "x"})
    with pytest.raises(ValueError, match="label"):
        SparseKVCollector(manager, labels={"bad-name": "x"})
    # Another prefix renames every metric.
    registry = prometheus_client.CollectorRegistry()
    registry.register(SparseKVCollector(manager, prefix="engine_kv"))
    text = prometheus_client.generate_latest(registry).decode()
    assert "engine_kv_topk_lookups_total" in text and "sparsekv_" not in text
