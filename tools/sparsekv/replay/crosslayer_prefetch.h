// Cross-layer speculative prefetch in `sparsekv replay --crosslayer-prefetch` (docs/prefetch.md).
//
// At each step, as soon as layer L's top-k row is known, it is resolved against layer L + 1's hot
// cache as a prefetch, exactly as SparseKVCacheManager::PrefetchLayer(L + 1, row of L, top_k)
// does: the library's reference resolve over that row (padding, out-of-range, repeated and window
// entries are skipped; resident rows become the most recently used; the others take victims as
// misses do and are copied). Then layer L + 1 resolves its own row. Layer 0 has no layer below
// and is never prefetched. Every layer is also replayed without prefetch (the baseline) in
// lockstep, so that each entry of a row is compared between the two runs.
//
// Counts over the steps >= warmup and the predicted layers (1 .. layers - 1):
//   lookups         = hits + window hits + misses of the layers' own resolves;
//   prefetched      = prefetch entries that were not resident (each copies one row);
//   useful          = entries of a layer's own resolve that hit a row its prefetch of the same
//                     step copied;
//   misses          = the own resolves' misses with prefetch; baseline_misses = without;
//   covered         = entries that miss in the baseline and are useful with prefetch;
//   induced_misses  = entries that miss with prefetch but not in the baseline (a wrong guess
//                     evicted a row that was needed later);
//   precision       = useful / prefetched;
//   recall          = covered / baseline_misses;
//   hidden_fraction = useful / (useful + misses): of the rows a resolve needed copied, the share
//                     copied ahead of it;
//   wasted          = prefetched - useful (copied rows the step did not use).
// Bytes over all layers (layer 0 included; it is the same in both runs), steps >= warmup:
//   baseline_bytes = every baseline miss * row_bytes;
//   bytes          = (every miss + prefetched) * row_bytes;
//   critical_bytes = every miss * row_bytes: the copies still between a resolve and its attention.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "sparsekv/status.h"
#include "sparsekv/trace.h"
#include "tools/sparsekv/replay/policies.h"
#include "tools/sparsekv/replay/replay.h"

namespace sparsekv::tools {

struct CrossLayerOptions {
  std::vector<int32_t> hot_slots;                         // each >= top_k
  std::vector<PolicyKind> policies = {PolicyKind::kLru};  // the manager's: lru, slru or clock
  int32_t protected_percent = 80;                         // slru
  int32_t warmup_steps = 16;
  int32_t row_bytes = 656;
};

struct CrossLayerResult {
  std::string policy;
  int32_t hot_slots = 0;
  uint64_t lookups = 0;
  uint64_t prefetched = 0;
  uint64_t useful = 0;
  uint64_t misses = 0;
  uint64_t baseline_misses = 0;
  uint64_t covered = 0;
  uint64_t induced_misses = 0;
  uint64_t wasted = 0;
  double precision = 0;
  double recall = 0;
  double hidden_fraction = 0;
  double bytes = 0;
  double baseline_bytes = 0;
  double critical_bytes = 0;
  std::vector<double> layer_recall;  // [layers]; layer 0: 0
};

// Every hot_slots x policy, in that nesting order. InvalidArgument for no hot-cache size, one
// below top_k, a policy other than lru, slru and clock, or warmup outside [0, steps).
StatusOr<std::vector<CrossLayerResult>> ReplayCrossLayerPrefetch(
    const Trace& trace, const CrossLayerOptions& options,
    const ReplayProgressFn& progress = nullptr);

// The results as a text table: precision, recall, hidden fraction, induced misses, and the bytes
// moved and left on the critical path relative to the baseline.
std::string CrossLayerTable(const std::vector<CrossLayerResult>& results);

}  // namespace sparsekv::tools
