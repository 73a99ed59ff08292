"""StepSchedule from Python: every choice reads the rows written (a numpy dense model is the
oracle; the CPU backend runs each call at once, so the attention callable can read the hot cache
when it is called), the automatic schedule measures and keeps a choice, and bad calls raise.

On a GPU with torch, the same checks run on the CUDA backend, eagerly and captured into one
torch.cuda.CUDAGraph per choice; the attention callable then enqueues a copy of the slots' rows.
"""

import numpy as np
import pytest

import sparsekv
from conftest import LAYERS, TOP_K, make_options

REQUESTS = 3


def schedule_options(**overrides):
    fields = dict(copy_chunk_rows=1, max_prefetch=TOP_K)
    fields.update(overrides)
    return make_options(**fields)


class Oracle:
    """Every request's rows per layer; random steps and top-k sets over them."""

    def __init__(self, manager, seed):
        self.manager = manager
        self.rng = np.random.default_rng(seed)
        self.rows = {}
        for rid in range(1, REQUESTS + 1):
            length = int(self.rng.integers(1, 20))
            manager.admit(rid, length, 40)
            self.rows[rid] = []
            for layer, (_, stride) in enumerate(LAYERS):
                rows = self.rng.integers(0, 256, (length, stride), dtype=np.uint8)
                manager.ingest_prompt(rid, layer, rows)
                self.rows[rid].append([r for r in rows])

    def step_inputs(self, batch):
        """New rows per layer ([batch, stride]) appended to the model, and top-k per layer."""
        new_rows, topk = [], []
        for layer, (_, stride) in enumerate(LAYERS):
            rows = self.rng.integers(0, 256, (len(batch), stride), dtype=np.uint8)
            for b, rid in enumerate(batch):
                self.rows[rid][layer].append(rows[b])
            new_rows.append(rows)
            t = np.full((len(batch), TOP_K), -1, np.int32)
            for b, rid in enumerate(batch):
                length = len(self.rows[rid][layer])
                for k in range(TOP_K):
                    kind = self.rng.integers(0, 10)
                    t[b, k] = (-1 if kind == 0 else length + 2 if kind == 1 else
                               t[b, k - 1] if kind == 2 and k > 0 else
                               self.rng.integers(0, length))
            topk.append(t)
        return new_rows, topk

    def check(self, rid, layer, topk_row, slot_row, hot):
        seen = set()
        for k in range(TOP_K):
            p = int(topk_row[k])
            if p < 0 or p >= len(self.rows[rid][layer]) or p in seen:
                assert slot_row[k] == -1, (rid, layer, p)
                continue
            seen.add(p)
            assert slot_row[k] >= 0, (rid, layer, p)
            row_bytes = LAYERS[layer][0]  # the padding after row_bytes is not copied
            np.testing.assert_array_equal(hot[slot_row[k]][:row_bytes],
                                          self.rows[rid][layer][p][:row_bytes],
                                          err_msg=f"request {rid} layer {layer} position {p}")


def run_cpu_steps(schedule, oracle, steps, layers_per_index=1):
    """Random steps; a layer of an index group reads its group's first layer's top-k and slots."""
    manager = oracle.manager
    hot = [np.asarray(manager.hot_layer(layer)) for layer in range(len(LAYERS))]
    for _ in range(steps):
        batch = list(oracle.rng.permutation(np.arange(1, REQUESTS + 1))[
            : int(oracle.rng.integers(1, REQUESTS + 1))])
        batch = [int(r) for r in batch]
        schedule.plan_step(batch)
        new_rows, topk = oracle.step_inputs(batch)
        for layer in range(len(LAYERS)):
            leader = layer - layer % layers_per_index
            if layer == leader:
                slots = np.full((len(batch), TOP_K), -7, np.int32)
            attended = np.zeros(len(batch), np.int32)

            def attend(l, first, rows, stream):
                assert l == layer and stream == 0
                for b in range(first, first + rows):
                    attended[b] += 1
                    oracle.check(batch[b], l, topk[leader][b], slots[b], hot[l])

            schedule.run_layer(layer, new_rows[layer], topk[layer], slots, attend)
            assert list(attended) == [1] * len(batch)
        schedule.finish_step()


def test_choices_parse_print_and_follow_the_options():
    names = [str(c) for c in sparsekv.allowed_choices(schedule_options())]
    assert names == ["serial", "chunks1", "chunks2", "prefetch", "prefetch+chunks1",
                     "prefetch+chunks2", "prefetch:16", "prefetch:16+chunks1",
                     "prefetch:16+chunks2"]
    assert [str(c) for c in sparsekv.allowed_choices(make_options())] == ["serial"]
    for name in names + ["prefetch+chunks48"]:
        assert str(sparsekv.StepChoice.parse(name)) == name
    assert sparsekv.StepChoice.parse("prefetch+chunks2") == sparsekv.StepChoice(True, 2)
    assert sparsekv.StepChoice.parse("prefetch:16") == sparsekv.StepChoice(True, 0, 16)
    assert len({sparsekv.StepChoice(), sparsekv.StepChoice.parse("serial")}) == 1
    with pytest.raises(sparsekv.InvalidArgumentError, match="chunks<N>"):
        sparsekv.StepChoice.parse("chunk8")


def test_the_planned_copy_parses_and_is_offered_with_a_shared_index_group():
    shared = schedule_options(layers_per_index=2, max_prefetch=0)
    names = [str(c) for c in sparsekv.allowed_choices(shared)]
    assert names == ["serial", "chunks1", "chunks2", "planned", "planned+chunks1",
                     "planned+chunks2", "planned:16", "planned:16+chunks1", "planned:16+chunks2"]
    assert not any(c.planned_copy for c in sparsekv.allowed_choices(schedule_options()))
    for name in names + ["prefetch:8+planned:4+chunks2"]:
        assert str(sparsekv.StepChoice.parse(name)) == name
    choice = sparsekv.StepChoice.parse("planned:16+chunks2")
    assert choice == sparsekv.StepChoice(chunk_rows=2, planned_copy=True, planned_copy_blocks=16)
    assert choice.planned_copy and choice.planned_copy_blocks == 16
    for bad in ["planned:0", "chunks2+planned", "planned+prefetch"]:
        with pytest.raises(sparsekv.InvalidArgumentError, match="planned"):
            sparsekv.StepChoice.parse(bad)
    # One layer per index group: refused, with the reason.
    manager = sparsekv.SparseKVCacheManager(schedule_options(), sparsekv.cpu_backend())
    with pytest.raises(sparsekv.InvalidArgumentError, match="more than one layer"):
        sparsekv.StepSchedule(manager, fixed="planned")


@pytest.mark.parametrize("choice", ["planned", "planned:16+chunks1", "planned+chunks2"])
def test_the_planned_copy_reads_the_rows_written(choice):
    manager = sparsekv.SparseKVCacheManager(schedule_options(layers_per_index=2),
                                            sparsekv.cpu_backend())
    schedule = sparsekv.StepSchedule(manager, fixed=choice)
    oracle = Oracle(manager, seed=len(choice))
    run_cpu_steps(schedule, oracle, steps=20, layers_per_index=2)
    assert schedule.stats().steps_by_choice == {choice: 20}
    assert manager.read_stats().total.misses > 0


@pytest.mark.parametrize("choice", ["serial", "chunks1", "chunks2", "prefetch",
                                    "prefetch+chunks1", "prefetch+chunks2", "prefetch:16+chunks1"])
def test_every_choice_reads_the_rows_written(choice):
    manager = sparsekv.SparseKVCacheManager(schedule_options(), sparsekv.cpu_backend())
    schedule = sparsekv.StepSchedule(manager, fixed=choice)
    oracle = Oracle(manager, seed=len(choice))
    run_cpu_steps(schedule, oracle, steps=20)
    stats = schedule.stats()
    assert stats.steps_by_choice == {choice: 20}
    assert schedule.reason == "fixed by ScheduleOptions::fixed"
    assert manager.read_stats().total.misses > 0


def test_the_automatic_schedule_measures_then_keeps_a_choice():
    manager = sparsekv.SparseKVCacheManager(schedule_options(), sparsekv.cpu_backend())
    schedule = sparsekv.StepSchedule(manager, candidates=["serial", "prefetch", "chunks1"],
                                     trials=1)
    oracle = Oracle(manager, seed=3)
    run_cpu_steps(schedule, oracle, steps=30)
    stats = schedule.stats()
    assert stats.steps == 30
    assert 0 < stats.calibration_steps < 30
    assert sum(stats.steps_by_choice.values()) == 30
    assert str(stats.last_choice) in ("serial", "prefetch", "chunks1")
    assert stats.last_reason


def test_the_schedule_keeps_its_manager_alive():
    manager = sparsekv.SparseKVCacheManager(schedule_options(), sparsekv.cpu_backend())
    schedule = sparsekv.StepSchedule(manager, fixed="chunks1")
    oracle = Oracle(manager, seed=5)
    del manager
    run_cpu_steps(schedule, oracle, steps=3)


def test_bad_calls_raise_and_a_raising_callable_ends_the_layer_with_its_exception():
    with pytest.raises(TypeError, match="SparseKVCacheManager"):
        sparsekv.StepSchedule(object())
    plain = sparsekv.SparseKVCacheManager(make_options(), sparsekv.cpu_backend())
    with pytest.raises(sparsekv.InvalidArgumentError, match="is not one the manager"):
        sparsekv.StepSchedule(plain, fixed="chunks2")  # no copy_chunk_rows
    manager = sparsekv.SparseKVCacheManager(schedule_options(), sparsekv.cpu_backend())
    with pytest.raises(sparsekv.InvalidArgumentError, match="candidate"):
        sparsekv.StepSchedule(manager, candidates=["chunks3"])  # not a power-of-two multiple
    with pytest.raises(sparsekv.InvalidArgumentError, match="trials"):
        sparsekv.StepSchedule(manager, trials=0)
    schedule = sparsekv.StepSchedule(manager, fixed="chunks1")
    Oracle(manager, seed=7)
    rows = np.zeros((2, LAYERS[0][1]), np.uint8)
    topk = np.zeros((2, TOP_K), np.int32)
    slots = np.zeros((2, TOP_K), np.int32)
    ok = lambda *args: None  # noqa: E731
    with pytest.raises(sparsekv.FailedPreconditionError, match="no step is planned"):
        schedule.run_layer(0, rows, topk, slots, ok)
    schedule.plan_step([1, 2])
    with pytest.raises(sparsekv.FailedPreconditionError, match="out of order"):
        schedule.run_layer(1, np.zeros((2, LAYERS[1][1]), np.uint8), topk, slots, ok)
    with pytest.raises(sparsekv.InvalidArgumentError, match="topk"):
        schedule.run_layer(0, rows, None, slots, ok)
    with pytest.raises(TypeError, match="slots"):
        schedule.run_layer(0, rows, topk, np.zeros((2, TOP_K), np.int64), ok)
    with pytest.raises(ValueError, match="new_rows"):
        schedule.run_layer(0, rows[:1], topk, slots, ok)
    with pytest.raises(ValueError, match="layer 5 out of range"):
        schedule.run_layer(5, rows, topk, slots, ok)

    def fails(layer, first, count, stream):
        if first == 1:
            raise ZeroDivisionError("attention kernel failed")

    with pytest.raises(ZeroDivisionError, match="attention kernel failed"):
        schedule.run_layer(0, rows, topk, slots, fails)
    # The step is not lost: it cannot finish with layers left, abort_step ends it, and the next
    # one plans.
    with pytest.raises(sparsekv.FailedPreconditionError):
        schedule.finish_step()
    schedule.abort_step()
    with pytest.raises(sparsekv.FailedPreconditionError, match="no step is planned"):
        schedule.abort_step()
    length = manager.sequence_length(1)
    schedule.plan_step([1, 2])
    assert manager.sequence_length(1) == length + 1


torch = None
try:  # the CUDA part needs torch and a GPU
    import torch
except ImportError:
    pass

needs_gpu = pytest.mark.skipif(
    torch is None or not torch.cuda.is_available() or not sparsekv.cuda_compiled(),
    reason="needs torch, a CUDA GPU and sparsekv built with the CUDA backend")


@needs_gpu
@pytest.mark.parametrize("captured", [False, True])
@pytest.mark.parametrize("layers_per_index", [1, 2])  # 2: one index group, the planned copy
def test_every_choice_on_the_gpu_eagerly_and_in_cuda_graphs(captured, layers_per_index):
    options = schedule_options(layers_per_index=layers_per_index)

    def leader(layer):
        return layer - layer % layers_per_index

    for choice in sparsekv.allowed_choices(options):
        manager = sparsekv.SparseKVCacheManager(options, sparsekv.cuda_backend(0))
        schedule = sparsekv.StepSchedule(manager, fixed=choice)
        oracle = Oracle(manager, seed=21)
        batch_size = REQUESTS
        dev = "cuda"
        hot = [torch.as_tensor(manager.hot_layer(layer), device=dev)
               for layer in range(len(LAYERS))]
        # Fixed device buffers: the shape a captured graph needs.
        new_rows = [torch.zeros(batch_size, s, dtype=torch.uint8, device=dev) for _, s in LAYERS]
        topk = [torch.zeros(batch_size, TOP_K, dtype=torch.int32, device=dev) for _ in LAYERS]
        slots = [torch.zeros(batch_size, TOP_K, dtype=torch.int32, device=dev) for _ in LAYERS]
        # What attention read: the rows of every (layer, slice), gathered through the slots.
        read = [torch.zeros(batch_size, TOP_K, s, dtype=torch.uint8, device=dev)
                for _, s in LAYERS]
        stream = torch.cuda.Stream()

        def run_phase():
            for layer in range(len(LAYERS)):
                def attend(l, first, rows, s):
                    assert s == stream.cuda_stream
                    idx = slots[leader(l)][first:first + rows].clamp(min=0).long()
                    read[l][first:first + rows] = hot[l][idx]
                schedule.run_layer(layer, new_rows[layer], topk[layer], slots[leader(layer)],
                                   attend, stream=stream)
            schedule.finish_step(stream=stream)

        graph = None
        for step in range(8):
            batch = [int(r) for r in oracle.rng.permutation(np.arange(1, REQUESTS + 1))]
            schedule.plan_step(batch, stream=stream)
            rows_host, topk_host = oracle.step_inputs(batch)
            with torch.cuda.stream(stream):
                for layer in range(len(LAYERS)):
                    new_rows[layer].copy_(torch.from_numpy(rows_host[layer]))
                    topk[layer].copy_(torch.from_numpy(topk_host[layer]))
                    slots[layer].fill_(-7)
                if not captured:
                    run_phase()
                elif graph is None:
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph, stream=stream):
                        run_phase()
                    graph.replay()  # the captured step ran nothing yet
                else:
                    graph.replay()
                    schedule.finish_replayed_step()
            stream.synchronize()
            for layer in range(len(LAYERS)):
                s_host = slots[leader(layer)].cpu().numpy()
                r_host = read[layer].cpu().numpy()
                for b, rid in enumerate(batch):
                    oracle.check(rid, layer, topk_host[leader(layer)][b], s_host[b],
                                 {k: r_host[b][j] for j, k in enumerate(s_host[b]) if k >= 0})
        assert schedule.stats().steps_by_choice == {str(choice): 8}


def resident_manager():
    """A manager with hybrid residency: blocks of 8 + 2 rows in pages of 5, a budget of 3
    blocks (6 pages), so a request of up to 12 positions is admitted resident."""
    paged = dict(hybrid_residency=True, resident_page_rows=5)
    probe = sparsekv.choose_hot_cache_shape(make_options(**paged))
    options = make_options(device_budget_bytes=3 * probe.block_bytes, **paged)
    return sparsekv.SparseKVCacheManager(options, sparsekv.cpu_backend())


def admit_zeros(manager, rid, length, max_new_tokens):
    manager.admit(rid, length, max_new_tokens)
    for layer, (_, stride) in enumerate(LAYERS):
        manager.ingest_prompt(rid, layer, np.zeros((length, stride), np.uint8))


def run_zero_step(schedule, batch):
    """One step of `batch` whose top-k selects every position 0; returns the choice's text."""
    schedule.plan_step(batch)
    for layer, (_, stride) in enumerate(LAYERS):
        topk = np.zeros((len(batch), TOP_K), np.int32)
        slots = np.full((len(batch), TOP_K), -7, np.int32)
        schedule.run_layer(layer, np.zeros((len(batch), stride), np.uint8), topk, slots,
                           lambda l, first, rows, stream: None)
        assert (slots[:, 0] >= 0).all()
    schedule.finish_step()
    return str(schedule.choice)


@pytest.mark.parametrize("yields", [False, True])
def test_a_fixed_choice_yields_to_resident_only_when_asked(yields):
    manager = resident_manager()
    schedule = sparsekv.StepSchedule(manager, fixed="serial", fixed_yields_to_resident=yields)
    admit_zeros(manager, 1, 6, 6)  # 12 positions: 3 of the 6 pages
    assert manager.is_resident(1)
    assert run_zero_step(schedule, [1]) == ("resident" if yields else "serial")
    # A request in hot-cache mode can miss: the fixed choice runs either way.
    admit_zeros(manager, 2, 7, 9)  # 16 positions do not fit in the pages left
    assert not manager.is_resident(2)
    assert run_zero_step(schedule, [1, 2]) == "serial"
    assert schedule.reason == "fixed by ScheduleOptions::fixed"
    assert schedule.stats().steps_by_choice == (
        {"resident": 1, "serial": 1} if yields else {"serial": 2})


def test_without_a_fixed_choice_an_all_resident_step_runs_resident():
    manager = resident_manager()
    schedule = sparsekv.StepSchedule(manager, candidates=["serial"], trials=1)
    admit_zeros(manager, 1, 6, 6)  # 12 positions: 3 of the 6 pages
    assert run_zero_step(schedule, [1]) == "resident"
    assert schedule.choice.resident
