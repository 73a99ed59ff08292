"""CacheOptions from JSON: sparsekv's own keys, SGLang's --hisparse-config, vLLM's HiSparse keys."""

import json

import pytest

import sparsekv
from conftest import make_options

FIELDS = [
    "top_k", "hot_slots", "device_budget_bytes", "hybrid_residency", "indexer_key_bytes",
    "window", "eviction", "protected_percent", "host_capacity_tokens", "max_requests",
    "max_host_requests", "max_batch", "max_context", "host_page_tokens", "layers_per_index",
    "share_repeated_positions", "sort_misses", "sort_misses_min_batch", "max_prefetch",
    "copy_blocks", "prefetch_copy_blocks", "resident_page_rows", "fused_copy_min_batch",
    "copy_chunk_rows", "copy_strategy",
]


def same(a, b):
    """Every field of two CacheOptions, geometry included."""
    def layers(o):
        return [(layer.row_bytes, layer.row_stride) for layer in o.geometry.layers]

    assert layers(a) == layers(b)
    for name in FIELDS:
        assert getattr(a, name) == getattr(b, name), name


def deepseek_base(**overrides):
    """The model's side of a peer config: DeepSeek-V3.2's 61 fp8 layers, top-k 2048."""
    fields = dict(
        geometry=sparsekv.KVGeometry.uniform(61, 656),
        host_capacity_tokens=1 << 20,
        max_requests=32,
        max_context=32768,
    )
    fields.update(overrides)
    return sparsekv.CacheOptions(**fields)


def test_round_trip_of_every_field():
    o = make_options(
        device_budget_bytes=1 << 30, hybrid_residency=True, eviction=sparsekv.EvictionPolicy.LRU,
        protected_percent=40, max_batch=2, layers_per_index=2, share_repeated_positions=True,
        sort_misses=False, sort_misses_min_batch=3, max_prefetch=4, copy_blocks=16,
        prefetch_copy_blocks=8, resident_page_rows=5, fused_copy_min_batch=0, copy_chunk_rows=2,
        copy_strategy=sparsekv.CopyStrategy.WARP_ROWS,
    )
    o.validate()
    text = o.to_json()
    written = json.loads(text)
    assert list(written) == ["geometry"] + FIELDS
    assert written["geometry"] == {"layers": [{"row_bytes": 16, "row_stride": 16},
                                              {"row_bytes": 20, "row_stride": 24}]}
    assert written["copy_strategy"] == "warp_rows"
    same(sparsekv.CacheOptions.from_json(text), o)


def test_from_json_takes_a_dict_over_a_base():
    base = deepseek_base()
    o = sparsekv.CacheOptions.from_json({"hot_slots": 6144, "eviction": "lru"}, base=base)
    assert o.hot_slots == 6144
    assert o.eviction == sparsekv.EvictionPolicy.LRU
    assert o.geometry.num_layers == 61 and o.max_requests == 32
    assert base.hot_slots == 4096  # the base is not changed


def test_from_json_uniform_geometry():
    o = sparsekv.CacheOptions.from_json(
        '{"geometry": {"num_layers": 78, "row_bytes": 1152}, "host_capacity_tokens": 65536,'
        ' "max_requests": 4, "max_context": 4096}'
    )
    assert o.geometry.num_layers == 78
    assert o.geometry.layers[0].row_stride == 1152


def test_unknown_key_is_named_with_the_accepted_ones():
    with pytest.raises(sparsekv.InvalidArgumentError, match=r'unknown key "hot_slot" \(accepted: '
                       r"geometry, top_k, hot_slots"):
        sparsekv.CacheOptions.from_json({"hot_slot": 4096}, base=deepseek_base())


def test_wrong_type_range_and_invalid_result_name_the_key():
    base = deepseek_base()
    with pytest.raises(ValueError, match="top_k must be an integer"):
        sparsekv.CacheOptions.from_json('{"top_k": "2048"}', base=base)
    with pytest.raises(ValueError, match="max_batch must be in"):
        sparsekv.CacheOptions.from_json('{"max_batch": 99999999999}', base=base)
    with pytest.raises(ValueError, match=r"hot_slots \(100\) must be in \[top_k"):
        sparsekv.CacheOptions.from_json({"hot_slots": 100}, base=base)
    with pytest.raises(ValueError, match='key "top_k" is given twice'):
        sparsekv.CacheOptions.from_json('{"top_k": 1, "top_k": 2}', base=base)
    with pytest.raises(ValueError, match="not valid JSON"):
        sparsekv.CacheOptions.from_json("{", base=base)
    with pytest.raises(TypeError, match="must be a dict or a JSON str, got list"):
        sparsekv.CacheOptions.from_json([1], base=base)


def test_sglang_hisparse_config():
    # The shape of an SGLang launch: --enable-hisparse --hisparse-config '{...}'.
    config = '{"top_k": 2048, "device_buffer_size": 6144, "swap_in_block_size": 960}'
    o = sparsekv.CacheOptions.from_sglang_hisparse_config(config, deepseek_base())
    assert (o.top_k, o.hot_slots) == (2048, 6144)
    assert sparsekv.CacheOptions.from_sglang_hisparse_config({}, deepseek_base()).hot_slots == 4096
    # SGLang's help example: the host pool is twice the device's hot-cache slots.
    o = sparsekv.CacheOptions.from_sglang_hisparse_config(
        '{"top_k": 2048, "device_buffer_size": 4096, "host_to_device_ratio": 2}', deepseek_base()
    )
    assert o.host_capacity_tokens == 2 * 32 * (4096 + 1) // 64 * 64
    o = sparsekv.CacheOptions.from_sglang_hisparse_config(
        {"algorithm": "deepseek_nsa", "backend": None, "page_size": 1, "min_sparse_prompt_len": 0},
        base=deepseek_base(),
    )
    assert o.hot_slots == 4096


@pytest.mark.parametrize(
    "config, message",
    [
        ({"host_to_device_ratio": 0.5}, "host_to_device_ratio must be a number >= 1"),
        ({"algorithm": "quest"}, 'algorithm "quest" has no equivalent'),
        ({"page_size": 64}, r"page_size \(64\) has no equivalent"),
        ({"min_sparse_prompt_len": 4096}, r"min_sparse_prompt_len \(4096\) has no equivalent"),
        ({"top_k": 1024}, r"top_k \(1024\) differs from the model's top-k"),
        ({"device_buffer_size": 1024}, r"device_buffer_size \(1024\) must be at least top_k"),
        ({"quest_page_size": 64}, 'unknown key "quest_page_size"'),
    ],
)
def test_sglang_settings_sparsekv_cannot_honour_are_refused(config, message):
    with pytest.raises(sparsekv.InvalidArgumentError, match=message):
        sparsekv.CacheOptions.from_sglang_hisparse_config(config, deepseek_base())


def test_vllm_hisparse():
    # attention_config.hisparse_config with the HiSparseConnector's kv_connector_extra_config.
    hisparse_config = {"device_buffer_size": 4096}
    extra_config = {"host_pool_gib": 64}
    o = sparsekv.CacheOptions.from_vllm_hisparse({**hisparse_config, **extra_config},
                                                 deepseek_base())
    assert o.hot_slots == 4096
    token_bytes = 61 * 656
    assert o.host_capacity_tokens == (64 << 30) // token_bytes // 64 * 64
    o = sparsekv.CacheOptions.from_vllm_hisparse('{"eager_host_mirror": true}', deepseek_base())
    same(o, deepseek_base())


@pytest.mark.parametrize(
    "config, message",
    [
        ({"eager_host_mirror": False}, r"eager_host_mirror \(false\) has no equivalent"),
        ({"host_pool_gib": 0}, "host_pool_gib must be a positive number of GiB"),
        ({"enable_hisparse": True}, 'unknown key "enable_hisparse"'),
    ],
)
def test_vllm_settings_sparsekv_cannot_honour_are_refused(config, message):
    with pytest.raises(sparsekv.InvalidArgumentError, match=message):
        sparsekv.CacheOptions.from_vllm_hisparse(config, deepseek_base())
