// sparsekv._core: KVRowFormat, LayerKind, LayerShape, KVGeometry, EvictionPolicy, CacheOptions and
// its JSON, the model presets, HotCacheShape.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "binding_util.h"
#include "option_docs.h"
#include "sparsekv/config.h"
#include "sparsekv/hot_cache.h"
#include "sparsekv/options.h"

namespace sparsekv {
namespace {

// A CacheOptions field's docstring: its comment in options.h (option_docs.h, generated from it).
const char* FieldDoc(std::string_view field) {
  for (const python::OptionDoc& d : python::kCacheOptionDocs) {
    if (d.field == field) return d.doc.data();  // a string literal: terminated
  }
  throw std::logic_error("option_docs.h has no comment for CacheOptions::" + std::string(field));
}

void RegisterGeometry(py::module_& m) {
  py::enum_<KVRowFormat>(m, "KVRowFormat", "How a KV row (or DeepSeek-V4 entry) is stored.")
      .value("BF16_ROW_1152", KVRowFormat::kBf16Row1152, "1152 B: the 576 key dims as bf16.")
      .value("FP8_ROW_656", KVRowFormat::kFp8Row656,
             "656 B: 512 e4m3 dims, 4 fp32 scales, 64 bf16 rope dims (DeepSeek-V3.2, GLM-5).")
      .value("FP8_ENTRY_584", KVRowFormat::kFp8Entry584,
             "584 B, a DeepSeek-V4 entry: 448 e4m3 dims, 64 bf16 rope dims, 7 UE8M0 scales, 1 "
             "pad.")
      .value("MXFP4_ENTRY_368", KVRowFormat::kMxfp4Entry368,
             "368 B, a DeepSeek-V4 entry in MXFP4: 448 e2m1 dims, 14 UE8M0 scales, 2 pad, 64 "
             "bf16 rope dims.");
  m.def(
      "kv_row_bytes",
      [](KVRowFormat format) {
        if (!IsKVRowFormat(format)) throw py::value_error("kv_row_bytes: not a KVRowFormat");
        return KVRowBytes(format);
      },
      py::arg("format"), "Meaningful bytes of a row of `format`: 1152, 656, 584 or 368.");

  py::enum_<LayerKind>(m, "LayerKind", "Where a layer's entries live.")
      .value("OFFLOADED", LayerKind::kOffloaded,
             "In the host pool with a hot cache in HBM, read through a top-k (the DSA models' "
             "layers, DeepSeek-V4's CSA layers).")
      .value("RESIDENT", LayerKind::kResident,
             "Every entry in HBM, read whole at every step (DeepSeek-V4's HCA layers).")
      .value("WINDOW_ONLY", LayerKind::kWindowOnly,
             "No entries, only the raw window (DeepSeek-V4's window-only layers).");

  const LayerShape layer_defaults;
  py::class_<LayerShape>(m, "LayerShape",
                         "One attention layer: its rows and where they live (fields as in "
                         "include/sparsekv/options.h).")
      .def(py::init([](int32_t row_bytes, int32_t row_stride, LayerKind kind, int32_t entry_tokens,
                       int32_t top_k, std::optional<KVRowFormat> format, int32_t index_group,
                       bool indexer_keys) {
             LayerShape l;
             l.row_bytes = row_bytes;
             l.row_stride = row_stride > 0 ? row_stride : row_bytes;
             l.kind = kind;
             l.entry_tokens = entry_tokens;
             l.top_k = top_k;
             l.format = format;
             l.index_group = index_group;
             l.indexer_keys = indexer_keys;
             return l;
           }),
           py::arg("row_bytes"), py::arg("row_stride") = 0, py::kw_only(),
           py::arg("kind") = layer_defaults.kind,
           py::arg("entry_tokens") = layer_defaults.entry_tokens,
           py::arg("top_k") = layer_defaults.top_k, py::arg("format") = py::none(),
           py::arg("index_group") = layer_defaults.index_group,
           py::arg("indexer_keys") = layer_defaults.indexer_keys,
           "row_stride 0 means row_stride = row_bytes; the other fields default to what the "
           "manager serves (an offloaded layer with a row per token).")
      .def_readwrite("row_bytes", &LayerShape::row_bytes,
                     "Meaningful bytes per row (DeepSeek-V3.2 fp8: 656; bf16: 1152).")
      .def_readwrite("row_stride", &LayerShape::row_stride,
                     "Bytes between consecutive rows, >= row_bytes.")
      .def_readwrite("kind", &LayerShape::kind, "Where the layer's entries live (LayerKind).")
      .def_readwrite("entry_tokens", &LayerShape::entry_tokens,
                     "Tokens per entry: 1 for a row per token; DeepSeek-V4 4 (CSA) or 128 (HCA).")
      .def_readwrite("top_k", &LayerShape::top_k,
                     "Entries per top-k row of an offloaded layer; 0: CacheOptions.top_k.")
      .def_readwrite("format", &LayerShape::format,
                     "The row's KVRowFormat, or None for rows the library never decodes.")
      .def_readwrite("index_group", &LayerShape::index_group,
                     "The first layer of the layers sharing this layer's top-k; -1: from "
                     "CacheOptions.layers_per_index.")
      .def_readwrite("indexer_keys", &LayerShape::indexer_keys,
                     "Whether the manager holds this layer's indexer keys.")
      .def(
          "__repr__",
          [](const LayerShape& s) {
            return "LayerShape(row_bytes=" + std::to_string(s.row_bytes) +
                   ", row_stride=" + std::to_string(s.row_stride) + ")";
          },
          "LayerShape(row_bytes=..., row_stride=...).");

  py::class_<KVGeometry>(m, "KVGeometry", "Shape of the KV cache: one LayerShape per layer.")
      .def(py::init([](std::vector<LayerShape> layers) { return KVGeometry{std::move(layers)}; }),
           py::arg("layers"), "One LayerShape per attention layer, in order.")
      .def_static("uniform", &KVGeometry::Uniform, py::arg("num_layers"), py::arg("row_bytes"),
                  py::arg("row_stride") = 0,
                  "Every layer has the same row; row_stride 0 means row_bytes.")
      .def_readwrite("layers", &KVGeometry::layers, "One LayerShape per attention layer.")
      .def_property_readonly("num_layers", &KVGeometry::num_layers, "len(layers).")
      .def_property_readonly(
          "token_bytes", &KVGeometry::token_bytes,
          "Sum of row_bytes over all layers: the meaningful KV bytes of a token.")
      .def_property_readonly("token_stride_bytes", &KVGeometry::token_stride_bytes,
                             "Sum of row_stride over the offloaded layers: the bytes one row "
                             "(an entry of every offloaded layer) occupies in the host pool; "
                             "resident and window-only layers have no rows there.");
}

// A config argument: a JSON str, or a dict written as JSON by Python's json module.
std::string ConfigText(const py::handle& config, const char* what) {
  if (py::isinstance<py::str>(config)) return config.cast<std::string>();
  if (py::isinstance<py::dict>(config)) {
    return py::module_::import("json").attr("dumps")(config).cast<std::string>();
  }
  throw py::type_error(std::string(what) + " must be a dict or a JSON str, got " +
                       py::str(py::type::of(config).attr("__name__")).cast<std::string>());
}

void RegisterCacheOptions(py::module_& m) {
  py::enum_<EvictionPolicy>(m, "EvictionPolicy", "Replacement of the hot slots.")
      .value("LRU", EvictionPolicy::kLru, "Least recently used slot first.")
      .value("SEGMENTED_LRU", EvictionPolicy::kSegmentedLru,
             "Segmented LRU: slots hit again are protected; new fills are evicted first.")
      .value("CLOCK", EvictionPolicy::kClock,
             "A clock over use counts: the resolve costs O(top_k), not O(hot_slots).");
  py::enum_<CopyStrategy>(m, "CopyStrategy",
                          "How the CUDA miss copy moves its rows (performance only).")
      .value("LATTICE", CopyStrategy::kLattice, "Fixed (row, chunk) lanes, 4 rows in flight.")
      .value("LATTICE_WIDE", CopyStrategy::kLatticeWide, "The lattice with 8 rows in flight.")
      .value("WARP_ROWS", CopyStrategy::kWarpRows, "Each warp copies batches of whole rows.")
      .value("BULK", CopyStrategy::kBulk, "Hopper's bulk copies through shared memory.");

  const CacheOptions defaults;
  py::class_<CacheOptions>(m, "CacheOptions",
                           "Options of a manager; fields and defaults as in "
                           "include/sparsekv/options.h.")
      .def(py::init([](KVGeometry geometry, int32_t top_k, int32_t hot_slots, int32_t window,
                       int64_t host_capacity_tokens, int32_t max_requests,
                       int32_t max_host_requests, int32_t max_batch, int32_t max_context,
                       int32_t host_page_tokens, bool sort_misses, int32_t sort_misses_min_batch,
                       EvictionPolicy eviction, int32_t protected_percent, int32_t layers_per_index,
                       bool share_repeated_positions, int32_t max_prefetch, int32_t copy_blocks,
                       bool hybrid_residency, int64_t device_budget_bytes,
                       int32_t resident_page_rows, int32_t indexer_key_bytes,
                       int32_t fused_copy_min_batch, CopyStrategy copy_strategy,
                       int32_t prefetch_copy_blocks, int32_t copy_chunk_rows, int32_t raw_window) {
             CacheOptions o;
             o.geometry = std::move(geometry);
             o.top_k = top_k;
             o.hot_slots = hot_slots;
             o.window = window;
             o.host_capacity_tokens = host_capacity_tokens;
             o.max_requests = max_requests;
             o.max_host_requests = max_host_requests;
             o.max_batch = max_batch;
             o.max_context = max_context;
             o.host_page_tokens = host_page_tokens;
             o.sort_misses = sort_misses;
             o.sort_misses_min_batch = sort_misses_min_batch;
             o.eviction = eviction;
             o.protected_percent = protected_percent;
             o.layers_per_index = layers_per_index;
             o.share_repeated_positions = share_repeated_positions;
             o.max_prefetch = max_prefetch;
             o.copy_blocks = copy_blocks;
             o.hybrid_residency = hybrid_residency;
             o.device_budget_bytes = device_budget_bytes;
             o.resident_page_rows = resident_page_rows;
             o.indexer_key_bytes = indexer_key_bytes;
             o.fused_copy_min_batch = fused_copy_min_batch;
             o.copy_strategy = copy_strategy;
             o.prefetch_copy_blocks = prefetch_copy_blocks;
             o.copy_chunk_rows = copy_chunk_rows;
             o.raw_window = raw_window;
             return o;
           }),
           py::kw_only(), py::arg("geometry"), py::arg("top_k") = defaults.top_k,
           py::arg("hot_slots") = defaults.hot_slots, py::arg("window") = defaults.window,
           py::arg("host_capacity_tokens"), py::arg("max_requests"),
           py::arg("max_host_requests") = defaults.max_host_requests,
           py::arg("max_batch") = defaults.max_batch, py::arg("max_context"),
           py::arg("host_page_tokens") = defaults.host_page_tokens,
           py::arg("sort_misses") = defaults.sort_misses,
           py::arg("sort_misses_min_batch") = defaults.sort_misses_min_batch,
           py::arg("eviction") = defaults.eviction,
           py::arg("protected_percent") = defaults.protected_percent,
           py::arg("layers_per_index") = defaults.layers_per_index,
           py::arg("share_repeated_positions") = defaults.share_repeated_positions,
           py::arg("max_prefetch") = defaults.max_prefetch,
           py::arg("copy_blocks") = defaults.copy_blocks,
           py::arg("hybrid_residency") = defaults.hybrid_residency,
           py::arg("device_budget_bytes") = defaults.device_budget_bytes,
           py::arg("resident_page_rows") = defaults.resident_page_rows,
           py::arg("indexer_key_bytes") = defaults.indexer_key_bytes,
           py::arg("fused_copy_min_batch") = defaults.fused_copy_min_batch,
           py::arg("copy_strategy") = defaults.copy_strategy,
           py::arg("prefetch_copy_blocks") = defaults.prefetch_copy_blocks,
           py::arg("copy_chunk_rows") = defaults.copy_chunk_rows,
           py::arg("raw_window") = defaults.raw_window,
           "Keyword arguments only; geometry, host_capacity_tokens, max_requests and max_context "
           "are required. Checked when a manager is created (or by validate()).")
      .def_readwrite("geometry", &CacheOptions::geometry, FieldDoc("geometry"))
      .def_readwrite("top_k", &CacheOptions::top_k, FieldDoc("top_k"))
      .def_readwrite("hot_slots", &CacheOptions::hot_slots, FieldDoc("hot_slots"))
      .def_readwrite("window", &CacheOptions::window, FieldDoc("window"))
      .def_readwrite("raw_window", &CacheOptions::raw_window, FieldDoc("raw_window"))
      .def_readwrite("host_capacity_tokens", &CacheOptions::host_capacity_tokens,
                     FieldDoc("host_capacity_tokens"))
      .def_readwrite("max_requests", &CacheOptions::max_requests, FieldDoc("max_requests"))
      .def_readwrite("max_host_requests", &CacheOptions::max_host_requests,
                     FieldDoc("max_host_requests"))
      .def_readwrite("max_batch", &CacheOptions::max_batch, FieldDoc("max_batch"))
      .def_readwrite("max_context", &CacheOptions::max_context, FieldDoc("max_context"))
      .def_readwrite("host_page_tokens", &CacheOptions::host_page_tokens,
                     FieldDoc("host_page_tokens"))
      .def_readwrite("sort_misses", &CacheOptions::sort_misses, FieldDoc("sort_misses"))
      .def_readwrite("sort_misses_min_batch", &CacheOptions::sort_misses_min_batch,
                     FieldDoc("sort_misses_min_batch"))
      .def_readwrite("eviction", &CacheOptions::eviction, FieldDoc("eviction"))
      .def_readwrite("protected_percent", &CacheOptions::protected_percent,
                     FieldDoc("protected_percent"))
      .def_readwrite("layers_per_index", &CacheOptions::layers_per_index,
                     FieldDoc("layers_per_index"))
      .def_readwrite("share_repeated_positions", &CacheOptions::share_repeated_positions,
                     FieldDoc("share_repeated_positions"))
      .def_readwrite("max_prefetch", &CacheOptions::max_prefetch, FieldDoc("max_prefetch"))
      .def_readwrite("copy_blocks", &CacheOptions::copy_blocks, FieldDoc("copy_blocks"))
      .def_readwrite("hybrid_residency", &CacheOptions::hybrid_residency,
                     FieldDoc("hybrid_residency"))
      .def_readwrite("device_budget_bytes", &CacheOptions::device_budget_bytes,
                     FieldDoc("device_budget_bytes"))
      .def_readwrite("resident_page_rows", &CacheOptions::resident_page_rows,
                     FieldDoc("resident_page_rows"))
      .def_readwrite("indexer_key_bytes", &CacheOptions::indexer_key_bytes,
                     FieldDoc("indexer_key_bytes"))
      .def_readwrite("fused_copy_min_batch", &CacheOptions::fused_copy_min_batch,
                     FieldDoc("fused_copy_min_batch"))
      .def_readwrite("prefetch_copy_blocks", &CacheOptions::prefetch_copy_blocks,
                     FieldDoc("prefetch_copy_blocks"))
      .def_readwrite("copy_chunk_rows", &CacheOptions::copy_chunk_rows, FieldDoc("copy_chunk_rows"))
      .def_readwrite("copy_strategy", &CacheOptions::copy_strategy, FieldDoc("copy_strategy"))
      .def_property_readonly("protected_capacity", &CacheOptions::protected_capacity,
                             "SEGMENTED_LRU: the protected part's capacity in slots.")
      .def_property_readonly("effective_max_batch", &CacheOptions::effective_max_batch,
                             "max_batch, or max_requests when max_batch is 0.")
      .def_property_readonly("effective_max_host_requests",
                             &CacheOptions::effective_max_host_requests,
                             "max_host_requests, or max_requests when it is 0.")
      .def_property_readonly("slots_per_request", &CacheOptions::slots_per_request,
                             "hot_slots + window: slots per request and layer.")
      .def_property_readonly("index_groups", &CacheOptions::index_groups,
                             "Index groups: ceil(num_layers / layers_per_index).")
      .def(
          "validate", [](const CacheOptions& o) { Check(ValidateOptions(o)); },
          "Raises InvalidArgumentError naming the field and the rule that fails.")
      .def("to_json", &CacheOptionsToJson,
           "Every field as JSON, in the form from_json reads (docs/config.md): "
           "CacheOptions.from_json(o.to_json()) equals o.")
      .def_static(
          "from_json",
          [](const py::object& text, const std::optional<CacheOptions>& base) {
            return Check(
                CacheOptionsFromJson(ConfigText(text, "text"), base.value_or(CacheOptions{})));
          },
          py::arg("text"), py::arg("base") = py::none(),
          "Options from sparsekv's own JSON (a str or dict whose keys are the field names; "
          "docs/config.md): the fields it names replace base's (None: the defaults), and the "
          "result is validated. InvalidArgumentError names an unknown key (listing the accepted "
          "ones), a wrong type or range, or the field that fails validation.")
      .def_static(
          "from_sglang_hisparse_config",
          [](const py::object& config, const CacheOptions& base) {
            return Check(CacheOptionsFromSglangHisparseConfig(ConfigText(config, "config"), base));
          },
          py::arg("config"), py::arg("base"),
          "Options from SGLang's --hisparse-config (a JSON str or dict): device_buffer_size "
          "becomes hot_slots (default 2 * top_k), host_to_device_ratio the host pool as a "
          "multiple of max_requests * (hot_slots + window); base supplies the model (geometry, "
          "top_k), batch and context. Settings sparsekv cannot honour (an algorithm other than "
          "deepseek_nsa/deepseek_dsa, page_size > 1, min_sparse_prompt_len > 0) and unknown keys "
          "raise InvalidArgumentError saying why; docs/config.md has the table.")
      .def_static(
          "from_vllm_hisparse",
          [](const py::object& config, const CacheOptions& base) {
            return Check(CacheOptionsFromVllmHisparse(ConfigText(config, "config"), base));
          },
          py::arg("config"), py::arg("base"),
          "Options from vLLM's HiSparse keys in one JSON str or dict: attention_config."
          "hisparse_config's (device_buffer_size -> hot_slots, eager_host_mirror) with the "
          "HiSparseConnector's kv_connector_extra_config (host_pool_gib -> "
          "host_capacity_tokens, in whole host pages of base.geometry). Unknown keys and "
          "settings sparsekv cannot honour raise InvalidArgumentError; docs/config.md has the "
          "table.");
}

void RegisterPresets(py::module_& m) {
  py::class_<ModelPreset>(m, "ModelPreset",
                          "A model's shape (docs/workload-shapes.md): its layers, top-k, indexer "
                          "keys and raw window. find_preset returns one.")
      .def_readonly("name", &ModelPreset::name, "One of preset_names().")
      .def_readonly("num_layers", &ModelPreset::num_layers,
                    "Attention layers (the MTP layer included for DeepSeek-V4).")
      .def_readonly("row_bytes", &ModelPreset::row_bytes, "The row (entry) of every layer.")
      .def_readonly("indexer_key_bytes", &ModelPreset::indexer_key_bytes,
                    "Bytes of an indexer key, for CacheOptions.indexer_key_bytes.")
      .def_readonly("top_k", &ModelPreset::top_k,
                    "Top-k entries of the offloaded layers, for CacheOptions.top_k.")
      .def_readonly("layers", &ModelPreset::layers,
                    "Every layer: kind, cadence, top-k, index group, keys and format.")
      .def_readonly("raw_window", &ModelPreset::raw_window,
                    "Tokens of raw window every layer attends, for CacheOptions.raw_window "
                    "(DeepSeek-V4: 128; 0 for the DSA models).")
      .def_readonly("weights_per_gpu_gb", &ModelPreset::weights_per_gpu_gb,
                    "The model's weights per GPU of an 8-GPU node, in GB (1e9 B); 0 where the "
                    "preset does not say.")
      .def("geometry", &ModelPreset::geometry,
           "The KVGeometry of its layers, for CacheOptions.geometry.")
      .def("layers_of", &ModelPreset::layers_of, py::arg("kind"), py::arg("keyed") = false,
           "Layers of `kind` (with keyed=True: only those with indexer keys).")
      .def(
          "__repr__",
          [](const ModelPreset& p) {
            return "ModelPreset(name='" + p.name + "', num_layers=" + std::to_string(p.num_layers) +
                   ", row_bytes=" + std::to_string(p.row_bytes) + ")";
          },
          "ModelPreset(name=..., num_layers=..., row_bytes=...).");
  m.def("preset_names", &PresetNames,
        "The names find_preset knows: deepseek-v3.2, glm-5, deepseek-v4-flash, deepseek-v4-pro, "
        "glm-5.3.");
  m.def(
      "find_preset",
      [](const std::string& name, std::optional<KVRowFormat> format) {
        return Check(format.has_value() ? FindPreset(name, *format) : FindPreset(name));
      },
      py::arg("name"), py::arg("format") = py::none(),
      "The preset `name` with rows of `format` (None: its fp8 format, FP8_ROW_656 for the DSA "
      "models and FP8_ENTRY_584 for DeepSeek-V4). NotFoundError for an unknown name (listing the "
      "known ones); InvalidArgumentError for a format the model does not have.");
  m.def(
      "check_served_geometry",
      [](const KVGeometry& geometry, int32_t raw_window) {
        Check(CheckServedGeometry(geometry, raw_window));
      },
      py::arg("geometry"), py::arg("raw_window") = 0,
      "Returns if a manager serves this geometry today; UnimplementedError naming the first "
      "layer and field it does not serve (DeepSeek-V4's and GLM-5.3's layers, for now).");
}

void RegisterHotCacheShape(py::module_& m) {
  py::class_<HotCacheShape>(m, "HotCacheShape", "The device memory CacheOptions ask for.")
      .def_readonly("hot_slots", &HotCacheShape::hot_slots,
                    "Slots per block and layer (options.hot_slots, or chosen from the budget).")
      .def_readonly("blocks", &HotCacheShape::blocks, "Blocks: max_requests.")
      .def_readonly("page_rows", &HotCacheShape::page_rows, "Rows per page of the device memory.")
      .def_readonly("pages", &HotCacheShape::pages, "Pages of the device memory.")
      .def_readonly("keys_per_page", &HotCacheShape::keys_per_page,
                    "Indexer keys a page holds per layer (0 without indexer keys).")
      .def_readonly("block_bytes", &HotCacheShape::block_bytes, "Device bytes of one block.");
  m.def(
      "choose_hot_cache_shape",
      [](const CacheOptions& o) {
        Check(ValidateOptions(o));
        StatusOr<HotCacheShape> shape = ChooseHotCacheShape(o);
        Check(shape.status());
        return *shape;
      },
      py::arg("options"),
      "The hot cache a manager with these options would allocate: with device_budget_bytes and "
      "hot_slots = 0, the slots the library chooses.");
}

}  // namespace

void RegisterOptions(py::module_& m) {
  RegisterGeometry(m);
  RegisterCacheOptions(m);
  RegisterPresets(m);
  RegisterHotCacheShape(m);
}

}  // namespace sparsekv
