"""Every public operation of the manager through the package, on the CPU and the CUDA backend.

Lifecycle (admit, ingest_prompt, plan_step, append_token, run_layer, resolve_layer, copy_misses,
assemble_layer, prefetch_layer, finish_step, retract, resume, release), shared prefixes and
retained conversations (admit_with_prefix, ingest_prompt_suffix, plan_step with token ids, fork,
retain, is_retained, host_pages, evict_retained) and statistics (read_stats, reset_stats,
to_dict). Every step checks the bytes of the assembled rows, and of the hot layer at the returned
slots, against what was ingested and appended.

The CUDA variant uses torch CUDA tensors and is skipped unless torch sees a GPU and the library
was built with the CUDA backend.
"""

from __future__ import annotations

from typing import Dict, List, Optional

import numpy as np
import pytest

import sparsekv
from conftest import LAYERS, MAX_CONTEXT, TOP_K, make_options

ROW_BYTES = [b for b, _ in LAYERS]
STRIDES = [s for _, s in LAYERS]
PAGE = 4  # conftest's host_page_tokens


def cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available() and sparsekv.cuda_compiled()


class Arrays:
    """Turns numpy arrays into the tensors a backend takes, and back."""

    def __init__(self, kind: str):
        self.kind = kind
        if kind == "cuda":
            import torch

            self.torch = torch

    def backend(self) -> sparsekv.Backend:
        return sparsekv.cuda_backend(0) if self.kind == "cuda" else sparsekv.cpu_backend()

    def to_device(self, a: np.ndarray):
        if self.kind == "cuda":
            return self.torch.from_numpy(np.ascontiguousarray(a)).cuda()
        return np.ascontiguousarray(a)

    def to_numpy(self, t) -> np.ndarray:
        return t.cpu().numpy() if self.kind == "cuda" else np.array(t)

    def hot_layer(self, view: sparsekv.HotLayer) -> np.ndarray:
        if self.kind == "cuda":
            return self.torch.as_tensor(view, device="cuda").cpu().numpy()
        return np.array(np.asarray(view))


@pytest.fixture(params=["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not cuda_available(), reason="needs a CUDA GPU, torch and sparsekv built with CUDA"))])
def arrays(request) -> Arrays:
    return Arrays(request.param)


class Driver:
    """A manager, the bytes every request's history holds, and steps checked against them."""

    def __init__(self, arrays: Arrays, seed: int = 0, **option_overrides):
        self.a = arrays
        self.rng = np.random.default_rng(seed)
        self.options = make_options(**option_overrides)
        self.m = sparsekv.SparseKVCacheManager(self.options, arrays.backend())
        self.history: Dict[int, List[np.ndarray]] = {}  # id -> per layer [length, stride] bytes
        self.max_batch = self.options.effective_max_batch
        self.entries = 0  # top-k entries of batch rows resolved, all layers
        self.appended_tokens = 0

    def rows(self, n: int, layer: int) -> np.ndarray:
        return self.rng.integers(0, 256, (n, STRIDES[layer]), dtype=np.uint8)

    def prompt(self, n: int) -> List[np.ndarray]:
        return [self.rows(n, layer) for layer in range(len(LAYERS))]

    def admit(self, rid: int, prompt: List[np.ndarray], max_new_tokens: int) -> None:
        self.m.admit(rid, len(prompt[0]), max_new_tokens)
        for layer, rows in enumerate(prompt):
            self.m.ingest_prompt(rid, layer, self.a.to_device(rows))
        self.history[rid] = [rows.copy() for rows in prompt]

    def step(self, batch: List[int], token_ids: Optional[List[int]] = None,
             split: bool = False, prefetch: Optional[np.ndarray] = None) -> None:
        """One decode step over `batch`, every layer checked. split: resolve_layer +
        copy_misses (copy_miss_chunk per chunk with copy_chunk_rows) + assemble_layer instead of
        run_layer; prefetch: positions ([max_batch,
        count]) prefetch_layer (or resolve_prefetch + copy_prefetch) brings into every layer after
        the step's reads."""
        self.m.plan_step(batch, token_ids=token_ids)
        assert self.m.batch_size == len(batch)
        for layer in range(len(LAYERS)):
            new_rows = self.rows(self.max_batch, layer)
            self.m.append_token(layer, self.a.to_device(new_rows))
            for b, rid in enumerate(batch):
                self.history[rid][layer] = np.vstack([self.history[rid][layer], new_rows[b:b + 1]])
            topk = np.full((self.max_batch, TOP_K), -1, np.int32)
            for b, rid in enumerate(batch):
                length = len(self.history[rid][layer])
                picked = self.rng.choice(length, size=min(length, TOP_K - 1), replace=False)
                topk[b, :len(picked)] = picked  # at least one -1 (padding) per row
            slots = self.a.to_device(np.full((self.max_batch, TOP_K), -7, np.int32))
            assembled = self.a.to_device(
                np.zeros((self.max_batch, TOP_K, STRIDES[layer]), np.uint8))
            if split:
                fill = self.a.to_device(np.zeros((self.max_batch, TOP_K), np.uint8))
                misses_before = self.m.read_stats().layers[layer].misses
                self.m.resolve_layer(layer, self.a.to_device(topk), slots, fill_mask=fill)
                rows = self.options.copy_chunk_rows
                if rows > 0:  # a pipelined layer: chunk by chunk, the last first
                    for chunk in reversed(range((len(batch) + rows - 1) // rows)):
                        self.m.copy_miss_chunk(layer, chunk)
                else:
                    self.m.copy_misses(layer)
                self.m.assemble_layer(layer, slots, assembled)
                misses = self.m.read_stats().layers[layer].misses - misses_before
                fill = self.a.to_numpy(fill)[:len(batch)]
                assert set(np.unique(fill)) <= {0, 1} and int(fill.sum()) == misses
            else:
                self.m.run_layer(layer, self.a.to_device(topk), slots, assembled)
            self.check_layer(layer, batch, topk, self.a.to_numpy(slots),
                             self.a.to_numpy(assembled))
        if prefetch is not None:
            for layer in range(len(LAYERS)):
                if layer % 2 == 0:
                    self.m.prefetch_layer(layer, self.a.to_device(prefetch))
                else:  # in two parts, as an engine that copies on another stream
                    self.m.resolve_prefetch(layer, self.a.to_device(prefetch))
                    self.m.copy_prefetch(layer)
        self.m.finish_step()
        self.entries += len(batch) * TOP_K * len(LAYERS)
        self.appended_tokens += len(batch)

    def check_layer(self, layer: int, batch: List[int], topk: np.ndarray, slots: np.ndarray,
                    assembled: np.ndarray) -> None:
        hot = self.a.hot_layer(self.m.hot_layer(layer))
        rb = ROW_BYTES[layer]
        for b, rid in enumerate(batch):
            for k in range(TOP_K):
                position, slot = topk[b, k], slots[b, k]
                if position < 0:
                    assert slot == -1
                    assert not assembled[b, k].any()
                    continue
                expected = self.history[rid][layer][position, :rb]
                assert slot >= 0
                np.testing.assert_array_equal(assembled[b, k, :rb], expected,
                                              f"layer {layer} request {rid} position {position}")
                np.testing.assert_array_equal(hot[slot, :rb], expected)
        assert (slots[len(batch):] == -7).all()  # rows past the batch are not touched


def test_lifecycle(arrays):
    d = Driver(arrays, seed=1, max_prefetch=2)
    m = d.m
    d.admit(1, d.prompt(5), max_new_tokens=8)
    d.admit(2, d.prompt(9), max_new_tokens=8)
    assert m.sequence_length(1) == 5 and m.sequence_length(2) == 9
    d.step([1, 2])
    positions = np.full((d.max_batch, 2), -1, np.int32)
    positions[:2, 0] = [0, 1]
    d.step([2, 1], split=True, prefetch=positions)
    assert m.sequence_length(1) == 7
    stats = m.read_stats()
    assert stats.prefetch_lookups == 2 * len(LAYERS)
    assert stats.prefetch_rows <= stats.prefetch_lookups
    assert stats.prefetch_useful_rows + stats.prefetch_wasted_rows <= stats.prefetch_rows
    assert 0.0 <= stats.prefetch_precision() <= 1.0 and 0.0 <= stats.prefetch_recall() <= 1.0

    m.retract(1)
    assert m.read_stats().hot_blocks_used == 1
    with pytest.raises(sparsekv.FailedPreconditionError, match="retracted"):
        m.plan_step([1])
    m.resume(1)
    d.step([1, 2])
    d.step([1])

    stats = m.read_stats()
    assert stats.bytes_ingested == (5 + 9) * sum(ROW_BYTES)
    assert stats.bytes_device_to_host == d.appended_tokens * sum(ROW_BYTES)
    total = stats.total
    assert total.hits + total.window_hits + total.misses + total.padding == d.entries
    assert total.duplicates == 0 and total.out_of_range == 0
    assert total.misses == sum(layer.misses for layer in stats.layers)
    assert stats.bytes_assembled > 0 and stats.invalid_copy_entries == 0

    m.release(1)
    m.release(2)
    with pytest.raises(sparsekv.NotFoundError):
        m.sequence_length(1)
    stats = m.read_stats()
    assert stats.hot_blocks_used == 0 and stats.host_pages_used == 0


def test_copy_by_chunks(arrays):
    """copy_chunk_rows: a layer copied chunk by chunk delivers the same rows; a chunk outside
    [0, ceil(max_batch / R)) or copied twice, or copy_miss_chunk without chunks, is refused."""
    d = Driver(arrays, seed=5, copy_chunk_rows=2)
    assert d.options.copy_chunk_rows == 2
    for rid in (1, 2, 3):
        d.admit(rid, d.prompt(6 + rid), max_new_tokens=8)
    for _ in range(3):
        d.step([3, 1, 2], split=True)
    d.step([2], split=True)
    assert d.m.read_stats().total.misses > 0

    m = d.m
    m.plan_step([1, 2, 3])
    topk = d.a.to_device(np.zeros((d.max_batch, TOP_K), np.int32))
    slots = d.a.to_device(np.zeros((d.max_batch, TOP_K), np.int32))
    for layer in range(len(LAYERS)):
        m.append_token(layer, d.a.to_device(d.rows(d.max_batch, layer)))
    m.resolve_layer(0, topk, slots)
    with pytest.raises(sparsekv.InvalidArgumentError, match="outside"):
        m.copy_miss_chunk(0, 2)
    m.copy_miss_chunk(0, 1)
    with pytest.raises(sparsekv.FailedPreconditionError, match="already copied"):
        m.copy_miss_chunk(0, 1)

    whole = Driver(arrays, seed=5)
    whole.admit(1, whole.prompt(4), max_new_tokens=4)
    whole.m.plan_step([1])
    for layer in range(len(LAYERS)):
        whole.m.append_token(layer, whole.a.to_device(whole.rows(whole.max_batch, layer)))
    whole.m.resolve_layer(0, topk, slots)
    with pytest.raises(sparsekv.FailedPreconditionError, match="copy_chunk_rows"):
        whole.m.copy_miss_chunk(0, 0)


def test_prefix_reuse_and_retained_conversations(arrays):
    d = Driver(arrays, seed=2)
    m = d.m
    # Turn 1: a prompt of 6 tokens, 3 generated with known ids: positions [0, 8) fill two pages.
    turn1 = list(range(100, 106))
    assert m.admit_with_prefix(1, turn1, 3) == 0  # an empty pool: a miss
    prompt = d.prompt(6)
    for layer, rows in enumerate(prompt):
        m.ingest_prompt_suffix(1, layer, d.a.to_device(rows))
    d.history[1] = prompt
    generated = [106, 107, 108]
    for token in generated:
        d.step([1], token_ids=[token])
    pages_of_turn1 = m.host_pages(1)
    assert len(pages_of_turn1) == 3  # 9 reserved tokens

    assert m.retain(1) == 2 * PAGE
    assert m.is_retained(1)
    assert m.host_pages(1) == pages_of_turn1[:2]
    stats = m.read_stats()
    assert stats.retained_conversations == 1 and stats.hot_blocks_used == 0

    # Turn 2: the whole conversation so far plus 3 new tokens; positions [0, 8) are shared.
    turn2 = turn1 + generated + [109, 110, 111]
    cached = m.admit_with_prefix(2, turn2, 8)
    assert cached == 2 * PAGE
    assert m.host_pages(2)[:2] == pages_of_turn1[:2]
    suffix = d.prompt(len(turn2) - cached)
    for layer, rows in enumerate(suffix):
        with pytest.raises(ValueError, match="rows"):  # all prompt rows: not a suffix
            m.ingest_prompt_suffix(2, layer, d.a.to_device(np.zeros((len(turn2), STRIDES[layer]),
                                                                    np.uint8)))
        m.ingest_prompt_suffix(2, layer, d.a.to_device(rows))
    d.history[2] = [np.vstack([d.history[1][layer][:cached], suffix[layer]])
                    for layer in range(len(LAYERS))]
    stats = m.read_stats()
    assert stats.prefix_lookup_tokens == len(turn1) + len(turn2)
    assert stats.prefix_hit_tokens == cached
    assert stats.pages_shared == 2
    assert stats.bytes_saved == 2 * PAGE * sum(STRIDES)
    assert stats.bytes_ingested == (len(turn1) + len(turn2) - cached) * sum(ROW_BYTES)

    # ingest_prompt on a prefix admission takes every prompt row and keeps the shared copy.
    cached3 = m.admit_with_prefix(3, turn2, 8)
    assert cached3 == cached
    garbage = [np.full((len(turn2), s), 0xEE, np.uint8) for s in STRIDES]
    for layer in range(len(LAYERS)):
        garbage[layer][cached:] = d.history[2][layer][cached:]
        m.ingest_prompt(3, layer, d.a.to_device(garbage[layer]))
    d.history[3] = [h.copy() for h in d.history[2]]
    for _ in range(3):
        d.step([2, 3], token_ids=[112, 113])
        d.step([3, 2], split=True)  # without ids: ends sharing of their later pages

    d.history.pop(1)
    assert m.evict_retained() == 1
    assert not m.is_retained(1)
    with pytest.raises(sparsekv.NotFoundError):
        m.host_pages(1)
    assert m.read_stats().retained_conversations == 0
    d.step([2, 3])  # the pages stay: requests 2 and 3 still hold them
    m.release(2)
    m.release(3)
    assert m.read_stats().host_pages_used == 0


def test_admission_evicts_retained_conversations(arrays):
    # 16 pages of 4 tokens: a retained conversation is evicted to admit a request of 16 pages.
    d = Driver(arrays, seed=3, host_capacity_tokens=MAX_CONTEXT)
    m = d.m
    m.admit_with_prefix(1, list(range(8)), 1)
    for layer, rows in enumerate(d.prompt(8)):
        m.ingest_prompt_suffix(1, layer, d.a.to_device(rows))
    assert m.retain(1) == 8
    d.admit(2, d.prompt(4), max_new_tokens=MAX_CONTEXT - 4)
    assert not m.is_retained(1)
    stats = m.read_stats()
    assert stats.evictions == 1 and stats.evicted_pages == 2
    assert stats.retained_conversations == 0
    d.step([2])


def test_fork_shares_the_parent_and_copies_on_write(arrays):
    d = Driver(arrays, seed=4)
    m = d.m
    d.admit(1, d.prompt(6), max_new_tokens=6)  # the last page (positions 4, 5) is partial
    d.step([1])
    m.fork(1, 2, 5)
    assert m.sequence_length(2) == 7
    assert m.host_pages(2)[:2] == m.host_pages(1)[:2]
    d.history[2] = [h.copy() for h in d.history[1]]
    assert m.read_stats().pages_shared == 2
    d.step([1, 2])  # both append into the shared partial page: one copies it first
    assert m.read_stats().copy_on_write_pages >= 1
    d.step([2, 1], split=True)
    with pytest.raises(sparsekv.AlreadyExistsError):
        m.fork(1, 2, 1)
    with pytest.raises(sparsekv.NotFoundError):
        m.fork(9, 10, 1)
    m.release(1)
    d.step([2])  # the child keeps the history it shared
    m.release(2)
    assert m.read_stats().host_pages_used == 0


def test_statistics_fields_dict_and_reset(arrays):
    d = Driver(arrays, seed=5)
    m = d.m
    d.admit(1, d.prompt(5), max_new_tokens=4)
    d.step([1])
    stats = m.read_stats()
    as_dict = stats.to_dict()
    # Every field (not the methods: to_dict, prefetch_precision, prefetch_recall).
    fields = sorted(n for n in dir(sparsekv.CacheStats)
                    if not n.startswith("_") and not callable(getattr(sparsekv.CacheStats, n)))
    assert sorted(as_dict) == fields
    for name in fields:
        if name not in ("layers", "total", "device_memory", "host_memory"):
            assert as_dict[name] == getattr(stats, name)
    assert as_dict["total"] == stats.total.to_dict()
    # Memory by use: dicts of their parts, which add up.
    assert as_dict["device_memory"] == stats.device_memory.to_dict()
    assert as_dict["host_memory"] == stats.host_memory.to_dict()
    assert stats.device_memory.sum() == stats.device_bytes
    assert sum(as_dict["device_memory"].values()) == stats.device_bytes
    assert stats.host_memory.sum() == stats.host_memory.total
    assert stats.host_memory.private_pages > 0 and not stats.host_memory.node_pool
    assert len(as_dict["layers"]) == len(LAYERS)
    assert stats.host_pages_total == d.options.host_capacity_tokens // PAGE
    assert stats.device_bytes > 0
    assert stats.prefetch_precision() == 0.0 and stats.prefetch_recall() == 0.0  # no prefetch
    m.reset_stats()
    cleared = m.read_stats()
    for name in ("bytes_host_to_device", "bytes_device_to_host", "bytes_assembled",
                 "bytes_ingested", "prefix_lookup_tokens", "prefix_hit_tokens",
                 "copy_on_write_pages", "evictions", "evicted_pages", "prefetch_lookups",
                 "prefetch_rows", "prefetch_useful_rows", "prefetch_wasted_rows",
                 "prefetch_missed_rows", "invalid_copy_entries"):
        assert getattr(cleared, name) == 0, name
    assert cleared.total.hits + cleared.total.misses + cleared.total.window_hits == 0
    assert cleared.hot_blocks_used == 1  # a gauge: not reset



def test_a_step_that_cannot_miss_may_skip_its_miss_copies():
    paged = dict(hybrid_residency=True, resident_page_rows=5)
    probe = sparsekv.choose_hot_cache_shape(make_options(**paged))
    m = sparsekv.SparseKVCacheManager(
        make_options(device_budget_bytes=3 * probe.block_bytes, **paged), sparsekv.cpu_backend())

    def admit(rid, length, max_new_tokens):
        m.admit(rid, length, max_new_tokens)
        for layer, (_, stride) in enumerate(LAYERS):
            m.ingest_prompt(rid, layer, np.zeros((length, stride), np.uint8))

    def step(batch, skip):
        m.plan_step(batch)
        can_miss = m.step_can_miss()
        for layer, (_, stride) in enumerate(LAYERS):
            m.append_token(layer, np.zeros((len(batch), stride), np.uint8))
            slots = np.zeros((len(batch), TOP_K), np.int32)
            m.resolve_layer(layer, np.zeros((len(batch), TOP_K), np.int32), slots)
            if skip:
                m.skip_miss_copy(layer)
            else:
                m.copy_misses(layer)
        m.finish_step()
        return can_miss

    admit(1, 6, 6)  # 12 positions: 3 of the 6 pages
    assert m.is_resident(1)
    assert not step([1], skip=True)  # every layer counts as copied: finish_step accepts it
    admit(2, 7, 9)  # in hot-cache mode
    assert not m.is_resident(2)
    m.plan_step([1, 2])
    assert m.step_can_miss()
    m.append_token(0, np.zeros((2, LAYERS[0][1]), np.uint8))
    m.resolve_layer(0, np.zeros((2, TOP_K), np.int32), np.zeros((2, TOP_K), np.int32))
    with pytest.raises(sparsekv.FailedPreconditionError, match="the step can miss"):
        m.skip_miss_copy(0)
    m.copy_misses(0)  # the refusal marked nothing
    m.append_token(1, np.zeros((2, LAYERS[1][1]), np.uint8))
    m.resolve_layer(1, np.zeros((2, TOP_K), np.int32), np.zeros((2, TOP_K), np.int32))
    m.copy_misses(1)
    m.finish_step()


def test_hybrid_residency_promote_and_demote(arrays):
    # Blocks of 8 + 2 rows in pages of 5 positions (2 per block), a budget of 3 blocks: 6 pages.
    paged = dict(hybrid_residency=True, resident_page_rows=5)
    probe = sparsekv.choose_hot_cache_shape(make_options(**paged))
    assert probe.blocks == 3 and probe.hot_slots == 8 and probe.pages == 6
    assert probe.page_rows == 5 and probe.keys_per_page == 0
    d = Driver(arrays, seed=6, device_budget_bytes=3 * probe.block_bytes, **paged)
    m = d.m
    d.admit(1, d.prompt(6), max_new_tokens=6)  # 12 positions: 3 of the 6 pages
    assert m.is_resident(1)
    d.admit(2, d.prompt(7), max_new_tokens=9)  # 16 positions: 4 pages do not fit, a block does
    assert not m.is_resident(2)
    d.step([1, 2])
    d.step([2, 1], split=True)
    stats = m.read_stats()
    assert stats.resident_requests == 1 and stats.total.resident_hits > 0
    total = stats.total
    assert (total.hits + total.window_hits + total.misses + total.padding + total.resident_hits
            == d.entries)
    # A third request needs a block: request 1 is demoted (its rows reloaded from the pool).
    d.admit(3, d.prompt(5), max_new_tokens=3)
    assert not m.is_resident(1) and m.read_stats().demotions == 1
    d.step([1, 2, 3])
    m.release(3)
    m.promote(2)  # its own block and request 3's hold its 4 pages
    assert m.is_resident(2) and m.read_stats().promotions == 1
    d.step([1, 2])
    with pytest.raises(sparsekv.FailedPreconditionError, match="resident"):
        m.promote(2)
    with pytest.raises(sparsekv.ResourceExhaustedError):
        m.promote(1)
    m.retract(2)
    m.resume(2)  # back resident: its pages are free again
    assert m.is_resident(2)
    d.step([2, 1])
    assert "resident_hits" in m.read_stats().total.to_dict()
    assert m.read_stats().to_dict()["demotions"] == 1
    m.release(1)
    m.release(2)
    assert m.read_stats().resident_requests == 0


def test_a_refused_step_changes_nothing(arrays):
    """plan_step refused after requests that would plan (unknown, twice, token ids of another
    length) raises and changes nothing, and the same batch then plans and reads right;
    finish_replayed_step with a prefetch resolved and not copied raises and keeps the step open."""
    d = Driver(arrays, seed=9, max_prefetch=2)
    for rid in (1, 2):
        d.admit(rid, d.prompt(6), max_new_tokens=8)
    d.step([1, 2])  # a complete run phase: a replay has bytes to count

    def observed():
        s = d.m.read_stats()
        return ([d.m.sequence_length(rid) for rid in (1, 2)],
                [d.m.host_pages(rid) for rid in (1, 2)],
                s.bytes_device_to_host, s.host_pages_used, s.hot_blocks_used, s.device_bytes)

    before = observed()
    with pytest.raises(sparsekv.NotFoundError):
        d.m.plan_step([1, 2, 9])
    with pytest.raises(sparsekv.InvalidArgumentError, match="twice"):
        d.m.plan_step([1, 2, 1])
    with pytest.raises(sparsekv.InvalidArgumentError, match="token ids"):
        d.m.plan_step([1, 2], token_ids=[5])
    assert observed() == before
    d.step([1, 2])

    d.m.plan_step([1])
    positions = d.a.to_device(np.zeros((d.max_batch, 2), np.int32))
    d.m.resolve_prefetch(0, positions)
    with pytest.raises(sparsekv.FailedPreconditionError, match="has no CopyPrefetch"):
        d.m.finish_replayed_step()
    assert d.m.batch_size == 1  # the step is still open
    d.m.copy_prefetch(0)
    d.m.finish_replayed_step()
    assert d.m.sequence_length(1) == before[0][0] + 2
