"""The binding on the CPU backend with torch CPU tensors (the DLPack path), and the adapter."""

import numpy as np
import pytest

import sparsekv
from conftest import LAYERS, TOP_K, make_options
from resolve_oracle import ReferenceManager, clock_of, protected_capacity_of
from workload import Flavour, run_workload

torch = pytest.importorskip("torch")


def torch_cpu() -> Flavour:
    return Flavour(torch.from_numpy, lambda t: t.numpy(), lambda v: np.array(np.asarray(v)))


@pytest.mark.parametrize("seed", [5, 6])
def test_resolve_matches_reference(manager, seed):
    run_workload(manager, torch_cpu(), seed)


def test_bf16_rows_and_errors(manager):
    manager.admit(1, 4, 4)
    manager.ingest_prompt(1, 0, torch.zeros(4, 8, dtype=torch.bfloat16))  # 16 B rows
    manager.ingest_prompt(1, 1, torch.zeros(4, 12, dtype=torch.bfloat16))  # 24 B rows
    manager.plan_step([1])
    manager.append_token(0, torch.zeros(1, 8, dtype=torch.bfloat16))
    slots = torch.zeros(1, TOP_K, dtype=torch.int32)
    with pytest.raises(TypeError, match="int32"):
        manager.run_layer(0, torch.zeros(1, TOP_K, dtype=torch.int64), slots)
    with pytest.raises(ValueError, match="C-contiguous"):
        manager.run_layer(0, torch.zeros(TOP_K, 2, dtype=torch.int32).t(), slots)
    with pytest.raises(ValueError, match="C-contiguous"):
        manager.run_layer(0, torch.zeros(1, TOP_K, dtype=torch.int32),
                          torch.zeros(1, 2 * TOP_K, dtype=torch.int32)[:, ::2])
    manager.run_layer(0, torch.zeros(1, TOP_K, dtype=torch.int32), slots)
    assert slots[0, 0].item() >= 0


def test_hot_layer_through_torch_from_dlpack(manager):
    view = manager.hot_layer(0)
    t = torch.from_dlpack(view)
    assert t.shape == (view.rows, view.row_stride) and t.dtype == torch.uint8
    assert t.data_ptr() == view.data_ptr and t.device.type == "cpu"
    # A view, not a copy: the manager's writes show through, and the tensor keeps it alive.
    manager.admit(1, 4, 4)
    manager.ingest_prompt(1, 0, torch.full((4, 16), 7, dtype=torch.uint8))
    del view, manager
    assert t.shape[0] > 0 and int(t.sum()) >= 0


class FakeReq:
    """The fields of an engine request the adapter reads (through request_info)."""

    def __init__(self, rid, pool_idx, prompt):
        self.rid, self.req_pool_idx, self.prompt = rid, pool_idx, prompt


def request_info(req):
    from sparsekv.sglang_adapter import RequestInfo

    return RequestInfo(req.rid, req.req_pool_idx, req.prompt[0].shape[0], 16)


# The serial schedule makes the manager's calls in the same order: the same slots.
@pytest.mark.parametrize("schedule", [None, "serial"])
def test_sglang_adapter_drives_steps_like_an_engine(schedule):
    from sparsekv.sglang_adapter import SparseKVCoordinator

    options = make_options()
    manager = sparsekv.SparseKVCacheManager(options, sparsekv.cpu_backend())
    coordinator = SparseKVCoordinator(
        manager, request_info=request_info, prompt_kv=lambda req, layer: req.prompt[layer],
        schedule=schedule)
    ref = ReferenceManager(options.hot_slots, options.window, options.max_requests, len(LAYERS),
                           protected_capacity_of(options), clock_of(options))
    rng = np.random.default_rng(7)

    def new_req(rid, pool_idx, prompt_len):
        prompt = [rng.integers(0, 256, (prompt_len, s), dtype=np.uint8) for _, s in LAYERS]
        return FakeReq(rid, pool_idx, [torch.from_numpy(p) for p in prompt])

    reqs = {0: new_req("a", 3, 9), 1: new_req("b", 0, 14)}
    for req in reqs.values():
        coordinator.admit_request_into_staging(req)
        ref.admit(coordinator._ids_by_key[req.rid], [p.numpy() for p in req.prompt])
    coordinator.request_finished(FakeReq("never-admitted", 1, [np.zeros((1, 1))]))
    assert coordinator.has_ongoing_staging()
    assert coordinator.collect_ready_reqs() == list(reqs.values())
    assert not coordinator.has_ongoing_staging()

    for step in range(12):
        batch = [reqs[i] for i in sorted(reqs)]
        ids = [coordinator._ids_by_key[r.rid] for r in batch]
        pool = torch.tensor([r.req_pool_idx for r in batch])
        seq_lens = torch.tensor([manager.sequence_length(i) + 1 for i in ids])
        coordinator.map_last_loc_to_buffer(seq_lens, None, pool, seq_lens, pool)
        ref.plan(ids)
        for layer, (nbytes, stride) in enumerate(LAYERS):
            new_rows = rng.integers(0, 256, (len(batch), stride), dtype=np.uint8)
            coordinator.append_token_kv(layer, torch.from_numpy(new_rows))
            ref.append(layer, new_rows)
            lengths = [ref.requests[i].history[layer].shape[0] for i in ids]
            topk = np.stack([rng.integers(-1, n, TOP_K) for n in lengths]).astype(np.int32)
            slots = coordinator.swap_in_selected_pages(pool, seq_lens, torch.from_numpy(topk),
                                                       layer)
            want = ref.resolve(layer, topk, TOP_K)
            np.testing.assert_array_equal(slots.numpy(), want)
            kv = coordinator.layer_kv(layer)
            for b, i in enumerate(ids):
                for k in range(TOP_K):
                    if want[b, k] >= 0:
                        np.testing.assert_array_equal(
                            kv[want[b, k], :nbytes].numpy(),
                            ref.row(i, layer, int(topk[b, k]))[:nbytes])
        if step == 4:  # retract "b" (its pool row is given back), re-admit it with its history
            coordinator.retract_req(reqs[1])
            ref.retract(ids[1])
            next_lens = seq_lens + 1
            with pytest.raises(LookupError, match="pool row 0"):
                coordinator.map_last_loc_to_buffer(next_lens, None, pool, next_lens, pool)
            reqs[1].req_pool_idx = 5
            reqs[1].prompt = [torch.zeros(manager.sequence_length(ids[1]), 1)] * len(LAYERS)
            coordinator.admit_request_into_staging(reqs[1])
            ref.resume(ids[1])
            assert coordinator.collect_ready_reqs() == [reqs[1]]
        if step == 8:  # "a" finishes; a new request takes its pool row
            coordinator.request_finished(reqs[0])
            ref.release(ids[0])
            reqs[0] = new_req("c", 3, 5)
            coordinator.admit_request_into_staging(reqs[0])
            ref.admit(coordinator._ids_by_key["c"], [p.numpy() for p in reqs[0].prompt])
            coordinator.collect_ready_reqs()

    stale = torch.tensor([manager.sequence_length(coordinator._ids_by_key["c"])])
    with pytest.raises(ValueError, match="engine's length"):
        coordinator.map_last_loc_to_buffer(stale, None, torch.tensor([3]), stale,
                                           torch.tensor([3]))


@pytest.mark.parametrize("schedule", ["auto", "prefetch"])
def test_sglang_adapter_runs_the_schedule_through_the_same_calls(schedule):
    """With the cross-layer prefetch among the choices the slots differ from the plain calls',
    so the rows they index are checked against the prompt and the appended rows."""
    from sparsekv.sglang_adapter import SparseKVCoordinator

    options = make_options(max_prefetch=TOP_K)
    manager = sparsekv.SparseKVCacheManager(options, sparsekv.cpu_backend())
    coordinator = SparseKVCoordinator(
        manager, request_info=request_info, prompt_kv=lambda req, layer: req.prompt[layer],
        schedule=schedule)
    rng = np.random.default_rng(9)
    reqs = []
    for i, prompt_len in enumerate([7, 12, 20]):
        prompt = [rng.integers(0, 256, (prompt_len, s), dtype=np.uint8) for _, s in LAYERS]
        reqs.append(FakeReq(f"r{i}", 4 + i, [torch.from_numpy(p) for p in prompt]))
        coordinator.admit_request_into_staging(reqs[-1])
    coordinator.collect_ready_reqs()
    history = {r.rid: [[row for row in p.numpy()] for p in r.prompt] for r in reqs}
    for _ in range(15):
        ids = [coordinator._ids_by_key[r.rid] for r in reqs]
        pool = torch.tensor([r.req_pool_idx for r in reqs])
        seq_lens = torch.tensor([manager.sequence_length(i) + 1 for i in ids])
        coordinator.map_last_loc_to_buffer(seq_lens, None, pool, seq_lens, pool)
        for layer, (nbytes, stride) in enumerate(LAYERS):
            new_rows = rng.integers(0, 256, (len(reqs), stride), dtype=np.uint8)
            coordinator.append_token_kv(layer, torch.from_numpy(new_rows))
            for b, r in enumerate(reqs):
                history[r.rid][layer].append(new_rows[b])
            lengths = [len(history[r.rid][layer]) for r in reqs]
            topk = np.stack([rng.choice(n, TOP_K, replace=n < TOP_K) for n in lengths])
            slots = coordinator.swap_in_selected_pages(pool, seq_lens,
                                                       torch.from_numpy(topk.astype(np.int32)),
                                                       layer).numpy()
            kv = coordinator.layer_kv(layer).numpy()
            for b, r in enumerate(reqs):
                seen = set()
                for k in range(TOP_K):
                    p = int(topk[b, k])
                    if p in seen:
                        assert slots[b, k] == -1
                        continue
                    seen.add(p)
                    np.testing.assert_array_equal(kv[slots[b, k], :nbytes],
                                                  history[r.rid][layer][p][:nbytes])
    stats = coordinator.schedule.stats()
    assert stats.steps == 15
    assert set(stats.steps_by_choice) <= {"serial", "prefetch", "prefetch:16"}
    if schedule == "prefetch":
        assert manager.read_stats().prefetch_rows > 0


def test_sglang_adapter_refuses_a_schedule_with_attention_slices():
    from sparsekv.sglang_adapter import SparseKVCoordinator

    manager = sparsekv.SparseKVCacheManager(make_options(copy_chunk_rows=1),
                                            sparsekv.cpu_backend())
    with pytest.raises(ValueError, match="attention slices"):
        SparseKVCoordinator(manager, request_info=request_info,
                            prompt_kv=lambda req, layer: req.prompt[layer], schedule="chunks1")


def test_adapter_readmits_a_recomputed_request():
    from sparsekv.sglang_adapter import SparseKVCoordinator

    manager = sparsekv.SparseKVCacheManager(make_options(), sparsekv.cpu_backend())
    prompts = {n: [torch.zeros(n, s, dtype=torch.uint8) for _, s in LAYERS] for n in (6, 9)}
    req = FakeReq("r", 2, prompts[6])
    coordinator = SparseKVCoordinator(
        manager, request_info=request_info, prompt_kv=lambda r, layer: r.prompt[layer])
    coordinator.admit_request_into_staging(req)
    first_id = coordinator._ids_by_key["r"]
    coordinator.retract_req(req)
    req.prompt = prompts[9]  # the engine recomputed prompt + output: a longer prompt
    coordinator.admit_request_into_staging(req)
    assert coordinator._ids_by_key["r"] != first_id
    with pytest.raises(sparsekv.NotFoundError):
        manager.sequence_length(first_id)
    assert manager.read_stats().hot_blocks_used == 1


def test_adapter_reuses_a_prefix_and_retains_finished_conversations():
    from sparsekv.sglang_adapter import RequestInfo, SparseKVCoordinator

    manager = sparsekv.SparseKVCacheManager(make_options(), sparsekv.cpu_backend())
    rng = np.random.default_rng(9)
    # Each FakeReq carries its token ids; its prompt rows are the KV of its first prompt_len ids.
    coordinator = SparseKVCoordinator(
        manager,
        request_info=lambda r: RequestInfo(r.rid, r.req_pool_idx, r.prompt[0].shape[0], 8,
                                           r.token_ids),
        prompt_kv=lambda r, layer: r.prompt[layer], retain_finished=True)

    def rows(n, layer):
        return rng.integers(0, 256, (n, LAYERS[layer][1]), dtype=np.uint8)

    def decode(req, history):
        """One step of `req` appending token id token_ids[len]; checks every position."""
        request_id = coordinator._ids_by_key[req.rid]
        length = manager.sequence_length(request_id) + 1
        lens = torch.tensor([length])
        pool = torch.tensor([req.req_pool_idx])
        coordinator.map_last_loc_to_buffer(lens, None, pool, lens, pool)
        for layer, (nbytes, _) in enumerate(LAYERS):
            new_rows = rows(1, layer)
            history[layer] = np.vstack([history[layer], new_rows])
            coordinator.append_token_kv(layer, torch.from_numpy(new_rows))
            topk = np.full((1, TOP_K), -1, np.int32)
            picked = rng.choice(length, size=min(length, TOP_K), replace=False)
            topk[0, :len(picked)] = picked
            slots = coordinator.swap_in_selected_pages(pool, lens, torch.from_numpy(topk), layer)
            kv = coordinator.layer_kv(layer)
            for k, position in enumerate(picked):
                np.testing.assert_array_equal(kv[int(slots[0, k]), :nbytes].numpy(),
                                              history[layer][position, :nbytes])

    # Turn 1: 6 prompt tokens and 2 generated ones fill two host pages (4 tokens each).
    turn1 = FakeReq("turn-1", 0, None)
    history1 = [rows(6, layer) for layer in range(len(LAYERS))]
    turn1.prompt = [torch.from_numpy(h) for h in history1]
    turn1.token_ids = list(range(50, 58))  # the ids the engine has after two decode steps
    coordinator.admit_request_into_staging(turn1)
    decode(turn1, history1)
    decode(turn1, history1)
    coordinator.request_finished(turn1)  # retained: its two full pages stay
    stats = manager.read_stats()
    assert stats.retained_conversations == 1 and stats.hot_blocks_used == 0

    # Turn 2 starts with all of turn 1: only the 3 new prompt tokens are ingested.
    turn2 = FakeReq("turn-2", 1, None)
    suffix = [rows(3, layer) for layer in range(len(LAYERS))]
    # Rows of the cached positions are never read: garbage there must not show.
    turn2.prompt = [torch.from_numpy(np.vstack([np.full_like(h, 0xEE), s]))
                    for h, s in zip(history1, suffix)]
    turn2.token_ids = turn1.token_ids + [60, 61, 62, 63]
    coordinator.admit_request_into_staging(turn2)
    stats = manager.read_stats()
    assert stats.prefix_hit_tokens == 8 and stats.pages_shared == 2
    assert stats.bytes_ingested == (6 + 3) * sum(b for b, _ in LAYERS)
    history2 = [np.vstack([h, s]) for h, s in zip(history1, suffix)]
    decode(turn2, history2)
    coordinator.request_finished(turn2)
    assert manager.read_stats().retained_conversations == 2
    assert manager.evict_retained() == 2
