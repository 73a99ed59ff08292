// A model preset's offloaded layers as `sparsekv replay --preset` replays them: how many, their
// top-k and entry size, which rows they share, the context the model allows, and a synthetic
// trace of that shape whose history grows by one token per step.
//
// Units: a row's positions and the hot cache count entries; a DSA model (DeepSeek-V3.2, GLM-5,
// GLM-5.3) has an entry per token, a DeepSeek-V4 CSA layer one per 4 tokens. Contexts are given
// in tokens: a history of T tokens holds floor(T / entry_tokens) entries (the newest,
// incomplete group of tokens has no entry yet, docs/deepseek-v4.md).
//
// Only the offloaded layers are replayed: DeepSeek-V4's HCA layers are resident and read whole,
// its window-only layers have no entries (docs/workload-shapes.md). Layers of one index group
// (GLM-5.3's IndexShare) read the same row at every step, each through its own hot cache.
//
// Thread safety: the functions keep no state; a shape is a plain value.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "sparsekv/status.h"
#include "sparsekv/topk_generator.h"
#include "sparsekv/trace.h"

namespace sparsekv::tools {

struct PresetReplayShape {
  std::string preset;
  int32_t model_layers = 0;  // every attention layer of the model
  int32_t layers = 0;        // the offloaded layers, the ones replayed
  int32_t top_k = 0;         // entries per row of an offloaded layer
  int32_t entry_tokens = 1;  // tokens per entry: 1 (DSA) or 4 (CSA)
  int32_t row_bytes = 0;     // bytes per entry in the preset's fp8 format: 656 (DSA), 584 (V4)
  // [layers]: the replayed layer (an index into the offloaded layers) whose row each layer
  // reads; itself for a layer with its own indexer, which comes before the layers that share it.
  std::vector<int32_t> row_source;
  int32_t max_context_tokens = 0;  // the longest history accepted, in tokens
  // Whether the replay's manager path drives SparseKVCacheManager over these layers
  // (CheckToolsDriveLayers with ToolLayers::kOffloadedOnly: every layer offloaded; the manager
  // itself serves DeepSeek-V4's layers too, which `multi-turn` drives). Where they do,
  // the replay's lru, slru and clock are the manager's, slot for slot (replay_test.cc checks it);
  // where it does not (DeepSeek-V4, GLM-5.3), the replay's policies are the model.
  bool manager_serves = false;

  int32_t row_sources() const;  // the layers with their own row
  // Entries of a history of `tokens` tokens.
  int32_t entries(int64_t tokens) const { return static_cast<int32_t>(tokens / entry_tokens); }
};

// NotFound for a name FindPreset does not know (the message lists the known ones).
StatusOr<PresetReplayShape> FindPresetReplayShape(const std::string& name);

// InvalidArgument, naming `option`, unless a history of `tokens` tokens holds at least top_k
// entries and is at most max_context_tokens.
Status CheckPresetContext(const PresetReplayShape& shape, int64_t tokens,
                          const std::string& option);

// `steps` decode steps of one request over the shape's layers: at step s the history holds
// context_tokens + s tokens, i.e. entries(context_tokens + s) entries; each row source draws its
// row from its own generator (options.top_k is replaced by the shape's), a source's generator
// gets the previous source's row as `lower` (cross_layer_overlap), and every other layer copies
// its source's row. REQUIRES: CheckPresetContext(shape, context_tokens + steps - 1) is OK.
Trace PresetTrace(const PresetReplayShape& shape, TopKGeneratorOptions options, int32_t steps,
                  int32_t context_tokens);

}  // namespace sparsekv::tools
