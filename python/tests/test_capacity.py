"""Capacity checks: more than the machine has is refused at once, before anything is allocated."""

import os
import time

import pytest

import sparsekv


def huge_options(**overrides) -> sparsekv.CacheOptions:
    # 1000 layers of 1152-byte rows, 2^30 tokens: 1.24 PB, more than any machine has.
    fields = dict(geometry=sparsekv.KVGeometry.uniform(1000, 1152),
                  host_capacity_tokens=1 << 30, max_requests=4, max_context=1 << 20)
    fields.update(overrides)
    return sparsekv.CacheOptions(**fields)


def test_a_manager_larger_than_the_machine_is_refused_at_once():
    start = time.monotonic()
    with pytest.raises(sparsekv.ResourceExhaustedError,
                       match=r"host pool: host_capacity_tokens = 1073741824 .* needs 1\.24 PB of "
                             r"host memory, .* is available; lower host_capacity_tokens"):
        sparsekv.SparseKVCacheManager(huge_options(), sparsekv.cpu_backend())
    assert time.monotonic() - start < 1.0


def test_a_node_pool_larger_than_its_directory_is_refused_before_its_file_is_made(tmp_path):
    name = f"sparsekv-capacity-{os.getpid()}"
    with pytest.raises(sparsekv.ResourceExhaustedError, match=r"is free there; lower "
                                                              r"host_capacity_tokens"):
        sparsekv.NodePool.create(huge_options(), 4, name, sparsekv.cpu_backend(),
                                 directory=str(tmp_path))
    assert list(tmp_path.iterdir()) == []
