"""Shared fixtures: a small geometry that exercises padded rows, paging, eviction and the window."""

import numpy as np
import pytest

import sparsekv

# Layer 1 has padding bytes (row_bytes < row_stride): only row_bytes are copied on a miss.
LAYERS = [(16, 16), (20, 24)]
TOP_K = 6
HOT_SLOTS = 8
WINDOW = 2
MAX_REQUESTS = 3
MAX_CONTEXT = 64


def make_options(**overrides) -> sparsekv.CacheOptions:
    fields = dict(
        geometry=sparsekv.KVGeometry([sparsekv.LayerShape(b, s) for b, s in LAYERS]),
        top_k=TOP_K,
        hot_slots=HOT_SLOTS,
        window=WINDOW,
        host_capacity_tokens=(MAX_REQUESTS + 1) * MAX_CONTEXT,
        max_requests=MAX_REQUESTS,
        max_host_requests=MAX_REQUESTS + 1,
        max_context=MAX_CONTEXT,
        host_page_tokens=4,
    )
    fields.update(overrides)
    return sparsekv.CacheOptions(**fields)


@pytest.fixture
def options() -> sparsekv.CacheOptions:
    return make_options()


@pytest.fixture
def manager(options) -> sparsekv.SparseKVCacheManager:
    return sparsekv.SparseKVCacheManager(options, sparsekv.cpu_backend())


def run_step(manager, rid, topk):
    """One step of request `rid` with the same top-k in every layer; returns the assembled rows."""
    manager.plan_step([rid])
    out = []
    for layer, (_, stride) in enumerate(LAYERS):
        manager.append_token(layer, np.zeros((1, stride), np.uint8))
        slots = np.zeros((1, TOP_K), np.int32)
        assembled = np.zeros((1, TOP_K, stride), np.uint8)
        manager.run_layer(layer, topk, slots, assembled)
        out.append(assembled[0])
    manager.finish_step()
    return out
