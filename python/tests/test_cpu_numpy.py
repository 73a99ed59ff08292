"""The binding on the CPU backend with numpy arrays: lifecycle, resolve results, errors."""

import ctypes

import numpy as np
import pytest

import sparsekv
from conftest import LAYERS, MAX_CONTEXT, TOP_K, make_options
from workload import Flavour, run_workload


def admit_with_prompt(manager, rid, prompt_len, max_new_tokens=8):
    manager.admit(rid, prompt_len, max_new_tokens)
    for layer, (_, stride) in enumerate(LAYERS):
        manager.ingest_prompt(rid, layer, np.zeros((prompt_len, stride), np.uint8))


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_resolve_matches_reference(manager, seed):
    run_workload(manager, Flavour.numpy(), seed)


def test_sort_misses_off_gives_the_same_slots():
    manager = sparsekv.SparseKVCacheManager(make_options(sort_misses=False),
                                            sparsekv.cpu_backend())
    run_workload(manager, Flavour.numpy(), seed=4, steps=15)


def test_sort_threshold_is_an_option_and_is_validated():
    assert make_options().sort_misses_min_batch == 32  # the documented default
    manager = sparsekv.SparseKVCacheManager(make_options(sort_misses_min_batch=0),
                                            sparsekv.cpu_backend())
    run_workload(manager, Flavour.numpy(), seed=5, steps=10)
    with pytest.raises(sparsekv.InvalidArgumentError, match="sort_misses_min_batch"):
        sparsekv.SparseKVCacheManager(make_options(sort_misses_min_batch=-1),
                                      sparsekv.cpu_backend())


def test_copy_blocks_is_an_option_and_is_validated():
    assert make_options().copy_blocks == 0  # the documented default: as many as the GPU holds
    manager = sparsekv.SparseKVCacheManager(make_options(copy_blocks=3), sparsekv.cpu_backend())
    run_workload(manager, Flavour.numpy(), seed=6, steps=5)
    with pytest.raises(sparsekv.InvalidArgumentError, match="copy_blocks"):
        sparsekv.SparseKVCacheManager(make_options(copy_blocks=-1), sparsekv.cpu_backend())


def test_lifecycle_and_sequence_length(manager):
    admit_with_prompt(manager, 1, 5)
    assert manager.sequence_length(1) == 5
    manager.plan_step([1])
    assert manager.batch_size == 1
    assert manager.sequence_length(1) == 6
    for layer, (_, stride) in enumerate(LAYERS):
        manager.append_token(layer, np.zeros((1, stride), np.uint8))
        manager.run_layer(layer, np.full((1, TOP_K), -1, np.int32),
                          np.zeros((1, TOP_K), np.int32))
    manager.finish_step()
    manager.retract(1)
    with pytest.raises(sparsekv.FailedPreconditionError, match="retracted"):
        manager.plan_step([1])
    manager.resume(1)
    manager.release(1)
    with pytest.raises(sparsekv.NotFoundError):
        manager.sequence_length(1)


def test_stats_count_bytes_and_blocks(manager):
    admit_with_prompt(manager, 1, 5)
    stats = manager.read_stats()
    assert stats.hot_blocks_used == 1
    assert stats.bytes_ingested == 5 * sum(b for b, _ in LAYERS)
    assert stats.host_pages_used > 0
    d = stats.to_dict()
    assert d["hot_blocks_used"] == 1 and len(d["layers"]) == len(LAYERS)
    assert set(d["total"]) >= {"hits", "misses", "hit_rate", "out_of_range", "duplicates"}
    manager.reset_stats()
    assert manager.read_stats().bytes_ingested == 0


def test_hot_layer_is_a_zero_copy_view(manager):
    view = manager.hot_layer(1)
    array = np.asarray(view)
    rows = make_options().max_requests * make_options().slots_per_request
    assert array.shape == (rows, LAYERS[1][1]) and array.dtype == np.uint8
    assert array.__array_interface__["data"][0] == view.data_ptr
    assert not hasattr(view, "__cuda_array_interface__")


def test_hot_layer_exports_dlpack(manager):
    view = manager.hot_layer(1)
    assert view.__dlpack_device__() == (1, 0)  # kDLCPU
    array = np.from_dlpack(view)
    assert array.shape == (view.rows, view.row_stride) and array.dtype == np.uint8
    assert array.__array_interface__["data"][0] == view.data_ptr
    with pytest.raises(BufferError, match="another device"):
        view.__dlpack__(dl_device=(2, 0))
    with pytest.raises(BufferError, match="copy"):
        view.__dlpack__(copy=True)


def test_a_bad_layer_is_an_invalid_argument(manager):
    manager.admit(1, 4, 4)
    for call in (lambda: manager.ingest_prompt(1, 7, np.zeros((4, 16), np.uint8)),
                 lambda: manager.ingest_prompt(1, -1, np.zeros((4, 16), np.uint8)),
                 lambda: manager.hot_layer(2)):
        with pytest.raises(sparsekv.InvalidArgumentError, match="out of range"):
            call()
    assert issubclass(sparsekv.InvalidArgumentError, ValueError)


def test_options_validation_and_defaults():
    with pytest.raises(sparsekv.InvalidArgumentError):
        make_options(hot_slots=TOP_K - 1).validate()
    o = sparsekv.CacheOptions(geometry=sparsekv.KVGeometry.uniform(61, 656),
                              host_capacity_tokens=1024, max_requests=2, max_context=512)
    assert (o.top_k, o.hot_slots, o.window, o.host_page_tokens) == (2048, 4096, 1, 64)
    assert o.geometry.num_layers == 61 and o.geometry.token_bytes == 61 * 656
    with pytest.raises(TypeError):
        sparsekv.CacheOptions(geometry=o.geometry, bogus=1)


def test_status_errors_map_to_exception_classes(manager):
    admit_with_prompt(manager, 1, 5)
    with pytest.raises(sparsekv.AlreadyExistsError) as e:
        manager.admit(1, 5, 1)
    assert isinstance(e.value, ValueError) and isinstance(e.value, sparsekv.SparseKVError)
    assert "already exists" in str(e.value)
    with pytest.raises(sparsekv.OutOfRangeError):
        manager.admit(2, MAX_CONTEXT, 1)
    with pytest.raises(sparsekv.NotFoundError) as e:
        manager.release(99)
    assert isinstance(e.value, LookupError)
    with pytest.raises(sparsekv.FailedPreconditionError):
        manager.finish_step()
    with pytest.raises(sparsekv.InvalidArgumentError):
        manager.plan_step([])
    for rid in (2, 3):
        admit_with_prompt(manager, rid, 5)
    with pytest.raises(sparsekv.ResourceExhaustedError):
        manager.admit(4, 5, 1)


def test_released_request_is_rejected(manager):
    admit_with_prompt(manager, 1, 5)
    manager.release(1)
    with pytest.raises(sparsekv.NotFoundError, match="unknown or released"):
        manager.ingest_prompt(1, 0, np.zeros((5, LAYERS[0][1]), np.uint8))
    with pytest.raises(sparsekv.NotFoundError):
        manager.plan_step([1])
    with pytest.raises(sparsekv.NotFoundError):
        manager.retract(1)


@pytest.fixture
def planned(manager):
    admit_with_prompt(manager, 1, 5)
    manager.plan_step([1])
    return manager


def test_wrong_dtype_raises_type_error(planned):
    slots = np.zeros((1, TOP_K), np.int32)
    for bad in (np.zeros((1, TOP_K), np.int64), np.zeros((1, TOP_K), np.float32),
                np.zeros((1, TOP_K), np.dtype(">i4"))):
        with pytest.raises(TypeError, match="topk"):
            planned.run_layer(0, bad, slots)
    with pytest.raises(TypeError, match="slots"):
        planned.run_layer(0, np.zeros((1, TOP_K), np.int32), np.zeros((1, TOP_K), np.uint32))
    with pytest.raises(TypeError, match="expected a tensor"):
        planned.append_token(0, [[0] * 16])


def test_wrong_shape_raises_value_error(planned):
    topk = np.zeros((1, TOP_K), np.int32)
    slots = np.zeros((1, TOP_K), np.int32)
    planned.append_token(0, np.zeros((1, 16), np.uint8))
    cases = [
        (np.zeros((1, TOP_K - 1), np.int32), slots, "topk"),  # narrower than top_k
        (np.zeros((TOP_K,), np.int32), slots, "topk"),  # 1-D
        (topk, np.zeros((1, TOP_K + 1), np.int32), "slots"),  # not exactly top_k columns
        (np.zeros((0, TOP_K), np.int32), slots, "topk"),  # fewer rows than the batch
    ]
    for t, s, name in cases:
        with pytest.raises(ValueError, match=name):
            planned.run_layer(0, t, s)
    with pytest.raises(ValueError, match="row_stride = 24 bytes, got 16"):
        planned.append_token(1, np.zeros((1, 16), np.uint8))
    with pytest.raises(ValueError, match="rows"):
        planned.ingest_prompt(1, 0, np.zeros((4, 16), np.uint8))  # prompt has 5 tokens
    with pytest.raises(ValueError, match="assembled"):
        planned.run_layer(0, topk, slots, np.zeros((1, TOP_K, 8), np.uint8))
    with pytest.raises(ValueError, match="layer 5 out of range"):
        planned.append_token(5, np.zeros((1, 16), np.uint8))


def test_non_contiguous_and_read_only_are_rejected(planned):
    wide = np.zeros((1, 2 * TOP_K), np.int32)
    with pytest.raises(ValueError, match="C-contiguous"):
        planned.run_layer(0, wide[:, ::2], np.zeros((1, TOP_K), np.int32))
    with pytest.raises(ValueError, match="C-contiguous"):
        planned.append_token(0, np.zeros((1, 32), np.uint8)[:, ::2])
    read_only = np.zeros((1, TOP_K), np.int32)
    read_only.flags.writeable = False
    planned.append_token(0, np.zeros((1, 16), np.uint8))
    with pytest.raises(ValueError, match="read-only"):
        planned.run_layer(0, np.zeros((1, TOP_K), np.int32), read_only)


def test_byte_compatible_kv_dtypes_are_accepted(planned):
    # Layer 0 rows are 16 bytes: 8 x float16 or 4 x int32 or [2, 8] uint8 all qualify.
    planned.append_token(0, np.zeros((1, 8), np.float16))
    planned.append_token(1, np.zeros((1, 3, 2), np.float32))  # 24 bytes
    planned.run_layer(0, np.zeros((1, TOP_K), np.int32), np.zeros((1, TOP_K), np.int32))


def test_stream_argument_forms(manager):
    class FakeStream:
        cuda_stream = 0

    manager.admit(1, 3, 2, stream=0)
    manager.admit(2, 3, 2, stream=FakeStream())
    with pytest.raises(TypeError, match="stream"):
        manager.admit(3, 3, 2, stream="default")


def test_split_run_index_groups_and_prefetch_match_run_layer():
    """resolve_layer + copy_misses + assemble_layer (one top-k per 2 layers, prefetches before
    each resolve) deliver the bytes run_layer delivers with every layer resolving on its own."""
    rng = np.random.default_rng(7)
    plain = sparsekv.SparseKVCacheManager(make_options(), sparsekv.cpu_backend())
    split = sparsekv.SparseKVCacheManager(make_options(layers_per_index=2, max_prefetch=3),
                                          sparsekv.cpu_backend())
    prompt = [rng.integers(0, 256, (20, stride), dtype=np.uint8) for _, stride in LAYERS]
    for m in (plain, split):
        m.admit(1, 20, 30)
        for layer, rows in enumerate(prompt):
            m.ingest_prompt(1, layer, rows)
    for step in range(12):
        new_rows = [rng.integers(0, 256, (1, stride), dtype=np.uint8) for _, stride in LAYERS]
        topk = rng.integers(-1, 21 + step, (1, TOP_K), dtype=np.int32)
        for m in (plain, split):
            m.plan_step([1])
        got = {}
        for m, name in ((plain, "plain"), (split, "split")):
            slots = np.full((1, TOP_K), -7, np.int32)
            fill = np.full((1, TOP_K), 9, np.uint8)
            for layer, (row_bytes, stride) in enumerate(LAYERS):
                m.append_token(layer, new_rows[layer])
                out = np.zeros((1, TOP_K, stride), np.uint8)
                if name == "plain":
                    m.run_layer(layer, topk, slots, out)
                else:
                    if layer == 0:
                        m.prefetch_layer(0, rng.integers(-2, 22 + step, (1, 3), dtype=np.int32))
                        m.resolve_layer(0, topk, slots, fill)
                        assert set(np.unique(fill)) <= {0, 1}
                    before = np.zeros_like(out)
                    m.assemble_layer(layer, slots, before)
                    m.copy_misses(layer)
                    m.assemble_layer(layer, slots, out)
                    # Rows the fill mask calls resident were right before the copy.
                    resident = fill[0] == 0
                    assert np.array_equal(before[0, resident, :row_bytes],
                                          out[0, resident, :row_bytes])
                got[(name, layer)] = out[0, :, :row_bytes].copy()
            m.finish_step()
        for layer in range(len(LAYERS)):
            assert np.array_equal(got[("plain", layer)], got[("split", layer)]), (step, layer)
    stats = split.read_stats()
    assert stats.prefetch_lookups > 0
    assert stats.to_dict()["prefetch_rows"] == stats.prefetch_rows
    with pytest.raises(sparsekv.FailedPreconditionError, match="shares the top-k"):
        split.plan_step([1])
        split.append_token(0, np.zeros((1, LAYERS[0][1]), np.uint8))
        split.append_token(1, np.zeros((1, LAYERS[1][1]), np.uint8))
        split.resolve_layer(1, np.zeros((1, TOP_K), np.int32), np.zeros((1, TOP_K), np.int32))


def test_indexer_keys_live_in_the_managers_memory():
    # Two layers of 16-byte rows in pages of 4 rows: a page holds 4 * 16 // 8 = 8 keys of 8 bytes.
    o = make_options(geometry=sparsekv.KVGeometry.uniform(2, 16), hybrid_residency=True,
                     resident_page_rows=4, indexer_key_bytes=8)
    m = sparsekv.SparseKVCacheManager(o, sparsekv.cpu_backend())
    rng = np.random.default_rng(7)
    prompt = 11
    m.admit(1, prompt, 3)
    keys = [rng.integers(0, 256, (prompt, 8), dtype=np.uint8) for _ in range(2)]
    for layer in range(2):
        m.ingest_prompt(1, layer, rng.integers(0, 256, (prompt, 16), dtype=np.uint8))
    with pytest.raises(sparsekv.FailedPreconditionError, match="indexer keys"):
        m.plan_step([1])
    with pytest.raises(ValueError, match="keys"):
        m.ingest_indexer_keys(1, 0, keys[0][:5])  # not every prompt position
    for layer in range(2):
        m.ingest_indexer_keys(1, layer, keys[layer])
    m.plan_step([1])
    new_keys = [rng.integers(0, 256, (o.effective_max_batch, 8), dtype=np.uint8) for _ in range(2)]
    topk = np.full((o.effective_max_batch, TOP_K), -1, np.int32)
    slots = np.empty((o.effective_max_batch, TOP_K), np.int32)
    for layer in range(2):
        with pytest.raises(sparsekv.InvalidArgumentError, match="new_keys"):
            m.append_token(layer, np.zeros((o.effective_max_batch, 16), np.uint8))
        m.append_token(layer, np.zeros((o.effective_max_batch, 16), np.uint8), new_keys[layer])
        m.run_layer(layer, topk, slots)
    m.finish_step()
    # Read every key back through the view, as an indexer kernel would.
    for layer in range(2):
        v = m.indexer_keys(layer)
        assert (v.key_bytes, v.keys_per_page, v.row_stride) == (8, 8, 16)
        row = ctypes.c_int32.from_address(v.batch_ptr + 8).value  # batch[0].page_table_row
        table = np.ctypeslib.as_array(
            (ctypes.c_int32 * v.pages_per_request).from_address(
                v.page_table_ptr + 4 * row * v.pages_per_request))
        want = np.concatenate([keys[layer], new_keys[layer][:1]])
        for p in range(prompt + 1):
            at = v.keys_ptr + int(table[p // v.keys_per_page]) * v.row_stride + (p % 8) * 8
            got = np.ctypeslib.as_array((ctypes.c_uint8 * 8).from_address(at))
            assert np.array_equal(got, want[p]), (layer, p)
    shape = sparsekv.choose_hot_cache_shape(o)
    assert shape.keys_per_page == 8 and shape.page_rows == 4
