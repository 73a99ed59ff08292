"""The binding on the CUDA backend with torch CUDA tensors, including torch.cuda.CUDAGraph capture.

Skipped unless torch sees a GPU and the library was built with the CUDA backend.
"""

import numpy as np
import pytest

import sparsekv
from conftest import LAYERS, TOP_K, make_options
from workload import Flavour, run_workload

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(
    not (torch.cuda.is_available() and sparsekv.cuda_compiled()),
    reason="needs a CUDA GPU and sparsekv built with the CUDA backend")


def hot_to_numpy(view):
    return torch.as_tensor(view, device="cuda").cpu().numpy()


def torch_cuda() -> Flavour:
    return Flavour(lambda a: torch.from_numpy(a).cuda(), lambda t: t.cpu().numpy(), hot_to_numpy)


class CudaArrayInterfaceOnly:
    """A device array that speaks only __cuda_array_interface__ (as Numba's do)."""

    def __init__(self, tensor):
        self.tensor = tensor
        self.__cuda_array_interface__ = tensor.__cuda_array_interface__


def cuda_manager():
    return sparsekv.SparseKVCacheManager(make_options(), sparsekv.cuda_backend(0))


@pytest.mark.parametrize("seed", [11, 12])
def test_resolve_matches_reference(seed):
    run_workload(cuda_manager(), torch_cuda(), seed)


def test_copies_on_a_two_block_grid_match_reference():
    manager = sparsekv.SparseKVCacheManager(make_options(copy_blocks=2), sparsekv.cuda_backend(0))
    run_workload(manager, torch_cuda(), seed=15, steps=10)


def test_cuda_array_interface_path():
    flavour = Flavour(lambda a: CudaArrayInterfaceOnly(torch.from_numpy(a).cuda()),
                      lambda t: t.tensor.cpu().numpy(), hot_to_numpy)
    run_workload(cuda_manager(), flavour, seed=13, steps=10)


def test_cupy_arrays():
    cupy = pytest.importorskip("cupy")
    flavour = Flavour(cupy.asarray, cupy.asnumpy, hot_to_numpy)
    run_workload(cuda_manager(), flavour, seed=14, steps=10)


def test_device_checks_and_host_ingest():
    manager = cuda_manager()
    manager.admit(1, 5, 4)
    manager.ingest_prompt(1, 0, torch.zeros(5, LAYERS[0][1], dtype=torch.uint8))  # host: fine
    manager.ingest_prompt(1, 1, torch.zeros(5, LAYERS[1][1], dtype=torch.uint8, device="cuda"))
    manager.plan_step([1])
    with pytest.raises(ValueError, match="needs a tensor on cuda:0, got host memory"):
        manager.append_token(0, torch.zeros(1, LAYERS[0][1], dtype=torch.uint8))
    manager.append_token(0, torch.zeros(1, LAYERS[0][1], dtype=torch.uint8, device="cuda"))
    with pytest.raises(ValueError, match="host memory"):
        manager.run_layer(0, np.zeros((1, TOP_K), np.int32),
                          torch.zeros(1, TOP_K, dtype=torch.int32, device="cuda"))
    assert torch.as_tensor(manager.hot_layer(0), device="cuda").is_cuda


def test_cpu_backend_rejects_cuda_tensors(manager):
    manager.admit(1, 5, 4)
    with pytest.raises(ValueError, match="CPU backend needs a host tensor, got cuda:0"):
        manager.ingest_prompt(1, 0, torch.zeros(5, LAYERS[0][1], dtype=torch.uint8,
                                                device="cuda"))


def test_captured_steps_match_eager_steps():
    """Two managers see the same workload; one runs eagerly, the other replays one captured
    torch.cuda.CUDAGraph of the run phase with new inputs every step."""
    rng = np.random.default_rng(21)
    eager, graphed = cuda_manager(), cuda_manager()
    max_batch = eager.options.effective_max_batch
    for rid, n in ((1, 9), (2, 17), (3, 4)):
        prompt = [torch.from_numpy(rng.integers(0, 256, (n, s), dtype=np.uint8)).cuda()
                  for _, s in LAYERS]
        for m in (eager, graphed):
            m.admit(rid, n, 40)
            for layer, rows in enumerate(prompt):
                m.ingest_prompt(rid, layer, rows)

    def buffers():
        return ([torch.zeros(max_batch, s, dtype=torch.uint8, device="cuda") for _, s in LAYERS],
                [torch.full((max_batch, TOP_K), -1, dtype=torch.int32, device="cuda")
                 for _ in LAYERS],
                [torch.zeros(max_batch, TOP_K, dtype=torch.int32, device="cuda")
                 for _ in LAYERS])

    def run_phase(m, new_rows, topk, slots):
        for layer in range(len(LAYERS)):
            m.append_token(layer, new_rows[layer])
            m.run_layer(layer, topk[layer], slots[layer])
        m.finish_step()

    static = buffers()
    graph = torch.cuda.CUDAGraph()
    for step in range(12):
        batch = [1, 2, 3] if step < 6 else [3, 1]  # the batch shrinks under the same graph
        inputs = buffers()
        for layer, (_, s) in enumerate(LAYERS):
            inputs[0][layer][:] = torch.from_numpy(
                rng.integers(0, 256, (max_batch, s), dtype=np.uint8))
            lengths = [eager.sequence_length(r) + 1 for r in batch]
            for b, n in enumerate(lengths):
                inputs[1][layer][b] = torch.from_numpy(rng.integers(-1, n, TOP_K).astype(np.int32))
        for m in (eager, graphed):
            m.plan_step(batch)
        run_phase(eager, *inputs)
        for dst, src in zip(static, inputs):
            for d, s in zip(dst, src):
                d.copy_(s)
        if step == 0:
            with torch.cuda.graph(graph):
                run_phase(graphed, *static)
            graph.replay()
        else:
            graph.replay()
            graphed.finish_replayed_step()
        for layer in range(len(LAYERS)):
            n = len(batch)
            assert torch.equal(inputs[2][layer][:n], static[2][layer][:n]), f"step {step}"
            nbytes = LAYERS[layer][0]
            a = torch.as_tensor(eager.hot_layer(layer), device="cuda")
            b = torch.as_tensor(graphed.hot_layer(layer), device="cuda")
            sl = inputs[2][layer][:n].clamp(min=0).long()
            assert torch.equal(a[sl][..., :nbytes], b[sl][..., :nbytes]), f"step {step}"
    se, sg = eager.read_stats(), graphed.read_stats()
    assert se.total.to_dict() == sg.total.to_dict()
    assert se.bytes_device_to_host == sg.bytes_device_to_host
