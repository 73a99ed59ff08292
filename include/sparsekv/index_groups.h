// IndexGroups: which layers share one top-k, and each group's top-k.
//
// An index group is a run of consecutive layers whose top-k is computed once, by the engine's
// indexer on the group's first layer (its leader), and read by every layer of the group: the
// manager resolves it on the leader (one replacement state per group and block, HotCache) and
// copies the same misses into every layer of the group. The groups come from the options in one
// of two ways: uniform, CacheOptions::layers_per_index consecutive layers each (the last group
// may be shorter); or explicit, LayerShape::index_group naming each layer's leader (GLM-5.3:
// {0}, {1}, {2-5}, {6-9}, ...).
//
// A value type: immutable after construction, safe to share between threads.
#pragma once

#include <cstdint>
#include <vector>

#include "sparsekv/options.h"

namespace sparsekv {

class IndexGroups {
 public:
  // The groups `options` describe. A layer starts a group when it is layer 0, when its
  // index_group names itself, or (without explicit groups) when its index is a multiple of
  // layers_per_index; any other layer joins the group before it. A group's top-k is its leader's
  // (LayerShape::top_k, or CacheOptions::top_k where that is 0). REQUIRES: ValidateOptions(options)
  // is OK (it keeps a group's layers consecutive and of one top-k); on other options the groups
  // are still well formed, but need not be what was meant.
  explicit IndexGroups(const CacheOptions& options);
  // Groups of `layers_per_index` consecutive layers over `layers`, each of top-k `top_k`.
  // REQUIRES: layers >= 1, layers_per_index >= 1.
  static IndexGroups Uniform(int32_t layers, int32_t layers_per_index, int32_t top_k);

  int32_t layers() const { return static_cast<int32_t>(group_of_.size()); }
  int32_t count() const { return static_cast<int32_t>(top_k_.size()); }
  // The group of `layer` (in [0, count())). REQUIRES: 0 <= layer < layers().
  int32_t Of(int32_t layer) const { return group_of_[layer]; }
  // Group g's layers are [First(g), End(g)). REQUIRES: 0 <= g < count().
  int32_t First(int32_t group) const { return first_[group]; }
  int32_t End(int32_t group) const { return first_[group + 1]; }
  int32_t Size(int32_t group) const { return End(group) - First(group); }
  // The first layer of `layer`'s group: the one that resolves for it.
  int32_t Leader(int32_t layer) const { return First(Of(layer)); }
  bool Leads(int32_t layer) const { return Leader(layer) == layer; }
  // Entries per top-k row of group g, and of `layer`'s group.
  int32_t TopK(int32_t group) const { return top_k_[group]; }
  int32_t LayerTopK(int32_t layer) const { return TopK(Of(layer)); }
  // The largest top-k of any group: what per-step buffers sized by top-k are sized for.
  int32_t max_top_k() const { return max_top_k_; }
  // Whether some group has more than one layer (its layers share a miss list).
  bool shared() const { return count() < layers(); }
  // Whether the layers name their groups (LayerShape::index_group) rather than layers_per_index:
  // the option the error messages name.
  bool named() const { return named_; }
  const char* option() const { return named_ ? "index_group" : "layers_per_index"; }

 private:
  IndexGroups() = default;
  // Appends `layer` to the last group, or starts a new one of `top_k` at it.
  void Add(int32_t layer, bool starts_group, int32_t top_k);

  std::vector<int32_t> group_of_;  // per layer
  std::vector<int32_t> first_;     // per group, then layers()
  std::vector<int32_t> top_k_;     // per group
  int32_t max_top_k_ = 0;
  bool named_ = false;
};

}  // namespace sparsekv
