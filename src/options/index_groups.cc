#include "sparsekv/index_groups.h"

#include <algorithm>

namespace sparsekv {

void IndexGroups::Add(int32_t layer, bool starts_group, int32_t top_k) {
  if (starts_group || top_k_.empty()) {
    if (first_.empty()) {
      first_.push_back(layer);
    } else {
      first_.back() = layer;  // the end of the previous group
    }
    first_.push_back(layer + 1);
    top_k_.push_back(top_k);
    max_top_k_ = std::max(max_top_k_, top_k);
  } else {
    first_.back() = layer + 1;
  }
  group_of_.push_back(count() - 1);
}

IndexGroups::IndexGroups(const CacheOptions& options) {
  const std::vector<LayerShape>& layers = options.geometry.layers;
  const int32_t n = std::max(options.layers_per_index, 1);
  for (int32_t l = 0; l < static_cast<int32_t>(layers.size()); ++l) {
    const LayerShape& shape = layers[l];
    named_ = named_ || shape.index_group >= 0;
    const bool starts = shape.index_group >= 0 ? shape.index_group == l : l % n == 0;
    Add(l, starts, shape.top_k > 0 ? shape.top_k : options.top_k);
  }
}

IndexGroups IndexGroups::Uniform(int32_t layers, int32_t layers_per_index, int32_t top_k) {
  IndexGroups groups;
  for (int32_t l = 0; l < layers; ++l) groups.Add(l, l % layers_per_index == 0, top_k);
  return groups;
}

}  // namespace sparsekv
