"""Node pools on the CPU backend: a prompt written and sealed by another process (a Python child
process attached to the same segment in /dev/shm) is admitted without copying and every row a
step returns is the one written; ended seals raise; the adapter admits from a node pool."""

import gc
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import sparsekv
from conftest import LAYERS, TOP_K, make_options, run_step

PROMPT = 13  # 3 full pages of 4 tokens and a partial one


def prompt_rows(seed):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, (PROMPT, stride), dtype=np.uint8) for _, stride in LAYERS]


def unique_name(tag):
    return f"sparsekv-pytest-{os.getpid()}-{tag}"


# The writer: creates the pool, writes and seals a prompt, reports it, releases it when its stdin
# closes, and exits (detaching).
WRITER = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import sparsekv
    sys.path.insert(0, sys.argv[3])
    from conftest import make_options
    from test_node_pool import PROMPT, prompt_rows
    pool = sparsekv.NodePool.create(make_options(), 8, sys.argv[1], sparsekv.cpu_backend())
    owner = pool.acquire_owner()
    pool.reserve(owner, PROMPT)
    for layer, rows in enumerate(prompt_rows(int(sys.argv[2]))):
        pool.write_prompt_layer(owner, layer, rows, PROMPT)
    seal = pool.seal(owner, PROMPT)
    print(json.dumps({"path": pool.path, "owner": owner, "seal": seal}), flush=True)
    sys.stdin.read()
    pool.release(owner)
    pool.release_owner(owner)
    print("released", flush=True)
    """
)


def start_writer(name, seed):
    here = os.path.dirname(os.path.abspath(__file__))
    child = subprocess.Popen(
        [sys.executable, "-c", WRITER, name, str(seed), here],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    return child, json.loads(child.stdout.readline())


def test_a_prompt_sealed_by_another_process_is_admitted_without_copying():
    name = unique_name("cross")
    child, sealed = start_writer(name, seed=3)
    try:
        backend = sparsekv.cpu_backend()
        pool = sparsekv.NodePool.open(sealed["path"], backend)
        assert pool.live_processes == 2
        manager = sparsekv.SparseKVCacheManager(pool.with_shape(make_options()), backend, pool=pool)
        manager.admit_from_node_pool(1, sealed["owner"], sealed["seal"], 8)
        assert manager.sequence_length(1) == PROMPT
        assert manager.read_stats().bytes_ingested == 0
        rows = prompt_rows(3)
        for step in range(4):
            positions = np.array([[p % PROMPT for p in range(step, step + TOP_K)]], np.int32)
            got = run_step(manager, 1, positions)
            for layer, (nbytes, _) in enumerate(LAYERS):
                want = rows[layer][positions[0]]
                np.testing.assert_array_equal(got[layer][:, :nbytes], want[:, :nbytes])
            if step == 1:  # the writer releases its prompt and exits: the pages stay
                child.stdin.close()
                assert child.stdout.readline().strip() == "released"
                assert child.wait(timeout=30) == 0
        # The seal ended with the writer's release.
        with pytest.raises(sparsekv.NotFoundError):
            manager.admit_from_node_pool(2, sealed["owner"], sealed["seal"], 8)
        manager.release(1)
        assert pool.free_pages == pool.total_pages
        del manager, pool
        assert not os.path.exists(sealed["path"])  # the last process to detach removed it
    finally:
        if child.poll() is None:
            child.kill()
        if os.path.exists(f"/dev/shm/{name}"):
            os.remove(f"/dev/shm/{name}")


def test_node_pool_errors():
    backend = sparsekv.cpu_backend()
    name = unique_name("errors")
    pool = sparsekv.NodePool.create(make_options(), 4, name, backend)
    try:
        with pytest.raises(sparsekv.AlreadyExistsError):
            sparsekv.NodePool.create(make_options(), 4, name, backend)
        with pytest.raises(sparsekv.NotFoundError):
            sparsekv.NodePool.open(pool.path + "-none", backend)
        with pytest.raises(sparsekv.InvalidArgumentError):
            sparsekv.NodePool.create(make_options(), 4, "a/b", backend)
        assert pool.descriptor.startswith("sparsekv-node-pool/1 id=")
        owner = pool.acquire_owner()
        pool.reserve(owner, 8)
        with pytest.raises(ValueError, match="rows"):
            pool.write_prompt_layer(owner, 0, np.zeros((7, LAYERS[0][1]), np.uint8), 8)
        with pytest.raises(sparsekv.OutOfRangeError):
            pool.seal(owner, 9)
        seal = pool.seal(owner, 8)
        manager = sparsekv.SparseKVCacheManager(pool.with_shape(make_options()), backend, pool=pool)
        with pytest.raises(sparsekv.NotFoundError):
            manager.admit_from_node_pool(1, owner, seal + 1, 4)
        with pytest.raises(sparsekv.InvalidArgumentError):
            manager.admit_from_node_pool(1, owner, seal, -1)
        with pytest.raises(sparsekv.InvalidArgumentError, match="differ"):
            sparsekv.SparseKVCacheManager(make_options(host_page_tokens=8), backend, pool=pool)
        manager.admit_from_node_pool(1, owner, seal, 4)
        pool.release(owner)
        with pytest.raises(ValueError, match="holds pages"):
            pool.release_owner(owner + 1 if owner + 1 < 4 else 0)
        pool.release_owner(owner)
        assert pool.reclaim_dead_processes() == 0
    finally:
        del pool
        if os.path.exists(f"/dev/shm/{name}"):
            os.remove(f"/dev/shm/{name}")


def test_sglang_adapter_admits_a_node_pool_prompt():
    torch = pytest.importorskip("torch")
    from sparsekv.sglang_adapter import RequestInfo, SparseKVCoordinator

    backend = sparsekv.cpu_backend()
    name = unique_name("adapter")
    pool = sparsekv.NodePool.create(make_options(), 4, name, backend)
    owner = pool.acquire_owner()
    pool.reserve(owner, PROMPT)
    rows = prompt_rows(9)
    for layer, layer_rows in enumerate(rows):
        pool.write_prompt_layer(owner, layer, layer_rows, PROMPT)
    seal = pool.seal(owner, PROMPT)
    manager = sparsekv.SparseKVCacheManager(pool.with_shape(make_options()), backend, pool=pool)

    def never_called(req, layer):
        raise AssertionError("a node pool prompt is not ingested")

    coordinator = SparseKVCoordinator(
        manager,
        request_info=lambda req: RequestInfo("r", 0, PROMPT, 8, node_pool_prompt=(owner, seal)),
        prompt_kv=never_called,
    )
    coordinator.admit_request_into_staging("req")
    assert coordinator.collect_ready_reqs() == ["req"]
    rid = coordinator._ids_by_key["r"]
    seq_lens = torch.tensor([PROMPT + 1])
    pool_idx = torch.tensor([0])
    coordinator.map_last_loc_to_buffer(seq_lens, None, pool_idx, seq_lens, pool_idx)
    for layer, (nbytes, stride) in enumerate(LAYERS):
        coordinator.append_token_kv(layer, torch.zeros(1, stride, dtype=torch.uint8))
        topk = torch.arange(TOP_K, dtype=torch.int32).reshape(1, TOP_K)
        slots = coordinator.swap_in_selected_pages(pool_idx, seq_lens, topk, layer)
        kv = coordinator.layer_kv(layer)
        for k in range(TOP_K):
            np.testing.assert_array_equal(kv[slots[0, k], :nbytes].numpy(), rows[layer][k, :nbytes])
    coordinator.request_finished("req")
    with pytest.raises(sparsekv.NotFoundError):
        manager.sequence_length(rid)
    pool.release(owner)
    pool.release_owner(owner)
    # The hot layers' tensors keep the manager (and so the pool) alive.
    del kv, slots, coordinator, manager, pool
    gc.collect()
    assert not os.path.exists(f"/dev/shm/{name}")
