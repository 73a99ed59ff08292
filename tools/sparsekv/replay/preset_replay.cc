#include "tools/sparsekv/replay/preset_replay.h"

#include <algorithm>
#include <span>

#include "sparsekv/options.h"
#include "tools/sparsekv/common/preset_layers.h"

namespace sparsekv::tools {
namespace {

// 1M tokens: DeepSeek-V4's context window, and the longest context docs/workload-shapes.md
// tabulates for every preset.
constexpr int32_t kMaxContextTokens = 1 << 20;

}  // namespace

int32_t PresetReplayShape::row_sources() const {
  int32_t n = 0;
  for (int32_t l = 0; l < layers; ++l) n += row_source[l] == l;
  return n;
}

StatusOr<PresetReplayShape> FindPresetReplayShape(const std::string& name) {
  StatusOr<ModelPreset> found = FindPreset(name);
  if (!found.ok()) return found.status();
  const ModelPreset& p = *found;
  PresetReplayShape s;
  s.preset = name;
  s.model_layers = p.num_layers;
  s.row_bytes = p.row_bytes;
  s.max_context_tokens = kMaxContextTokens;
  s.manager_serves =
      CheckToolsDriveLayers(p.geometry(), p.raw_window, ToolLayers::kOffloadedOnly).ok();
  std::vector<int32_t> replayed_index(p.num_layers, -1);  // model layer -> replayed layer
  for (int32_t i = 0; i < p.num_layers; ++i) {
    const LayerShape& l = p.layers[i];
    if (l.kind != LayerKind::kOffloaded) continue;
    // A layer's top_k of 0 is the options' (the preset's) top-k; every offloaded layer of a
    // preset has the same top-k and cadence.
    s.top_k = l.top_k > 0 ? l.top_k : p.top_k;
    s.entry_tokens = l.entry_tokens;
    // index_group -1: the layer is its own group; else the model layer of the group's indexer,
    // which comes first.
    const int32_t source = l.index_group < 0 ? i : l.index_group;
    replayed_index[i] = s.layers++;
    s.row_source.push_back(replayed_index[source] >= 0 ? replayed_index[source] : s.layers - 1);
  }
  return s;
}

Status CheckPresetContext(const PresetReplayShape& shape, int64_t tokens,
                          const std::string& option) {
  const int64_t least = static_cast<int64_t>(shape.top_k) * shape.entry_tokens;
  if (tokens < least || tokens > shape.max_context_tokens) {
    return InvalidArgument(option + " " + std::to_string(tokens) + ": " + shape.preset +
                           " replays histories of " + std::to_string(least) + " to " +
                           std::to_string(shape.max_context_tokens) +
                           " tokens (at least its top-k " + std::to_string(shape.top_k) +
                           " entries of " + std::to_string(shape.entry_tokens) + " token" +
                           (shape.entry_tokens == 1 ? "" : "s") + ", at most 1M tokens)");
  }
  return Status::Ok();
}

Trace PresetTrace(const PresetReplayShape& shape, TopKGeneratorOptions options, int32_t steps,
                  int32_t context_tokens) {
  options.top_k = shape.top_k;
  Trace t;
  t.Resize(shape.layers, shape.top_k, steps);
  const size_t k = shape.top_k;
  std::vector<LayerTopKGenerator> generators;  // one per row source, in layer order
  std::vector<int32_t> generator_of(shape.layers, -1);
  for (int32_t l = 0; l < shape.layers; ++l) {
    if (shape.row_source[l] != l) continue;
    generator_of[l] = static_cast<int32_t>(generators.size());
    generators.emplace_back(options, generator_of[l], 1);
  }
  for (int32_t step = 0; step < steps; ++step) {
    const int32_t seq_len = shape.entries(static_cast<int64_t>(context_tokens) + step);
    const size_t first = static_cast<size_t>(step) * shape.layers;
    int32_t lower = -1;  // the previous row source of this step
    for (int32_t l = 0; l < shape.layers; ++l) {
      t.seq_len[first + l] = seq_len;
      const std::span<int32_t> out(t.positions.data() + (first + l) * k, k);
      const int32_t source = shape.row_source[l];
      if (source != l) {
        const int32_t* row = t.positions.data() + (first + source) * k;
        std::copy(row, row + k, out.begin());
        continue;
      }
      LayerTopKGenerator& g = generators[generator_of[l]];
      if (lower < 0) {
        g.Next(std::span(&seq_len, 1), out);
      } else {
        g.Next(std::span(&seq_len, 1), out,
               std::span<const int32_t>(t.positions.data() + (first + lower) * k, k));
      }
      lower = l;
    }
  }
  return t;
}

}  // namespace sparsekv::tools
