// `sparsekv replay`: top-k traces (sparsekv/trace.h) through hot-cache policies (policies.h), and
// the locality statistics of a trace, from which the synthetic generator's parameters are fitted.
//
// Definitions (docs/planning.md):
//   hit_rate = (hits + window_hits) / (hits + window_hits + misses), over steps >= warmup;
//   bytes moved = misses * row_bytes (host -> HBM), over the same steps;
//   reuse distance of a selection = steps since the same layer last selected the position;
//   working set = distinct positions a layer selected over the last `working_set_steps` steps;
//   reuse fraction = |row ∩ previous row, sinks excluded| / top_k; recency fraction = entries
//   neither sinks nor reused in the newest 10% of [0, seq_len), / top_k (the generator's shares).
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "sparsekv/status.h"
#include "sparsekv/topk_generator.h"
#include "sparsekv/trace.h"
#include "tools/sparsekv/replay/policies.h"

namespace sparsekv::tools {

struct ReplayOptions {
  // Hot-cache sizes to replay: slots per request and layer, the one newest-token slot excluded
  // (the manager's hot_slots). Each must be >= top_k.
  std::vector<int32_t> hot_slots;
  std::vector<PolicyKind> policies = {PolicyKind::kLru, PolicyKind::kClock, PolicyKind::kLfuDecay,
                                      PolicyKind::kSlru, PolicyKind::kAging};
  // > 1: also replay "window<N>-lru": lru with N newest tokens resident and hot_slots + 1 - N
  // replaceable slots (the same memory), where hot_slots + 1 - N >= top_k.
  int32_t window_split = 0;
  double decay = 0.8;              // lfu-decay
  int32_t protected_percent = 80;  // slru
  int32_t aging_shift = 4;         // aging
  int32_t warmup_steps = 16;       // first steps not counted in hit rates and bytes
  int32_t row_bytes = 656;         // bytes per miss
  int32_t working_set_steps = 16;
};

struct PolicyResult {
  std::string policy;     // "lru", "clock", "lfu-decay", "window<N>-lru"
  int32_t hot_slots = 0;  // as in ReplayOptions: the memory, whatever the policy
  double hit_rate = 0;
  std::vector<double> layer_hit_rate;  // [layers]
  std::vector<double> step_hit_rate;   // [steps], over all layers; warm-up steps included
  uint64_t misses = 0;
  double bytes_moved = 0;
  double bytes_per_step = 0;  // over all layers
};

// Bucket upper bounds of the reuse-distance histogram, in steps; a last bucket counts the rest.
inline constexpr std::array<int32_t, 6> kReuseDistanceBounds = {1, 2, 4, 8, 16, 64};

struct TraceStats {
  std::vector<double> layer_reuse;    // mean reuse fraction per layer
  std::vector<double> layer_recency;  // mean recency fraction per layer
  std::vector<double> layer_working_set;
  // Selections per reuse-distance bucket (kReuseDistanceBounds, then "> 64"), and first uses.
  std::array<uint64_t, kReuseDistanceBounds.size() + 1> reuse_distance{};
  uint64_t first_uses = 0;
  double mean_seq_len = 0;
  // The generator's parameters that reproduce these statistics (top_k and seed as in `base`).
  TopKGeneratorOptions fitted;
};

struct ReplayResult {
  TraceStats stats;
  std::vector<PolicyResult> results;  // per hot_slots, per policy
};

using ReplayProgressFn = std::function<void(std::string_view phase, int64_t done, int64_t total)>;

// InvalidArgument if a hot-cache size is below top_k or the options are out of range.
StatusOr<ReplayResult> Replay(const Trace& trace, const ReplayOptions& options,
                              const ReplayProgressFn& progress = nullptr);

TraceStats MeasureTrace(const Trace& trace, int32_t working_set_steps);

// The entries of a trace's rows by kind: -1 padding, positions outside [0, seq_len) of their row
// (other negatives included), and repeats of a position already in the same row (each repeat
// counted once; out-of-range entries are not counted as repeats). A recorded trace should have
// neither of the last two; the replay reports them rather than refusing the trace.
struct TraceEntryCounts {
  uint64_t entries = 0;  // steps * layers * top_k
  uint64_t padding = 0;
  uint64_t out_of_range = 0;
  uint64_t duplicates = 0;
};
TraceEntryCounts CountTraceEntries(const Trace& trace);

// One request's trace from the generator: `steps` steps of `layers` layers, the history growing
// by one token per step from `context`; layer L > 0 gets layer L - 1's row of the same step as
// `lower` (cross_layer_overlap). REQUIRES: context >= top_k.
Trace SyntheticTrace(const TopKGeneratorOptions& options, int32_t layers, int32_t steps,
                     int32_t context);

// One point of a miss-rate curve: miss_rate = 1 - hit_rate of lru with hot_slots slots.
struct MissCurvePoint {
  int32_t hot_slots = 0;
  double miss_rate = 0;
};

// lru's miss rate at each size (window 1, steps >= warmup_steps, all layers).
// REQUIRES: every size >= top_k, warmup_steps < steps.
std::vector<MissCurvePoint> LruMissCurve(const Trace& trace, const std::vector<int32_t>& hot_slots,
                                         int32_t warmup_steps);

// Adjacent-layer overlap: |row(L, s) ∩ row(L + 1, s)| / top_k averaged over steps, per pair
// (L, L + 1) in pair[L]; mean over the pairs. Padding (-1) never matches.
struct LayerOverlap {
  std::vector<double> pair;  // [layers - 1]
  double mean = 0;
};
LayerOverlap MeasureLayerOverlap(const Trace& trace);

// Fits locality mode (topk_generator.h) to a target lru curve: a grid over reuse x zipf_exponent
// x recency (recency_window and sinks as in `base`), then two finer grids around the best point,
// minimising the sum of squared miss-rate errors. Each candidate is a SyntheticTrace of
// `layers` x `steps` at `context` replayed through lru; deterministic for a given base.seed.
struct LocalityFitOptions {
  int32_t context = 32768;
  int32_t steps = 64;
  int32_t warmup_steps = 24;
  int32_t layers = 1;
};
struct LocalityFit {
  TopKGeneratorOptions options;
  std::vector<MissCurvePoint> curve;  // the fitted options' curve at the target sizes
  double squared_error = 0;
};
LocalityFit FitLocality(const std::vector<MissCurvePoint>& target, const TopKGeneratorOptions& base,
                        const LocalityFitOptions& fit);

}  // namespace sparsekv::tools
