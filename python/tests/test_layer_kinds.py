"""DeepSeek-V4's layer kinds from Python, on the CPU backend: resident and window-only layers and
the raw window, appended and ingested through append_token / ingest_prompt, read back through
dense_entries / raw_window and checked against a dense model of what was given."""

import numpy as np
import pytest

import sparsekv
from sparsekv import LayerKind

STRIDE = 16
RAW_WINDOW = 8
TOP_K = 3
MAX_BATCH = 3
# Layer kinds and cadences: two offloaded r=4 layers, two resident r=128 layers, a window-only one.
KINDS = [
    (LayerKind.OFFLOADED, 4),
    (LayerKind.RESIDENT, 128),
    (LayerKind.OFFLOADED, 4),
    (LayerKind.RESIDENT, 128),
    (LayerKind.WINDOW_ONLY, 1),
]


def v4_options(**overrides):
    layers = [
        sparsekv.LayerShape(STRIDE, kind=kind, entry_tokens=r, indexer_keys=False)
        for kind, r in KINDS
    ]
    fields = dict(
        geometry=sparsekv.KVGeometry(layers),
        raw_window=RAW_WINDOW,
        top_k=TOP_K,
        hot_slots=6,
        window=2,
        max_requests=4,
        max_host_requests=5,
        max_batch=MAX_BATCH,
        max_context=640,
        host_page_tokens=16,
        host_capacity_tokens=1600,
        resident_page_rows=2,
    )
    fields.update(overrides)
    return sparsekv.CacheOptions(**fields)


def row(rid, layer, what, index):
    """The bytes given for entry or token `index` (what: 0 entry, 1 raw row) of a request."""
    base = rid * 97 + layer * 31 + what * 13 + index * 7
    return ((np.arange(STRIDE) * 5 + base) % 251).astype(np.uint8)


class Model:
    """What a request was given: its token count; entries and raw rows follow from it."""

    def __init__(self):
        self.tokens = {}

    def entries(self, rid, layer):
        kind, r = KINDS[layer]
        count = self.tokens[rid] // r
        return np.stack([row(rid, layer, 0, c) for c in range(count)]) if count else None

    def window(self, rid, layer):
        n = self.tokens[rid]
        return np.stack([row(rid, layer, 1, t) for t in range(n - min(n, RAW_WINDOW), n)])


def admit(manager, model, rid, prompt_len, max_new_tokens):
    manager.admit(rid, prompt_len, max_new_tokens)
    model.tokens[rid] = prompt_len
    for layer, (kind, _) in enumerate(KINDS):
        entries = None if kind == LayerKind.WINDOW_ONLY else model.entries(rid, layer)
        manager.ingest_prompt(rid, layer, entries, window=model.window(rid, layer))


def step(manager, model, batch):
    manager.plan_step(batch)
    for rid in batch:
        model.tokens[rid] += 1
    for layer, (kind, r) in enumerate(KINDS):
        entries = np.zeros((MAX_BATCH, STRIDE), np.uint8)
        window = np.zeros((MAX_BATCH, STRIDE), np.uint8)
        for b, rid in enumerate(batch):
            n = model.tokens[rid]
            if n % r == 0:
                entries[b] = row(rid, layer, 0, n // r - 1)
            window[b] = row(rid, layer, 1, n - 1)
        manager.append_token(
            layer, None if kind == LayerKind.WINDOW_ONLY else entries, window=window
        )
        if kind == LayerKind.OFFLOADED:
            topk = np.full((MAX_BATCH, TOP_K), -1, np.int32)
            for b, rid in enumerate(batch):
                topk[b, 0] = model.tokens[rid] // r - 1
            slots = np.zeros((MAX_BATCH, TOP_K), np.int32)
            manager.run_layer(layer, topk, slots)


def check_step(manager, model, batch):
    """Every resident entry and window row of the planned step reads back as given."""
    for layer, (kind, r) in enumerate(KINDS):
        view = manager.raw_window(layer)
        assert (view.raw_window, view.row_stride) == (RAW_WINDOW, STRIDE)
        for b, rid in enumerate(batch):
            assert view.valid(b) == min(model.tokens[rid], RAW_WINDOW)
            np.testing.assert_array_equal(view.rows(b), model.window(rid, layer))
        if kind != LayerKind.RESIDENT:
            continue
        dense = manager.dense_entries(layer)
        assert (dense.entry_tokens, dense.row_stride) == (r, STRIDE)
        for b, rid in enumerate(batch):
            assert dense.count(b) == model.tokens[rid] // r
            got = dense.entries(b)
            want = model.entries(rid, layer)
            if want is None:
                assert got.shape == (0, STRIDE)
            else:
                np.testing.assert_array_equal(got, want)


def test_a_v4_shaped_manager_reads_back_every_resident_entry_and_window_row():
    manager = sparsekv.SparseKVCacheManager(v4_options(), sparsekv.cpu_backend())
    model = Model()
    admit(manager, model, 1, 13, 300)
    admit(manager, model, 2, 130, 300)
    admit(manager, model, 3, 5, 40)
    steps = 0
    resident_entries_seen = 0
    for i in range(290):
        batch = [rid for rid in (1, 2, 3) if rid in model.tokens]
        step(manager, model, batch)
        check_step(manager, model, batch)
        resident_entries_seen = max(
            resident_entries_seen, manager.dense_entries(1).count(batch.index(2))
        )
        stats = manager.read_stats()
        assert stats.device_memory.resident_entries > 0
        assert stats.device_memory.windows > 0
        manager.finish_step()
        steps += 1
        if 3 in model.tokens and model.tokens[3] == 45:
            manager.release(3)
            del model.tokens[3]
            admit(manager, model, 4, 131, 200)  # ingested with a resident entry: 131 // 128 = 1
        if i == 150:
            manager.release(4)
            del model.tokens[4]
    assert steps == 290
    # Request 2 went from 130 to 420 tokens: entries 0, 1 and 2 of each resident layer.
    assert resident_entries_seen == 420 // 128
    assert manager.sequence_length(2) == 420


def test_refusals_raise_the_documented_errors():
    manager = sparsekv.SparseKVCacheManager(v4_options(), sparsekv.cpu_backend())
    model = Model()
    manager.admit(1, 9, 20)
    model.tokens[1] = 9
    # A raw window is required with raw_window > 0.
    with pytest.raises(sparsekv.InvalidArgumentError):
        manager.ingest_prompt(1, 0, model.entries(1, 0))
    with pytest.raises(sparsekv.InvalidArgumentError):
        manager.ingest_prompt(1, 4, None)
    # The window's rows are checked: min(prompt_len, raw_window) of them.
    with pytest.raises(ValueError, match="window"):
        manager.ingest_prompt(1, 4, None, window=np.zeros((3, STRIDE), np.uint8))
    for layer, (kind, _) in enumerate(KINDS):
        entries = None if kind == LayerKind.WINDOW_ONLY else model.entries(1, layer)
        manager.ingest_prompt(1, layer, entries, window=model.window(1, layer))
    manager.plan_step([1])
    model.tokens[1] += 1
    window = np.zeros((MAX_BATCH, STRIDE), np.uint8)
    entries = np.zeros((MAX_BATCH, STRIDE), np.uint8)
    with pytest.raises(sparsekv.InvalidArgumentError):
        manager.append_token(1, entries)  # no window rows
    with pytest.raises(sparsekv.InvalidArgumentError):
        manager.append_token(1, None, window=window)  # a resident layer needs its entries
    with pytest.raises(ValueError, match="window"):
        # Fewer window rows than the batch has requests.
        manager.append_token(4, window=np.zeros((0, STRIDE), np.uint8))
    topk = np.full((MAX_BATCH, TOP_K), -1, np.int32)
    slots = np.zeros((MAX_BATCH, TOP_K), np.int32)
    for layer in (1, 3, 4):  # resident and window-only layers are never resolved
        with pytest.raises(sparsekv.InvalidArgumentError):
            manager.resolve_layer(layer, topk, slots)
        with pytest.raises(sparsekv.InvalidArgumentError):
            manager.run_layer(layer, topk, slots)
    for layer in (1, 3, 4):  # nor have rows in the hot cache
        with pytest.raises(sparsekv.InvalidArgumentError, match="no rows in the hot cache"):
            manager.hot_layer(layer)
    assert manager.hot_layer(0).rows > 0
    with pytest.raises(sparsekv.InvalidArgumentError):
        manager.dense_entries(4)  # not resident
    with pytest.raises(sparsekv.InvalidArgumentError):
        manager.dense_entries(0)
    with pytest.raises(sparsekv.InvalidArgumentError):
        manager.raw_window(5)
    view = manager.raw_window(4)
    with pytest.raises(IndexError):
        view.rows(1)  # one request in the batch
    with pytest.raises(IndexError):
        manager.dense_entries(1).entries(-1)


def test_views_need_the_layer_kinds(manager):
    # The shared fixture's manager: offloaded layers only, no raw window.
    with pytest.raises(sparsekv.FailedPreconditionError):
        manager.dense_entries(0)
    with pytest.raises(sparsekv.FailedPreconditionError):
        manager.raw_window(0)


def test_an_offloaded_layer_of_cadence_r_is_ingested_with_its_entries():
    # No raw window: the single-array form, whose rows are the prompt's prompt_len // r entries.
    layers = [sparsekv.LayerShape(STRIDE, entry_tokens=4, indexer_keys=False) for _ in range(2)]
    options = v4_options(geometry=sparsekv.KVGeometry(layers), raw_window=0)
    manager = sparsekv.SparseKVCacheManager(options, sparsekv.cpu_backend())
    manager.admit(1, 13, 20)
    with pytest.raises(ValueError, match="rows"):
        manager.ingest_prompt(1, 0, np.zeros((13, STRIDE), np.uint8))
    manager.ingest_prompt(1, 0, np.zeros((13 // 4, STRIDE), np.uint8))
    manager.ingest_prompt(1, 1, np.zeros((13 // 4, STRIDE), np.uint8))
    manager.plan_step([1])
    manager.append_token(0, np.zeros((MAX_BATCH, STRIDE), np.uint8))


def test_a_retained_conversation_shares_its_prefix_with_its_resident_entries():
    # A page holds 16 entries of 4 tokens: 64 tokens. Request 1's 300 tokens fill 4 pages.
    manager = sparsekv.SparseKVCacheManager(v4_options(), sparsekv.cpu_backend())
    ids = [t % 7 for t in range(300)]
    assert manager.admit_with_prefix(1, ids, 40) == 0
    window1 = {
        layer: np.stack([row(1, layer, 1, t) for t in range(292, 300)]) for layer in range(5)
    }
    for layer, (kind, r) in enumerate(KINDS):
        entries = None
        if kind != LayerKind.WINDOW_ONLY:
            entries = np.stack([row(1, layer, 0, c) for c in range(300 // r)])
        manager.ingest_prompt_suffix(1, layer, entries, window=window1[layer])
    assert manager.retain(1) == 256
    assert manager.is_retained(1)

    # The conversation goes on: the whole history and 10 new tokens. Its first 256 tokens are shared; the
    # resident layers' entries 0 and 1 (tokens 0-255) come from request 1's copy.
    assert manager.admit_with_prefix(2, ids + [3] * 10, 20) == 256
    for layer, (kind, r) in enumerate(KINDS):
        entries = None
        if kind == LayerKind.OFFLOADED:  # entries 64-76 of 77
            entries = np.stack([row(2, layer, 0, c) for c in range(256 // r, 310 // r)])
            with pytest.raises(ValueError, match="rows"):
                manager.ingest_prompt_suffix(2, layer, entries[1:], window=window1[layer])
        window = np.stack([row(2, layer, 1, t) for t in range(302, 310)])
        manager.ingest_prompt_suffix(2, layer, entries, window=window)
    manager.plan_step([2])  # token 310
    for layer, (kind, r) in enumerate(KINDS):
        window = np.zeros((MAX_BATCH, STRIDE), np.uint8)
        window[0] = row(2, layer, 1, 310)
        entries = None if kind == LayerKind.WINDOW_ONLY else np.zeros((MAX_BATCH, STRIDE), np.uint8)
        manager.append_token(layer, entries, window=window)
        if kind == LayerKind.OFFLOADED:
            topk = np.full((MAX_BATCH, TOP_K), -1, np.int32)
            manager.run_layer(layer, topk, np.zeros((MAX_BATCH, TOP_K), np.int32))
        want = np.stack([row(2, layer, 1, t) for t in range(303, 311)])
        np.testing.assert_array_equal(manager.raw_window(layer).rows(0), want)
        if kind == LayerKind.RESIDENT:
            want = np.stack([row(1, layer, 0, c) for c in (0, 1)])
            np.testing.assert_array_equal(manager.dense_entries(layer).entries(0), want)
    manager.finish_step()
    stats = manager.read_stats()
    assert (stats.prefix_lookup_tokens, stats.prefix_hit_tokens) == (610, 256)
