// What the end-to-end benchmark holds and attends in each layer of a DeepSeek-V4 request
// (docs/deepseek-v4.md): the geometry the GPU variants of such a preset are built from. Per layer
// of one request at some positions: the entries full-hbm keeps in HBM, and the widths of the two
// scopes SparseEntryAttention (sparsekv/attention.h) reads, the same in both variants so that
// their outputs compare byte for byte:
//   CSA (offloaded, cadence 4): all floor(T / 4) entries held; top_k selected + the raw window;
//   HCA (resident, cadence 128): all floor(T / 128) entries held and selected + the raw window;
//   window-only: no entries; the raw window only.
// Pure host code, tested on the CPU (entry_layers_test.cc).
#pragma once

#include <cstdint>
#include <vector>

#include "sparsekv/kv_footprint.h"
#include "sparsekv/options.h"

namespace sparsekv::tools {

// One layer of one request holding `tokens` positions.
struct EntryLayerScopes {
  LayerKind kind = LayerKind::kOffloaded;
  int32_t entry_tokens = 1;  // r: tokens per entry (1 for a window-only layer)
  int32_t entry_bytes = 0;   // the stride of an entry and of a raw-window row
  // floor(tokens / r) entries (0 for window-only): what full-hbm holds in HBM; sparsekv holds a
  // CSA layer's in the host pool (a hot cache of them in HBM), an HCA layer's in DenseEntries.
  int64_t entries = 0;
  // Entries of the selected scope: CSA top_k (a top-k row), HCA `entries` (every entry), 0 for
  // window-only.
  int64_t selected = 0;
  int32_t window = 0;  // rows of the raw-window scope: min(tokens, raw_window)
};

// The layers of `geometry` (BenchGeometry of a DeepSeek-V4 preset) for a request of `tokens`
// positions; `top_k` is the CSA layers' top-k where LayerShape::top_k is 0.
// REQUIRES: tokens >= 0, raw_window >= 0.
std::vector<EntryLayerScopes> EntryLayerScopesOf(const KVGeometry& geometry, int32_t top_k,
                                                 int32_t raw_window, int64_t tokens);

// Bytes full-hbm allocates for one request's layers: every entry and every raw-window ring
// (raw_window rows of each layer's stride). Footprint(kFullHbm) also charges the CSA layers'
// indexer keys, which the engine owns, and the top-k row's indices.
int64_t FullHbmEntryBytes(const std::vector<EntryLayerScopes>& layers, int32_t raw_window);

// The widest selected scope of `layers` (the attention's and the index buffers' width).
int64_t MaxSelected(const std::vector<EntryLayerScopes>& layers);

// Bytes a step of `batch` requests moves besides attention and the proxy (Traffic in
// kv_footprint.h, per layer kind; B = batch, e = entry_bytes, r = entry_tokens, S = selected,
// C = hot_slots, an entry completed every r steps counted as e / r per step):
//   full-hbm: pcie 0; hbm B * sum over layers of (e (the raw-window row) + e / r (the entry,
//             none for window-only) + 2 * S * 4 (the selected scope's indices written and read))
//   sparsekv: pcie misses * e + B * sum over CSA layers of e / r (completed entries written to
//             the host pool); hbm misses * e + B * sum over CSA layers of (e + e / r + 3 * S * 4
//             + 4 * C * 4) + B * sum over the other layers of full-hbm's terms
// misses: entries copied from the host per step. Other variants are not defined (zero).
StepTraffic EntryTraffic(KVVariant variant, const std::vector<EntryLayerScopes>& layers,
                         int32_t hot_slots, int32_t batch, double misses_per_step);

}  // namespace sparsekv::tools
