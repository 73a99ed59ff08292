"""The peer tier from Python: a PeerRegion lent in this process (the CPU backend shares device
memory within its process; on a GPU, the CUDA backend), a request admitted from it decodes with
every returned row equal to the one written, the rows read from the region are counted, and the
refusals raise the library's errors."""

import numpy as np
import pytest

import sparsekv
from conftest import LAYERS, TOP_K, make_options, run_step

PROMPT = 21  # 5 full pages of 4 tokens and a partial one
REGION_ROWS = 48


def prompt_rows(seed):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, (PROMPT, stride), dtype=np.uint8) for _, stride in LAYERS]


def test_a_request_admitted_from_a_peer_region_reads_its_rows():
    backend = sparsekv.cpu_backend()
    options = make_options()
    region = sparsekv.PeerRegion.create(options.geometry, REGION_ROWS, backend)
    assert region.rows == REGION_ROWS and region.generation > 0
    assert region.descriptor.startswith("sparsekv-peer-region/1 ")
    rows = prompt_rows(5)
    for layer, layer_rows in enumerate(rows):
        region.write_rows(layer, 10, layer_rows, PROMPT)
    manager = sparsekv.SparseKVCacheManager(options, backend)
    manager.attach_peer_tier()
    r = manager.import_peer_region(region.descriptor)
    manager.check_peer_region(r)
    manager.admit_from_peer(1, r, 10, PROMPT, 8)
    assert manager.sequence_length(1) == PROMPT
    for step in range(4):
        positions = np.array([[(7 * step + 3 * k) % PROMPT for k in range(TOP_K)]], np.int32)
        got = run_step(manager, 1, positions)
        for layer, (nbytes, _) in enumerate(LAYERS):
            want = rows[layer][positions[0]]
            np.testing.assert_array_equal(got[layer][:, :nbytes], want[:, :nbytes])
    assert manager.peer_rows_read() > 0
    manager.release(1)
    manager.detach_peer_region(r)
    with pytest.raises(sparsekv.NotFoundError):
        manager.check_peer_region(r)


def test_peer_tier_errors():
    backend = sparsekv.cpu_backend()
    options = make_options()
    region = sparsekv.PeerRegion.create(options.geometry, REGION_ROWS, backend)
    manager = sparsekv.SparseKVCacheManager(options, backend)
    with pytest.raises(sparsekv.FailedPreconditionError):
        manager.import_peer_region(region.descriptor)
    manager.attach_peer_tier()
    with pytest.raises(sparsekv.FailedPreconditionError):
        manager.attach_peer_tier()
    with pytest.raises(sparsekv.InvalidArgumentError):
        manager.import_peer_region("not a descriptor")
    r = manager.import_peer_region(region.descriptor)
    with pytest.raises(sparsekv.ResourceExhaustedError):
        manager.import_peer_region(region.descriptor)
    with pytest.raises(sparsekv.OutOfRangeError):
        manager.admit_from_peer(1, r, REGION_ROWS - 4, PROMPT, 8)
    with pytest.raises(sparsekv.NotFoundError):
        manager.sequence_length(1)  # nothing was left admitted
    with pytest.raises(sparsekv.NotFoundError):
        manager.map_peer_rows(1, r, 0, 8)
    with pytest.raises(sparsekv.OutOfRangeError):
        region.write_rows(0, REGION_ROWS - 1, np.zeros((2, LAYERS[0][1]), np.uint8), 2)
    with pytest.raises(ValueError, match="rows"):
        region.write_rows(0, 0, np.zeros((3, LAYERS[0][1]), np.uint8), 2)
    with pytest.raises(sparsekv.InvalidArgumentError):
        sparsekv.PeerRegion.create(options.geometry, 0, backend)


def have_gpu():
    if not sparsekv.cuda_compiled():
        return False
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


@pytest.mark.skipif(not have_gpu(), reason="needs the CUDA backend, torch and a GPU")
def test_a_cuda_manager_reads_a_region_of_the_same_gpu():
    import torch

    backend = sparsekv.cuda_backend(0)
    options = make_options()
    region = sparsekv.PeerRegion.create(options.geometry, REGION_ROWS, backend)
    rows = prompt_rows(6)
    for layer, layer_rows in enumerate(rows):
        region.write_rows(layer, 0, torch.from_numpy(layer_rows).cuda(), PROMPT)
    manager = sparsekv.SparseKVCacheManager(options, backend)
    manager.attach_peer_tier()
    r = manager.import_peer_region(region.descriptor)
    manager.admit_from_peer(1, r, 0, PROMPT, 8)
    manager.plan_step([1])
    positions = torch.tensor([[(3 * k) % PROMPT for k in range(TOP_K)]], dtype=torch.int32).cuda()
    for layer, (nbytes, stride) in enumerate(LAYERS):
        manager.append_token(layer, torch.zeros((1, stride), dtype=torch.uint8).cuda())
        slots = torch.zeros((1, TOP_K), dtype=torch.int32).cuda()
        assembled = torch.zeros((1, TOP_K, stride), dtype=torch.uint8).cuda()
        manager.run_layer(layer, positions, slots, assembled)
        want = rows[layer][positions[0].cpu().numpy()]
        np.testing.assert_array_equal(assembled[0].cpu().numpy()[:, :nbytes], want[:, :nbytes])
    manager.finish_step()
    assert manager.peer_rows_read() > 0


@pytest.mark.skipif(not have_gpu(), reason="needs the CUDA backend, torch and a GPU")
def test_a_destroyed_regions_descriptor_is_not_found_on_the_cuda_backend():
    # The descriptor of a region this process lent and then destroyed names no allocation: it is
    # refused before anything it describes is mapped or read (it once crashed the process).
    backend = sparsekv.cuda_backend(0)
    options = make_options()
    region = sparsekv.PeerRegion.create(options.geometry, REGION_ROWS, backend)
    descriptor = region.descriptor
    del region
    manager = sparsekv.SparseKVCacheManager(options, backend)
    manager.attach_peer_tier()
    with pytest.raises(sparsekv.NotFoundError):
        manager.import_peer_region(descriptor)
