#include "tools/sparsekv/bench/entry_layers.h"

#include <algorithm>

namespace sparsekv::tools {

std::vector<EntryLayerScopes> EntryLayerScopesOf(const KVGeometry& geometry, int32_t top_k,
                                                 int32_t raw_window, int64_t tokens) {
  std::vector<EntryLayerScopes> out;
  out.reserve(geometry.layers.size());
  for (const LayerShape& l : geometry.layers) {
    EntryLayerScopes s;
    s.kind = l.kind;
    s.entry_tokens = l.kind == LayerKind::kWindowOnly ? 1 : l.entry_tokens;
    s.entry_bytes = l.row_stride;
    s.window = static_cast<int32_t>(std::min<int64_t>(tokens, raw_window));
    switch (l.kind) {
      case LayerKind::kOffloaded:
        s.entries = tokens / s.entry_tokens;
        s.selected = l.top_k > 0 ? l.top_k : top_k;
        break;
      case LayerKind::kResident:
        s.entries = tokens / s.entry_tokens;
        s.selected = s.entries;
        break;
      case LayerKind::kWindowOnly:
        break;
    }
    out.push_back(s);
  }
  return out;
}

int64_t FullHbmEntryBytes(const std::vector<EntryLayerScopes>& layers, int32_t raw_window) {
  int64_t bytes = 0;
  for (const EntryLayerScopes& l : layers) {
    bytes += (l.entries + raw_window) * l.entry_bytes;
  }
  return bytes;
}

int64_t MaxSelected(const std::vector<EntryLayerScopes>& layers) {
  int64_t widest = 0;
  for (const EntryLayerScopes& l : layers) widest = std::max(widest, l.selected);
  return widest;
}

StepTraffic EntryTraffic(KVVariant variant, const std::vector<EntryLayerScopes>& layers,
                         int32_t hot_slots, int32_t batch, double misses_per_step) {
  StepTraffic t;
  if (variant != KVVariant::kFullHbm && variant != KVVariant::kSparseKV) return t;
  const bool sparsekv = variant == KVVariant::kSparseKV;
  double per_request_hbm = 0, per_request_pcie = 0;
  for (const EntryLayerScopes& l : layers) {
    const double e = l.entry_bytes;
    const double entry = l.kind == LayerKind::kWindowOnly ? 0 : e / l.entry_tokens;
    const double selected = static_cast<double>(l.selected);
    if (sparsekv && l.kind == LayerKind::kOffloaded) {
      per_request_pcie += entry;
      per_request_hbm += e + entry + 3 * selected * 4 + 4.0 * hot_slots * 4;
    } else {
      per_request_hbm += e + entry + 2 * selected * 4;
    }
  }
  // A miss is an offloaded layer's entry (every offloaded layer has the one stride).
  double miss_bytes = 0;
  if (sparsekv) {
    for (const EntryLayerScopes& l : layers) {
      if (l.kind == LayerKind::kOffloaded) miss_bytes = misses_per_step * l.entry_bytes;
    }
  }
  t.pcie_bytes = miss_bytes + batch * per_request_pcie;
  t.hbm_bytes = miss_bytes + batch * per_request_hbm;
  return t;
}

}  // namespace sparsekv::tools
