"""Prometheus metrics of a manager, its host pool and a step schedule, for ``prometheus_client``.

``SparseKVCollector`` is a custom collector (``collect()`` yields metric families) that an engine
registers in its own registry, next to its own metrics::

    import prometheus_client
    from sparsekv.metrics import SparseKVCollector

    prometheus_client.REGISTRY.register(SparseKVCollector(manager, schedule=schedule))

The names, types and labels are those of the C++ ``MetricsExporter`` and ``sparsekv pool
--metrics-port``; docs/metrics.md lists every metric, where its value comes from, and how to serve
the collector when the engine runs ``prometheus_client`` in multiprocess mode (SGLang, vLLM with
several API servers), where custom collectors are not collected.

A manager is not thread-safe, and a scrape may arrive on the HTTP server's thread. With
``read_on_collect=True`` (the default) each scrape reads the statistics itself, which suits an
engine whose scrapes and steps share a thread, or the CPU backend. Otherwise call ``update()``
from the thread that drives the manager (between steps) and scrapes show what it read last;
``sparsekv_stats_timestamp_seconds`` says when that was.

Needs ``prometheus_client`` (``pip install prometheus-client``); importing this module without it
raises ``ImportError``.
"""

import re
import threading
import time

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

__all__ = ["SparseKVCollector"]

# Label names the metrics use themselves; a constant label may not take one.
_METRIC_LABELS = ("result", "reason", "direction", "choice", "use")
_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


class SparseKVCollector:
    """A ``prometheus_client`` collector over sparsekv's statistics.

    manager: a ``SparseKVCacheManager`` (its ``read_stats()``), or None.
    schedule: a ``StepSchedule`` (its ``stats()``), or None.
    pool: a ``NodePool`` whose occupancy is shown (pages, owners, attached processes), or None;
        without it the host pool's pages come from the manager's statistics.
    prefix: the first word of every metric name.
    labels: constant labels added to every sample, e.g. ``{"tp_rank": "0"}``.
    read_on_collect: read the statistics at every scrape (True) or only in ``update()`` (False).

    ``ValueError`` for a bad prefix or label name, or if nothing is given to read.
    """

    def __init__(self, manager=None, schedule=None, pool=None, prefix="sparsekv", labels=None,
                 read_on_collect=True):
        if manager is None and schedule is None and pool is None:
            raise ValueError("SparseKVCollector: give a manager, a schedule or a pool")
        if not _NAME.match(prefix):
            raise ValueError(f"SparseKVCollector: prefix {prefix!r} is not a metric name")
        labels = dict(labels or {})
        for name in labels:
            if not _NAME.match(name) or name.startswith("__"):
                raise ValueError(f"SparseKVCollector: label {name!r} is not a label name")
            if name in _METRIC_LABELS:
                raise ValueError(f"SparseKVCollector: label {name!r} is one the metrics use")
        self._manager = manager
        self._schedule = schedule
        self._pool = pool
        self._prefix = prefix
        self._label_names = list(labels)
        self._label_values = [str(v) for v in labels.values()]
        self._read_on_collect = read_on_collect
        self._lock = threading.Lock()
        self._snapshot = None  # (timestamp, cache stats, pool occupancy dict, schedule stats)
        self._read_errors = 0

    def update(self):
        """Reads the statistics now; scrapes show them until the next update.

        Call it from the thread that drives the manager, between steps. Errors of ``read_stats``
        propagate (the previous snapshot stays).
        """
        stats = self._manager.read_stats() if self._manager is not None else None
        occupancy = None
        if self._pool is not None:
            p = self._pool
            occupancy = {
                "total_pages": p.total_pages,
                "free_pages": p.free_pages,
                "max_owners": p.max_owners,
                "free_owners": p.free_owners,
                "bytes": p.bytes,
                "live_processes": p.live_processes,
            }
        schedule = self._schedule.stats() if self._schedule is not None else None
        with self._lock:
            self._snapshot = (time.time(), stats, occupancy, schedule)

    def describe(self):
        """No names up front: registering reads nothing (and checks no duplicates)."""
        return []

    def collect(self):
        """The metric families of the last snapshot (read now with read_on_collect)."""
        if self._read_on_collect:
            try:
                self.update()
            except Exception:  # a scrape shows the last snapshot and counts the failure
                with self._lock:
                    self._read_errors += 1
        with self._lock:
            snapshot, read_errors = self._snapshot, self._read_errors
        families = []
        if snapshot is not None:
            timestamp, stats, occupancy, schedule = snapshot
            if stats is not None:
                self._cache(families, stats)
            if occupancy is not None:
                self._occupancy(families, occupancy)
            elif stats is not None:
                self._gauge(families, "host_pool_capacity_pages", "Pages of the host pool.",
                            stats.host_pages_total)
                self._gauge(families, "host_pool_used_pages",
                            "Pages of the host pool in use (by every process).",
                            stats.host_pages_used)
            if schedule is not None:
                self._schedule_families(families, schedule)
            self._gauge(families, "stats_timestamp_seconds",
                        "When the statistics shown were read, seconds since the epoch.",
                        timestamp)
        if self._read_on_collect:
            self._counter(families, "stats_read_errors",
                          "Scrapes whose reading of the statistics failed (the last snapshot "
                          "was shown).", read_errors)
        return families

    # ---- families ----

    def _family(self, kind, name, documentation, label=None, values=()):
        names = self._label_names + ([label] if label else [])
        family = kind(f"{self._prefix}_{name}", documentation, labels=names)
        for label_value, value in values:
            extra = [label_value] if label else []
            family.add_metric(self._label_values + extra, float(value))
        return family

    def _counter(self, families, name, documentation, value, label=None, values=None):
        """`name` without _total (prometheus_client adds it)."""
        families.append(self._family(CounterMetricFamily, name, documentation, label,
                                     values if values is not None else [(None, value)]))

    def _gauge(self, families, name, documentation, value, label=None, values=None):
        families.append(self._family(GaugeMetricFamily, name, documentation, label,
                                     values if values is not None else [(None, value)]))

    def _cache(self, f, s):
        t = s.total
        self._counter(f, "topk_lookups",
                      "Top-k entries resolved against the hot cache, by result (hit rate = the "
                      "non-miss results over all).", None, "result",
                      [("hit", t.hits), ("window_hit", t.window_hits),
                       ("resident_hit", t.resident_hits), ("miss", t.misses)])
        self._counter(f, "topk_skipped_entries",
                      "Top-k entries skipped, by reason (out_of_range: an engine error).", None,
                      "reason", [("padding", t.padding), ("duplicate", t.duplicates),
                                 ("out_of_range", t.out_of_range)])
        self._counter(f, "transfer_bytes",
                      "KV bytes copied, by direction: host_to_device (misses, prefetch, window "
                      "loads), device_to_host (write-back of new tokens), device_to_device "
                      "(assembled rows).", None, "direction",
                      [("host_to_device", s.bytes_host_to_device),
                       ("device_to_host", s.bytes_device_to_host),
                       ("device_to_device", s.bytes_assembled)])
        for name, documentation, value in (
            ("ingested_bytes", "Prompt KV bytes written into the host pool.", s.bytes_ingested),
            ("prefix_lookup_tokens", "Prompt tokens of admissions that looked up a prefix.",
             s.prefix_lookup_tokens),
            ("prefix_hit_tokens", "Of those, tokens found in the host pool (not ingested).",
             s.prefix_hit_tokens),
            ("copy_on_write_pages", "Shared, partially filled pages copied before an append.",
             s.copy_on_write_pages),
            ("retained_evictions", "Retained conversations evicted to make room for an "
             "admission.", s.evictions),
            ("retained_evicted_pages", "Host pages those evictions freed.", s.evicted_pages),
            ("demotions", "Resident requests demoted to hot-cache mode.", s.demotions),
            ("promotions", "Hot-cache requests made resident.", s.promotions),
            ("prefetch_lookups", "Positions the cross-layer prefetch looked up.",
             s.prefetch_lookups),
            ("prefetch_rows", "Of those, rows fetched (not resident).", s.prefetch_rows),
            ("prefetch_useful_rows", "Prefetched rows a resolve then hit (precision = useful / "
             "prefetch_rows).", s.prefetch_useful_rows),
            ("prefetch_wasted_rows", "Prefetched rows evicted before any resolve hit them.",
             s.prefetch_wasted_rows),
            ("prefetch_missed_rows", "Misses of resolves that followed a prefetch: rows it did "
             "not bring (recall = useful / (useful + missed)).", s.prefetch_missed_rows),
            ("invalid_copy_entries", "Copy entries skipped as out of bounds (0 unless something "
             "is wrong).", s.invalid_copy_entries),
        ):
            self._counter(f, name, documentation, value)
        d = s.device_memory
        self._gauge(f, "device_memory_use_bytes", "Device memory the manager holds, by use (the "
                    "uses add up to device_memory_bytes).", None, "use",
                    [("resident_rows", d.resident_rows), ("hot_cache_rows", d.hot_cache_rows),
                     ("indexer_keys", d.indexer_keys), ("free_rows", d.free_rows),
                     ("replacement_state", d.replacement_state), ("tables", d.tables),
                     ("plan", d.plan), ("counters", d.counters),
                     ("resident_entries", d.resident_entries), ("windows", d.windows)])
        h = s.host_memory
        self._gauge(f, "host_pool_use_bytes", "Pages of the host pool by use, in bytes (the uses "
                    "add up to the pool's pages).", None, "use",
                    [("private", h.private_pages), ("shared", h.shared_pages),
                     ("retained", h.retained_pages), ("free", h.free_pages)])
        for name, documentation, value in (
            ("hot_cache_used_blocks", "Hot-cache blocks held by requests in hot-cache mode.",
             s.hot_blocks_used),
            ("resident_requests", "Requests whose whole KV is in device memory.",
             s.resident_requests),
            ("device_memory_bytes", "Device memory the manager holds: hot cache, replacement "
             "state, page table, plan buffers.", s.device_bytes),
            ("host_pool_shared_pages", "Host pages with more than one holder.", s.pages_shared),
            ("prefix_saved_bytes", "Host bytes that sharing saves: page copies private histories "
             "would store.", s.bytes_saved),
            ("retained_conversations", "Conversations retained in the host pool.",
             s.retained_conversations),
            ("retained_entries_bytes", "Host copies of retained conversations' resident-layer "
             "entries and raw windows, outside the host pool.", h.retained_entries),
        ):
            self._gauge(f, name, documentation, value)

    def _occupancy(self, f, p):
        self._gauge(f, "host_pool_capacity_pages", "Pages of the host pool.", p["total_pages"])
        self._gauge(f, "host_pool_used_pages", "Pages of the host pool in use (by every process).",
                    p["total_pages"] - p["free_pages"])
        self._gauge(f, "host_pool_capacity_bytes", "Bytes of rows of the host pool.", p["bytes"])
        self._gauge(f, "host_pool_capacity_owners", "Page-table rows of the host pool.",
                    p["max_owners"])
        self._gauge(f, "host_pool_used_owners", "Page-table rows held by requests and prompts.",
                    p["max_owners"] - p["free_owners"])
        self._gauge(f, "node_pool_live_processes", "Processes attached to the node pool.",
                    p["live_processes"])

    def _schedule_families(self, f, s):
        self._counter(f, "schedule_steps", "Steps the step schedule planned, by choice.", None,
                      "choice", sorted(s.steps_by_choice.items()))
        self._counter(f, "schedule_calibration_steps", "Of those, steps that measured a "
                      "candidate.", s.calibration_steps)
        if s.steps > 0:
            self._gauge(f, "schedule_last_choice_info", "The last planned step's choice (1).",
                        None, "choice", [(str(s.last_choice), 1)])
