// Cross-step prefetch predictors in `sparsekv replay --prefetch` (docs/prefetch.md).
//
// After step t of a (request, layer) a predictor proposes up to P (the budget) positions for step
// t + 1 from what is known after step t: its top-k row, which entries missed, the hot cache's
// content and the predictor's own history; never a later row. The replay then resolves the
// proposals against the cache as Resolve would (lru, the manager's policy): resident ones are
// refreshed, the others are fetched into LRU victims like misses, so they can also evict rows
// that step t + 1 needs. Predictors:
//   window-exit: the position leaving the window at step t + 1 (step t's newest token, W = 1);
//   neighbours:  window-exit, then m ± 1 and m ± 2 of step t's misses m: the device operator of
//                sparsekv/prefetch.h, run through its reference (no per-request state);
//   evicted:     positions evicted in the last kEvictedSteps steps that were selected in at
//                least two steps so far, most recently evicted first, not resident;
//   dropped:     positions selected at t - 1 and t - 2 but not at t, not resident;
//   combined:    neighbours, then evicted, then dropped, up to P in all.
//
// Statistics over the steps >= warmup (per hot-cache size, predictor and budget):
//   fetched   = proposals that were not resident (each moves one row);
//   useful    = entries of step t + 1 that hit on a row fetched by the prefetch after step t;
//   misses    = demand misses with prefetch; baseline_misses = the same cache without prefetch;
//   precision = useful / fetched;
//   recall    = useful / (useful + misses): of the rows step t + 1 would have missed had the last
//               prefetch not run, the share it turned into hits;
//   net_miss_rate = misses / lookups (lookups = hits + window hits + misses, as in replay.h);
//   extra_bytes = fetched * row_bytes; net_bytes = (misses + fetched) * row_bytes.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "sparsekv/status.h"
#include "sparsekv/trace.h"
#include "tools/sparsekv/replay/replay.h"

namespace sparsekv::tools {

enum class PredictorKind { kWindowExit, kNeighbours, kEvicted, kDropped, kCombined };
// "window-exit", "neighbours", "evicted", "dropped", "combined".
std::string PredictorName(PredictorKind kind);
StatusOr<PredictorKind> ParsePredictor(const std::string& name);

// Steps an evicted position stays a candidate of the evicted predictor.
inline constexpr int32_t kEvictedSteps = 8;

struct PrefetchOptions {
  std::vector<int32_t> hot_slots;  // as in ReplayOptions; each >= top_k
  std::vector<PredictorKind> predictors;
  std::vector<int32_t> budgets;  // P per predictor run; each in [1, smallest hot_slots]
  int32_t warmup_steps = 16;
  int32_t row_bytes = 656;
};

struct PrefetchResult {
  std::string predictor;
  int32_t budget = 0;
  int32_t hot_slots = 0;
  uint64_t lookups = 0;
  uint64_t baseline_misses = 0;
  uint64_t misses = 0;
  uint64_t fetched = 0;
  uint64_t useful = 0;
  double precision = 0;
  double recall = 0;
  double baseline_miss_rate = 0;
  double net_miss_rate = 0;
  double extra_bytes = 0;
  double net_bytes = 0;  // with prefetch; the baseline moved baseline_misses * row_bytes
};

// Every hot_slots x predictor x budget, in that nesting order. InvalidArgument for a hot-cache size
// below top_k, a budget outside [1, smallest hot_slots], no predictor or budget, or warmup outside
// [0, steps).
StatusOr<std::vector<PrefetchResult>> ReplayPrefetch(const Trace& trace,
                                                     const PrefetchOptions& options,
                                                     const ReplayProgressFn& progress = nullptr);

// The best result by net miss rate (ties: the smaller budget) among `results` of one hot-cache
// size; nullptr if there is none.
const PrefetchResult* BestPrefetch(const std::vector<PrefetchResult>& results, int32_t hot_slots);

// The results as a text table: per row the precision, recall, net and baseline miss rates, the
// extra bytes per lookup and the net bytes moved relative to the baseline.
std::string PrefetchTable(const std::vector<PrefetchResult>& results, int32_t row_bytes);

}  // namespace sparsekv::tools
