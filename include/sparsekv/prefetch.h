// Cross-step prefetch prediction, one of the ways of hiding transfers (docs/overlap.md): after
// step t has resolved a layer's top-k, predict positions that step t + 1 will select and that are
// not in the hot cache, so that they can be fetched while the rest of step t runs.
//
// The predictor ("neighbours", chosen by `sparsekv replay --prefetch`; docs/prefetch.md) reads
// only step t's top-k row, Resolve's fill mask and the row's seq_len: no per-request state.
// For every batch row b < *batch_size with e = batch[b], W = window, P = budget, and
//   exit_begin = max(0, e.seq_len - W),  limit = clamp(e.seq_len + 1 - W, 0, e.seq_len),
// a position c is a candidate if 0 <= c < limit, c is not already predicted for the row, and c
// is not an entry of the row with c < exit_begin (those are in the hot cache after step t). The
// row's predictions are the first P candidates, in this order:
//   1. the position leaving the window at the next step, exit_begin, if W >= 1 and
//      e.seq_len >= W (with W = 1: step t's newest token, a window hit now, a miss if selected
//      at step t + 1; [exit_begin, limit) holds at most this one position);
//   2. m + 1, then m - 1, for each miss m of the row in k order;
//   3. m + 2, then m - 2, likewise.
// A miss is the position of an entry k whose fill_mask[b * top_k + k] is nonzero and whose
// position is in [0, e.seq_len); misses are taken in the order of their first such entry, and a
// position flagged at several entries (Resolve's share_duplicates flags repeats of a miss too)
// counts once. predicted[b * P + i] holds the i-th prediction and -1 past the last one. A row with
// e.block < 0 gets P entries of -1; rows at or past *batch_size are not touched. Padding and
// out-of-range entries of the top-k are skipped; no output is outside [0, e.seq_len) and none
// repeats within a row.
//
// The caller prefetches by resolving the predictions of layer l against the hot cache for step
// t + 1 (Resolve over `predicted` as a top-k of P entries, on a side stream): resident ones are
// refreshed, the others are fetched into LRU victims like misses.
#pragma once

#include <cstdint>

#include "sparsekv/backend.h"
#include "sparsekv/kernel_views.h"
#include "sparsekv/status.h"

namespace sparsekv {

// Largest top_k and budget the CUDA operator accepts.
inline constexpr int32_t kMaxPrefetchTopK = 4096;
inline constexpr int32_t kMaxPrefetchBudget = 1024;

// Plain view, by value; pointers are device memory for the CUDA operator, host memory for the
// reference. Semantics at the top of this file.
struct PrefetchView {
  const int32_t* batch_size;  // device scalar: rows in use this step
  const BatchEntry* batch;    // [max_batch] block (< 0: unused row) and seq_len at step t
  const int32_t* topk;        // [max_batch, topk_stride] step t's positions, -1 = padding
  int32_t top_k;              // entries per row
  int32_t topk_stride;        // elements between rows of topk (>= top_k)
  const uint8_t* fill_mask;   // [max_batch, top_k] Resolve's fill mask of step t; 1 = miss
  int32_t window;             // W: the manager's always-resident newest tokens (>= 0)
  int32_t budget;             // P: predictions per row
  int32_t* predicted;         // [max_batch, budget] output, -1 = none
};

// The reference (the oracle): plain loops over host memory; never fails.
// REQUIRES (not checked: the oracle of the tests, with no error to return): top_k >= 0,
// topk_stride >= top_k, budget >= 0, window >= 0, and the arrays sized as the view says for rows
// below *batch_size.
void PredictPrefetchReference(const PrefetchView& view);

// The same on the CUDA device that owns `stream` (the calling thread's current device): enqueues
// one kernel, one CTA per row of [0, max_batch); rows at or past *batch_size return at once, so
// one launch serves every batch size up to max_batch and may be captured into a CUDA graph.
// Never allocates or synchronises. InvalidArgument for top_k outside [0, kMaxPrefetchTopK],
// budget outside [0, kMaxPrefetchBudget], topk_stride < top_k, window < 0 or max_batch < 0;
// Unavailable if the library was built without CUDA; Internal for a failing launch.
// REQUIRES (not checked: *batch_size is in device memory, read by the kernel): *batch_size <=
// max_batch.
Status PredictPrefetchCuda(const PrefetchView& view, int32_t max_batch, StreamHandle stream);

}  // namespace sparsekv
