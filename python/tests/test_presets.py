"""The model presets from Python: the same layers, formats and refusals as the C++ FindPreset."""

import pytest

import sparsekv
from sparsekv import KVRowFormat, LayerKind

ALL = ["deepseek-v3.2", "glm-5", "deepseek-v4-flash", "deepseek-v4-pro", "glm-5.3"]


def options_for(preset, **overrides):
    """CacheOptions whose geometry, top-k, keys and raw window come from `preset`."""
    fields = dict(
        geometry=preset.geometry(),
        top_k=preset.top_k,
        hot_slots=2 * preset.top_k,
        indexer_key_bytes=preset.indexer_key_bytes,
        host_capacity_tokens=2 * 8192,
        max_requests=2,
        max_context=8192,
        host_page_tokens=64,
        raw_window=preset.raw_window,
    )
    fields.update(overrides)
    return sparsekv.CacheOptions(**fields)


def test_preset_names_are_the_libraries():
    assert sparsekv.preset_names() == ALL


@pytest.mark.parametrize("name", ALL)
def test_every_preset_builds_valid_options(name):
    preset = sparsekv.find_preset(name)
    assert preset.name == name
    assert preset.geometry().num_layers == preset.num_layers == len(preset.layers)
    options_for(preset).validate()


def test_deepseek_v32_is_served_with_656_byte_rows():
    preset = sparsekv.find_preset("deepseek-v3.2")
    assert (preset.num_layers, preset.row_bytes, preset.top_k) == (61, 656, 2048)
    assert preset.indexer_key_bytes == 132
    assert preset.raw_window == 0
    assert {layer.format for layer in preset.layers} == {KVRowFormat.FP8_ROW_656}
    sparsekv.check_served_geometry(preset.geometry(), preset.raw_window)
    manager = sparsekv.SparseKVCacheManager(options_for(preset), sparsekv.cpu_backend())
    assert manager is not None


def test_bf16_rows_of_a_dsa_model():
    preset = sparsekv.find_preset("glm-5", KVRowFormat.BF16_ROW_1152)
    assert (preset.num_layers, preset.row_bytes) == (78, 1152)
    assert preset.geometry().token_bytes == 78 * 1152


def test_raw_window_is_a_constructor_argument():
    preset = sparsekv.find_preset("deepseek-v4-flash")
    assert options_for(preset).raw_window == 128
    assert options_for(sparsekv.find_preset("glm-5")).raw_window == 0


def test_deepseek_v4_pro_layer_kinds():
    preset = sparsekv.find_preset("deepseek-v4-pro")
    assert (preset.num_layers, preset.row_bytes, preset.top_k) == (62, 584, 1024)
    assert preset.raw_window == 128
    assert preset.weights_per_gpu_gb == pytest.approx(108.1)
    assert preset.layers_of(LayerKind.OFFLOADED) == 30
    assert preset.layers_of(LayerKind.RESIDENT) == 31
    assert preset.layers_of(LayerKind.WINDOW_ONLY) == 1
    assert preset.layers_of(LayerKind.OFFLOADED, keyed=True) == 30
    csa, hca = preset.layers[2], preset.layers[3]
    assert (csa.kind, csa.entry_tokens, csa.top_k, csa.index_group) == (
        LayerKind.OFFLOADED, 4, 1024, 2)
    assert csa.indexer_keys
    assert (hca.kind, hca.entry_tokens, hca.indexer_keys) == (LayerKind.RESIDENT, 128, False)
    assert hca.format == KVRowFormat.FP8_ENTRY_584


def test_deepseek_v4_flash_in_mxfp4():
    preset = sparsekv.find_preset("deepseek-v4-flash", KVRowFormat.MXFP4_ENTRY_368)
    assert preset.row_bytes == sparsekv.kv_row_bytes(KVRowFormat.MXFP4_ENTRY_368) == 368
    assert preset.num_layers == 44
    assert preset.layers_of(LayerKind.OFFLOADED) == 21
    assert {layer.row_stride for layer in preset.layers} == {368}


def test_glm_53_index_groups_and_keys():
    preset = sparsekv.find_preset("glm-5.3")
    groups = [layer.index_group for layer in preset.layers]
    assert groups[:11] == [0, 1, 2, 2, 2, 2, 6, 6, 6, 6, 10]
    assert sum(layer.indexer_keys for layer in preset.layers) == 21


@pytest.mark.parametrize("name,format", [
    ("deepseek-v4-pro", KVRowFormat.FP8_ROW_656),
    ("deepseek-v4-flash", KVRowFormat.BF16_ROW_1152),
    ("glm-5.3", KVRowFormat.FP8_ENTRY_584),
    ("deepseek-v3.2", KVRowFormat.MXFP4_ENTRY_368),
])
def test_a_format_the_model_lacks_is_refused(name, format):
    with pytest.raises(sparsekv.InvalidArgumentError, match=f"'{name}' has no"):
        sparsekv.find_preset(name, format)


def test_an_unknown_name_lists_the_known_ones():
    with pytest.raises(sparsekv.NotFoundError, match="known: deepseek-v3.2, glm-5"):
        sparsekv.find_preset("deepseek-v5")


@pytest.mark.parametrize("name", ["deepseek-v4-flash", "deepseek-v4-pro"])
def test_deepseek_v4_is_served_with_its_layer_kinds(name):
    preset = sparsekv.find_preset(name)
    sparsekv.check_served_geometry(preset.geometry(), preset.raw_window)
    options = options_for(preset, hot_slots=preset.top_k, host_capacity_tokens=1024,
                          max_requests=1, max_context=1024)
    sparsekv.SparseKVCacheManager(options, sparsekv.cpu_backend())


def test_a_geometry_without_offloaded_layers_is_refused():
    layers = [sparsekv.LayerShape(584, kind=LayerKind.RESIDENT, entry_tokens=128,
                                  indexer_keys=False)]
    with pytest.raises(sparsekv.UnimplementedError):
        sparsekv.check_served_geometry(sparsekv.KVGeometry(layers), 128)


def test_glm_53_is_served_with_its_index_groups():
    preset = sparsekv.find_preset("glm-5.3")
    sparsekv.check_served_geometry(preset.geometry(), preset.raw_window)
    options = options_for(preset, hot_slots=preset.top_k, host_capacity_tokens=256,
                          max_requests=1, max_context=256)
    manager = sparsekv.SparseKVCacheManager(options, sparsekv.cpu_backend())
    assert manager.options.index_groups == 21


def test_layer_shape_takes_the_layer_fields():
    layer = sparsekv.LayerShape(584, kind=LayerKind.RESIDENT, entry_tokens=128,
                                format=KVRowFormat.FP8_ENTRY_584, indexer_keys=False)
    assert (layer.row_bytes, layer.row_stride, layer.entry_tokens) == (584, 584, 128)
    assert layer.format == KVRowFormat.FP8_ENTRY_584
    assert sparsekv.LayerShape(656).format is None
    assert sparsekv.LayerShape(656).kind == LayerKind.OFFLOADED
