#include "sparsekv/options.h"

#include <algorithm>
#include <limits>
#include <string>

#include "sparsekv/index_groups.h"

namespace sparsekv {

const char* LayerKindName(LayerKind kind) {
  switch (kind) {
    case LayerKind::kOffloaded:
      return "kOffloaded";
    case LayerKind::kResident:
      return "kResident";
    case LayerKind::kWindowOnly:
      return "kWindowOnly";
  }
  return "unknown";
}

int64_t KVGeometry::token_bytes() const {
  int64_t sum = 0;
  for (const LayerShape& l : layers) sum += l.row_bytes;
  return sum;
}

int64_t KVGeometry::token_stride_bytes() const {
  int64_t sum = 0;
  for (const LayerShape& l : layers) {
    if (l.kind == LayerKind::kOffloaded) sum += l.row_stride;
  }
  return sum;
}

int32_t KVGeometry::offloaded_entry_tokens() const {
  for (const LayerShape& l : layers) {
    if (l.kind == LayerKind::kOffloaded) return l.entry_tokens;
  }
  return 1;
}

int32_t KVGeometry::offloaded_row_stride() const {
  for (const LayerShape& l : layers) {
    if (l.kind == LayerKind::kOffloaded) return l.row_stride;
  }
  return 0;
}

KVGeometry KVGeometry::Uniform(int32_t num_layers, int32_t row_bytes, int32_t row_stride) {
  KVGeometry g;
  g.layers.assign(num_layers > 0 ? num_layers : 0,
                  LayerShape{row_bytes, row_stride == 0 ? row_bytes : row_stride});
  return g;
}

int32_t CacheOptions::index_groups() const {
  int32_t groups = 0;
  for (int32_t l = 0; l < geometry.num_layers(); ++l) {
    const int32_t g = geometry.layers[l].index_group;
    groups += l == 0 || (g >= 0 ? g == l : l % std::max(layers_per_index, 1) == 0);
  }
  return groups;
}

int32_t CacheOptions::offloaded_index_groups() const {
  const IndexGroups groups(*this);
  int32_t offloaded = 0;
  for (int32_t g = 0; g < groups.count(); ++g) offloaded += geometry.offloaded(groups.First(g));
  return offloaded;
}

Status CheckServedGeometry(const KVGeometry& geometry, int32_t raw_window) {
  (void)raw_window;  // resident entries and raw windows are held by the manager's DenseLayerStore
  for (const LayerShape& l : geometry.layers) {
    if (l.kind == LayerKind::kOffloaded) return Status::Ok();
  }
  return Unimplemented(
      "geometry.layers: no layer is kOffloaded; the manager's step is driven by its offloaded "
      "layers (host pool, hot cache, top-k), and a model of resident and window-only layers "
      "alone is not served (docs/deepseek-v4.md)");
}

namespace {

Status Field(const std::string& rule) { return InvalidArgument("CacheOptions: " + rule); }

std::string LayerAt(int32_t i) { return "geometry.layers[" + std::to_string(i) + "]"; }

// The entries per top-k row of an offloaded layer.
int32_t TopKOf(const CacheOptions& o, const LayerShape& l) {
  return l.top_k > 0 ? l.top_k : o.top_k;
}

// The rules on one layer's own fields (kind, cadence, top-k, format, group, keys).
Status ValidateLayer(const CacheOptions& o, int32_t i) {
  const LayerShape& l = o.geometry.layers[i];
  const std::string at = LayerAt(i);
  if (l.kind != LayerKind::kOffloaded && l.kind != LayerKind::kResident &&
      l.kind != LayerKind::kWindowOnly) {
    return Field(at + ".kind is not a known LayerKind");
  }
  if (l.entry_tokens < 1) {
    return Field(at + ".entry_tokens (" + std::to_string(l.entry_tokens) + ") must be >= 1");
  }
  if (l.top_k < 0) return Field(at + ".top_k must be >= 0 (0: top_k)");
  if (l.format.has_value()) {
    if (!IsKVRowFormat(*l.format)) return Field(at + ".format is not a known KVRowFormat");
    if (l.row_bytes != KVRowBytes(*l.format)) {
      return Field(at + ".row_bytes (" + std::to_string(l.row_bytes) + ") must be " +
                   std::to_string(KVRowBytes(*l.format)) + ", the bytes of its format");
    }
  }
  if (l.index_group < -1 || l.index_group > i) {
    return Field(at + ".index_group (" + std::to_string(l.index_group) +
                 ") must be -1 or an earlier layer's index, in [0, " + std::to_string(i) + "]");
  }
  if (l.kind == LayerKind::kOffloaded) return Status::Ok();
  // Resident and window-only layers are never read through a top-k.
  const std::string kind = LayerKindName(l.kind);
  if (l.top_k != 0) return Field(at + ".top_k must be 0 for a " + kind + " layer (no top-k)");
  if (l.index_group != -1) {
    return Field(at + ".index_group must be -1 for a " + kind + " layer (no top-k)");
  }
  if (l.indexer_keys && o.indexer_key_bytes > 0) {
    return Field(at + ".indexer_keys must be false for a " + kind + " layer (no top-k)");
  }
  if (l.kind == LayerKind::kWindowOnly && o.raw_window < 1) {
    return Field(at + ".kind is kWindowOnly, which needs a raw_window >= 1 (all it holds)");
  }
  return Status::Ok();
}

// The rules across layers: one cadence for the offloaded layers (the host pool's row r of every
// offloaded layer is entry r), each top-k within the hot cache, and index groups of offloaded
// layers that agree.
Status ValidateLayerKinds(const CacheOptions& o) {
  const std::vector<LayerShape>& layers = o.geometry.layers;
  if (o.raw_window < 0) return Field("raw_window must be >= 0 (0: none)");
  int32_t first = -1;  // the first offloaded layer
  bool explicit_groups = false;
  for (int32_t i = 0; i < o.geometry.num_layers(); ++i) {
    const LayerShape& l = layers[i];
    if (l.kind != LayerKind::kOffloaded) {
      if (o.layers_per_index > 1) {
        return Field("layers_per_index (" + std::to_string(o.layers_per_index) + ") with a " +
                     "layer that is not offloaded (" + LayerAt(i) + "): give index_group instead");
      }
      continue;
    }
    if (first < 0) {
      first = i;
      explicit_groups = l.index_group >= 0;
    }
    const std::string at = LayerAt(i);
    if (l.entry_tokens != layers[first].entry_tokens) {
      return Field(at + ".entry_tokens (" + std::to_string(l.entry_tokens) + ") differs from " +
                   LayerAt(first) + "'s (" + std::to_string(layers[first].entry_tokens) +
                   "): all offloaded layers share one cadence");
    }
    const int32_t top_k = TopKOf(o, l);
    // A layer's own top-k (CacheOptions::top_k is checked against hot_slots below).
    if (l.top_k > 0 && o.hot_slots != 0 && l.top_k > o.hot_slots) {
      return Field(at + ".top_k (" + std::to_string(top_k) + ") exceeds hot_slots (" +
                   std::to_string(o.hot_slots) + "): a step's misses could find no victim");
    }
    if ((l.index_group >= 0) != explicit_groups) {
      return Field(at + ".index_group: set it on every offloaded layer or on none");
    }
    if (!explicit_groups) continue;
    if (o.layers_per_index != 1) {
      return Field(at + ".index_group is set, and so is layers_per_index (" +
                   std::to_string(o.layers_per_index) + "): give one of them");
    }
    const int32_t g = l.index_group;
    const LayerShape& head = layers[g];
    if (head.kind != LayerKind::kOffloaded || head.index_group != g) {
      return Field(at + ".index_group (" + std::to_string(g) + ") must name the first layer of " +
                   "its group, whose own index_group is itself");
    }
    if (g != i && layers[i - 1].index_group != g) {
      return Field(at + ".index_group (" + std::to_string(g) + "): a group's layers must be " +
                   "consecutive");
    }
    if (top_k != TopKOf(o, head)) {
      return Field(at + ".top_k (" + std::to_string(top_k) + ") differs from its group's first " +
                   "layer's (" + std::to_string(TopKOf(o, head)) + "): a group shares one top-k");
    }
    if (o.indexer_key_bytes > 0 && l.indexer_keys && !head.indexer_keys) {
      return Field(at + ".indexer_keys is true but its group's first layer (" + LayerAt(g) +
                   ") has none: the group's top-k is computed from the first layer's keys");
    }
  }
  if (first < 0) return Field("geometry.layers has no offloaded layer (kind kOffloaded)");
  return Status::Ok();
}

}  // namespace

Status ValidateOptions(const CacheOptions& o) {
  constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();
  if (o.geometry.layers.empty()) return Field("geometry.layers is empty (need >= 1 layer)");
  for (size_t i = 0; i < o.geometry.layers.size(); ++i) {
    const LayerShape& l = o.geometry.layers[i];
    const std::string at = "geometry.layers[" + std::to_string(i) + "]";
    if (l.row_bytes <= 0) return Field(at + ".row_bytes must be > 0");
    if (l.row_stride < l.row_bytes) {
      return Field(at + ".row_stride (" + std::to_string(l.row_stride) + ") < row_bytes (" +
                   std::to_string(l.row_bytes) + ")");
    }
    SPARSEKV_RETURN_IF_ERROR(ValidateLayer(o, static_cast<int32_t>(i)));
  }
  if (o.top_k <= 0) return Field("top_k must be > 0");
  SPARSEKV_RETURN_IF_ERROR(ValidateLayerKinds(o));
  if (o.layers_per_index < 1 || o.layers_per_index > o.geometry.num_layers()) {
    return Field("layers_per_index (" + std::to_string(o.layers_per_index) +
                 ") must be in [1, number of layers = " + std::to_string(o.geometry.num_layers()) +
                 "]");
  }
  if (o.sort_misses_min_batch < 0) {
    return Field("sort_misses_min_batch (" + std::to_string(o.sort_misses_min_batch) +
                 ") must be >= 0");
  }
  if (o.fused_copy_min_batch < 0) return Field("fused_copy_min_batch must be >= 0");
  if (o.copy_strategy < CopyStrategy::kLattice || o.copy_strategy > CopyStrategy::kBulk) {
    return Field("copy_strategy is not a known CopyStrategy");
  }
  if (o.prefetch_copy_blocks < 0) return Field("prefetch_copy_blocks must be >= 0");
  if (o.copy_chunk_rows < 0) return Field("copy_chunk_rows must be >= 0");
  if (o.copy_blocks < 0) {
    return Field("copy_blocks (" + std::to_string(o.copy_blocks) + ") must be >= 0");
  }
  if (o.device_budget_bytes < 0) return Field("device_budget_bytes must be >= 0");
  if (o.hot_slots == 0 && o.device_budget_bytes == 0) {
    return Field("hot_slots = 0 (chosen by the library) needs a device_budget_bytes");
  }
  if (o.hot_slots != 0 && (o.hot_slots < o.top_k || o.hot_slots > kMaxHotSlots)) {
    return Field("hot_slots (" + std::to_string(o.hot_slots) + ") must be in [top_k = " +
                 std::to_string(o.top_k) + ", " + std::to_string(kMaxHotSlots) +
                 "]: below top_k a step's misses could find no victim");
  }
  if (o.max_prefetch < 0 || (o.hot_slots != 0 && o.max_prefetch > o.hot_slots)) {
    return Field("max_prefetch (" + std::to_string(o.max_prefetch) + ") must be in [0, hot_slots]");
  }
  if (o.window < 1) return Field("window must be >= 1 (the newest token is always resident)");
  if ((o.hybrid_residency || o.indexer_key_bytes > 0) &&
      (o.resident_page_rows < 1 ||
       (o.hot_slots != 0 && o.resident_page_rows > o.hot_slots + int64_t{o.window}))) {
    return Field("resident_page_rows (" + std::to_string(o.resident_page_rows) +
                 ") must be in [1, hot_slots + window]");
  }
  if (o.indexer_key_bytes < 0 || o.indexer_key_bytes % 4 != 0) {
    return Field("indexer_key_bytes (" + std::to_string(o.indexer_key_bytes) +
                 ") must be 0 or a positive multiple of 4");
  }
  if (o.indexer_key_bytes > 0) {
    // The keys live in the hot cache's pages, which only offloaded layers have: the other
    // layers' strides do not matter.
    const int32_t stride = o.geometry.offloaded_row_stride();
    for (const LayerShape& layer : o.geometry.layers) {
      if (layer.kind != LayerKind::kOffloaded) continue;
      if (layer.row_stride != stride || layer.row_stride % 4 != 0) {
        return Field(
            "indexer_key_bytes needs one row_stride, a multiple of 4, in every offloaded layer");
      }
    }
    if (stride > 0 && int64_t{o.resident_page_rows} * stride < o.indexer_key_bytes) {
      return Field("indexer_key_bytes (" + std::to_string(o.indexer_key_bytes) +
                   ") exceeds a page (resident_page_rows * row_stride)");
    }
  }
  if (o.eviction != EvictionPolicy::kLru && o.eviction != EvictionPolicy::kSegmentedLru &&
      o.eviction != EvictionPolicy::kClock) {
    return Field("eviction is not a known EvictionPolicy");
  }
  if (o.protected_percent < 0 || o.protected_percent > 100) {
    return Field("protected_percent (" + std::to_string(o.protected_percent) +
                 ") must be in [0, 100]");
  }
  if (o.max_requests <= 0) return Field("max_requests must be > 0");
  if (o.max_batch < 0 || o.max_batch > o.max_requests) {
    return Field("max_batch must be in [0, max_requests] (0 = max_requests)");
  }
  if (o.max_host_requests != 0 && o.max_host_requests < o.max_requests) {
    return Field("max_host_requests must be 0 or >= max_requests");
  }
  if (o.max_context <= 0) return Field("max_context must be > 0");
  if (o.host_page_tokens <= 0) return Field("host_page_tokens must be > 0");
  if (o.host_capacity_tokens < o.host_page_tokens) {
    return Field("host_capacity_tokens must hold at least one page (" +
                 std::to_string(o.host_page_tokens) + " tokens)");
  }
  // Every row and slot index is an int32; byte offsets are computed in 64 bits.
  // A row per entry: host_capacity_tokens / r of them (KVGeometry::offloaded_entry_tokens).
  const int64_t entries = o.host_capacity_tokens / o.geometry.offloaded_entry_tokens();
  const int64_t host_rows =
      (entries + o.host_page_tokens - 1) / o.host_page_tokens * o.host_page_tokens;
  if (host_rows > kInt32Max) return Field("host_capacity_tokens overflows 32-bit row indices");
  if (o.device_budget_bytes == 0) {
    const int64_t slots = static_cast<int64_t>(o.max_requests) * (o.hot_slots + int64_t{o.window});
    if (slots > kInt32Max) {
      return Field("max_requests * (hot_slots + window) overflows 32-bit slot indices");
    }
  }
  int32_t max_top_k = o.top_k;
  for (const LayerShape& l : o.geometry.layers) max_top_k = std::max(max_top_k, l.top_k);
  const int64_t misses = static_cast<int64_t>(o.effective_max_batch()) * max_top_k;
  if (misses > kInt32Max) return Field("max_batch * top_k overflows 32-bit miss indices");
  return Status::Ok();
}

}  // namespace sparsekv
