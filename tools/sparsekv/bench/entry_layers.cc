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

}  // namespace sparsekv::tools
