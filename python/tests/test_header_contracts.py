"""Sentences of the manager's documentation held to the code through the package (CPU backend).

Each test is a user's reproducer of a place where the code once did otherwise.
"""

from __future__ import annotations

import numpy as np
import pytest

import sparsekv


def manager(window: int = 1, page_tokens: int = 8, **kw) -> sparsekv.SparseKVCacheManager:
    o = sparsekv.CacheOptions(
        geometry=sparsekv.KVGeometry.uniform(1, 16), top_k=2, hot_slots=4, window=window,
        host_capacity_tokens=256, max_requests=4, max_context=32, host_page_tokens=page_tokens,
        **kw)
    return sparsekv.SparseKVCacheManager(o, sparsekv.cpu_backend())


@pytest.mark.parametrize("window", [1, 2, 3, 4])
def test_ingest_prompt_keeps_the_shared_prefix_rows(window: int) -> None:
    m = manager(window=window, page_tokens=4)
    a = np.arange(128, dtype=np.uint8).reshape(8, 16)
    m.admit_with_prefix(1, [1, 2, 3, 4, 5, 6, 7, 8], 4)
    m.ingest_prompt(1, 0, a)
    assert m.admit_with_prefix(2, [1, 2, 3, 4, 5, 6, 7, 8, 9], 4) == 8
    own = np.full((1, 16), 0x55, np.uint8)
    m.ingest_prompt(2, 0, np.vstack([np.full((8, 16), 0xEE, np.uint8), own]))
    m.plan_step([2], [10])
    m.append_token(0, np.zeros((4, 16), np.uint8))
    assembled = np.zeros((4, 2, 16), np.uint8)
    m.run_layer(0, np.array([[7, 8]] * 4, np.int32), np.zeros((4, 2), np.int32), assembled)
    m.finish_step()
    np.testing.assert_array_equal(assembled[0, 0], a[7])
    np.testing.assert_array_equal(assembled[0, 1], own[0])


@pytest.mark.parametrize("order", [[0, 1, 2, 3], [3, 2, 1, 0], [1, 0, 3, 2]])
def test_every_chunk_copies_once_in_any_order(order: list) -> None:
    m = manager(copy_chunk_rows=1)
    m.admit(1, 8, 8)
    m.ingest_prompt(1, 0, np.zeros((8, 16), np.uint8))
    m.plan_step([1])
    m.append_token(0, np.zeros((4, 16), np.uint8))
    m.resolve_layer(0, np.array([[0, 1]] * 4, np.int32), np.zeros((4, 2), np.int32))
    for chunk in order:
        m.copy_miss_chunk(0, chunk)
    with pytest.raises(sparsekv.FailedPreconditionError):
        m.copy_miss_chunk(0, order[0])
    m.finish_step()


def test_new_keys_are_ignored_without_indexer_keys() -> None:
    m = manager()
    m.admit(1, 8, 8)
    m.ingest_prompt(1, 0, np.zeros((8, 16), np.uint8))
    m.plan_step([1])
    m.append_token(0, np.zeros((4, 16), np.uint8), np.zeros((4, 4), np.uint8))


def test_empty_token_ids_for_a_batch_are_refused() -> None:
    m = manager(page_tokens=4)
    m.admit_with_prefix(1, list(range(1, 12)), 8)
    m.ingest_prompt(1, 0, np.zeros((11, 16), np.uint8))
    with pytest.raises(sparsekv.InvalidArgumentError):
        m.plan_step([1], [])
    # Nothing changed: the request keeps its ids, and the page its next token fills is retained.
    m.plan_step([1], [12])
    m.append_token(0, np.zeros((4, 16), np.uint8))
    m.run_layer(0, np.array([[0, 1]] * 4, np.int32), np.zeros((4, 2), np.int32))
    m.finish_step()
    assert m.retain(1) == 12
