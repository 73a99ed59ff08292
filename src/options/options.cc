#include "sparsekv/options.h"

#include <limits>
#include <string>

namespace sparsekv {

int64_t KVGeometry::token_bytes() const {
  int64_t sum = 0;
  for (const LayerShape& l : layers) sum += l.row_bytes;
  return sum;
}

int64_t KVGeometry::token_stride_bytes() const {
  int64_t sum = 0;
  for (const LayerShape& l : layers) sum += l.row_stride;
  return sum;
}

KVGeometry KVGeometry::Uniform(int32_t num_layers, int32_t row_bytes, int32_t row_stride) {
  KVGeometry g;
  g.layers.assign(num_layers > 0 ? num_layers : 0,
                  LayerShape{row_bytes, row_stride == 0 ? row_bytes : row_stride});
  return g;
}

StatusOr<ModelPreset> FindPreset(const std::string& name, KVRowFormat format) {
  const int32_t row = format == KVRowFormat::kFp8Row656 ? 656 : 1152;
  if (name == "deepseek-v3.2") return ModelPreset{name, 61, row, 132, 2048};
  if (name == "glm-5") return ModelPreset{name, 78, row, 132, 2048};
  return NotFound("unknown model preset '" + name + "' (known: deepseek-v3.2, glm-5)");
}

namespace {

Status Field(const std::string& rule) { return InvalidArgument("CacheOptions: " + rule); }

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
  }
  if (o.top_k <= 0) return Field("top_k must be > 0");
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
    for (const LayerShape& layer : o.geometry.layers) {
      if (layer.row_stride != o.geometry.layers[0].row_stride || layer.row_stride % 4 != 0) {
        return Field("indexer_key_bytes needs one row_stride, a multiple of 4, in every layer");
      }
    }
    if (!o.geometry.layers.empty() &&
        int64_t{o.resident_page_rows} * o.geometry.layers[0].row_stride < o.indexer_key_bytes) {
      return Field("indexer_key_bytes (" + std::to_string(o.indexer_key_bytes) +
                   ") exceeds a page (resident_page_rows * row_stride)");
    }
  }
  if (o.eviction != EvictionPolicy::kLru && o.eviction != EvictionPolicy::kSegmentedLru) {
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
  const int64_t host_rows =
      (o.host_capacity_tokens + o.host_page_tokens - 1) / o.host_page_tokens * o.host_page_tokens;
  if (host_rows > kInt32Max) return Field("host_capacity_tokens overflows 32-bit row indices");
  if (o.device_budget_bytes == 0) {
    const int64_t slots = static_cast<int64_t>(o.max_requests) * (o.hot_slots + int64_t{o.window});
    if (slots > kInt32Max) {
      return Field("max_requests * (hot_slots + window) overflows 32-bit slot indices");
    }
  }
  const int64_t misses = static_cast<int64_t>(o.effective_max_batch()) * o.top_k;
  if (misses > kInt32Max) return Field("max_batch * top_k overflows 32-bit miss indices");
  return Status::Ok();
}

}  // namespace sparsekv
