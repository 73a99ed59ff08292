// full-hbm's storage of a DeepSeek-V4 layer in the end-to-end benchmark and the index rows its
// attention reads, written once for the kernels (gpu_kernels.cu) and the CPU test that holds them
// to the manager's views (entry_scopes_test.cc). Request b's entries of a layer are rows
// [b * entry_rows, (b + 1) * entry_rows) of one buffer (entry e at row b * entry_rows + e), its
// raw window a ring of raw_window rows at [b * raw_window, (b + 1) * raw_window) of another (the
// row of token t in ring slot t mod raw_window), so that every scope is one row buffer and int32
// row indices (SparseEntryAttention's AttentionScope). A request of n tokens (this step's
// included) reads, as the manager's DenseEntriesView and RawWindowView order them:
//   HCA (every entry): index k < floor(n / r) is row b * entry_rows + k, -1 past it;
//   the raw window: index i < min(n, raw_window) is the ring row of token n - valid + i (oldest
//   first), -1 past it.
// A CSA layer's top-k names entries: row b * entry_rows + e (PositionsToRows). The step's append
// writes the entry the token completes (EntriesAt) and the ring slot of the token
// (RawWindowSlot), as DenseAppendView does. C++17, host and device.
#pragma once

#include <cstdint>

#include "sparsekv/kernel_views.h"

namespace sparsekv::tools {

// Index k of batch row b's every-entry scope (HCA), for a request of `tokens` tokens.
SPARSEKV_HD inline int32_t EveryEntryIndex(int32_t b, int32_t k, int32_t tokens,
                                           int32_t entry_tokens, int32_t entry_rows) {
  return k < tokens / entry_tokens ? b * entry_rows + k : -1;
}

// Index i of batch row b's raw-window scope, oldest first.
SPARSEKV_HD inline int32_t WindowIndex(int32_t b, int32_t i, int32_t tokens, int32_t raw_window) {
  const int32_t valid = tokens < raw_window ? tokens : raw_window;
  return i < valid ? b * raw_window + (tokens - valid + i) % raw_window : -1;
}

// The entry row the step reaching `tokens` writes, or -1 if it completes none.
SPARSEKV_HD inline int32_t AppendedEntryRow(int32_t b, int32_t tokens, int32_t entry_tokens,
                                            int32_t entry_rows) {
  const int32_t c = EntriesAt(tokens, entry_tokens).completed;
  return c == kNoEntry ? -1 : b * entry_rows + c;
}

// The ring row the step reaching `tokens` writes. REQUIRES: tokens >= 1.
SPARSEKV_HD inline int32_t AppendedWindowRow(int32_t b, int32_t tokens, int32_t raw_window) {
  return b * raw_window + RawWindowSlot(tokens, raw_window);
}

}  // namespace sparsekv::tools
