#include "tools/sparsekv/replay/crosslayer_prefetch.h"

#include <algorithm>
#include <cstdio>
#include <memory>

namespace sparsekv::tools {
namespace {

constexpr int32_t kWindow = 1;  // the manager's default, as in the replay's policies

// A simulated cache's content, followed from the slots its resolve returns: an entry given slot
// s < slots whose position differs from s's previous one filled s (a miss, or a prefetched row).
class SlotMirror {
 public:
  explicit SlotMirror(int32_t slots) : token_(slots, -1) {}
  // Records entry (position, slot); true if it filled the slot.
  bool Fill(int32_t position, int32_t slot) {
    if (slot < 0 || slot >= static_cast<int32_t>(token_.size()) || token_[slot] == position) {
      return false;
    }
    token_[slot] = position;
    return true;
  }

 private:
  std::vector<int32_t> token_;  // slot -> position, -1 = empty
};

struct LayerCounts {
  uint64_t lookups = 0, prefetched = 0, useful = 0, misses = 0, baseline_misses = 0, covered = 0,
           induced = 0;
};

// One layer with and without the prefetch of the layer below (none for layer 0), in lockstep.
LayerCounts RunLayer(const Trace& trace, int32_t layer, const PolicyConfig& config,
                     int32_t warmup) {
  const size_t k = trace.top_k;
  std::unique_ptr<PolicySimulator> baseline = MakePolicy(config);
  std::unique_ptr<PolicySimulator> cache = MakePolicy(config);
  SlotMirror baseline_mirror(config.slots), mirror(config.slots);
  std::vector<int32_t> baseline_slots(k), slots(k), prefetch_slots(k);
  std::vector<int64_t> prefetched_at(config.slots, -1);  // slot -> step whose prefetch filled it
  LayerCounts c;
  for (int32_t step = 0; step < trace.steps; ++step) {
    const std::span<const int32_t> row = trace.row(step, layer);
    const int32_t seq_len = trace.seq_len_at(step, layer);
    const bool counted = step >= warmup;
    const RowOutcome b = baseline->Step(row, seq_len, baseline_slots);
    if (layer == 0) {
      if (counted) c.baseline_misses += b.misses;
      continue;
    }
    // PrefetchLayer(layer, row of layer - 1, top_k): the same resolve, over the row below, at
    // this layer's history length (both come from the step's plan).
    const std::span<const int32_t> below = trace.row(step, layer - 1);
    const RowOutcome p = cache->Step(below, seq_len, prefetch_slots);
    for (size_t i = 0; i < k; ++i) {
      if (mirror.Fill(below[i], prefetch_slots[i])) prefetched_at[prefetch_slots[i]] = step;
    }
    const RowOutcome o = cache->Step(row, seq_len, slots);
    if (counted) {
      c.lookups += o.hits + o.window_hits + o.misses;
      c.misses += o.misses;
      c.baseline_misses += b.misses;
      c.prefetched += p.misses;
    }
    for (size_t i = 0; i < k; ++i) {
      const bool baseline_miss = baseline_mirror.Fill(row[i], baseline_slots[i]);
      const int32_t s = slots[i];
      const bool miss = mirror.Fill(row[i], s);
      const bool useful = !miss && s >= 0 && s < config.slots && prefetched_at[s] == step;
      if (!counted) continue;
      c.useful += useful;
      c.covered += baseline_miss && useful;
      c.induced += miss && !baseline_miss;
    }
  }
  return c;
}

double Ratio(double a, double b) { return b > 0 ? a / b : 0; }

}  // namespace

StatusOr<std::vector<CrossLayerResult>> ReplayCrossLayerPrefetch(const Trace& trace,
                                                                 const CrossLayerOptions& o,
                                                                 const ReplayProgressFn& progress) {
  if (o.hot_slots.empty() || o.policies.empty()) {
    return InvalidArgument("cross-layer prefetch replay needs a hot-cache size and a policy");
  }
  for (int32_t slots : o.hot_slots) {
    if (slots < trace.top_k) {
      return InvalidArgument("--hot-slots " + std::to_string(slots) +
                             " is below the trace's top-k (" + std::to_string(trace.top_k) + ")");
    }
  }
  for (PolicyKind kind : o.policies) {
    if (kind != PolicyKind::kLru && kind != PolicyKind::kSlru && kind != PolicyKind::kClock) {
      return InvalidArgument(
          "cross-layer prefetch replays the manager's policies (lru, slru, clock), not " +
          PolicyName(kind));
    }
  }
  if (o.warmup_steps < 0 || o.warmup_steps >= trace.steps) {
    return InvalidArgument("--warmup must be in [0, steps of the trace)");
  }
  std::vector<CrossLayerResult> results;
  const int64_t total = static_cast<int64_t>(o.hot_slots.size()) * o.policies.size() * trace.layers;
  int64_t done = 0;
  for (int32_t slots : o.hot_slots) {
    for (PolicyKind kind : o.policies) {
      const PolicyConfig config{kind, slots, kWindow, 0.8, o.protected_percent};
      CrossLayerResult r;
      r.policy = PolicyName(kind);
      r.hot_slots = slots;
      uint64_t all_misses = 0, all_baseline_misses = 0;
      for (int32_t layer = 0; layer < trace.layers; ++layer) {
        if (progress) progress("cross-layer prefetch", done++, total);
        const LayerCounts c = RunLayer(trace, layer, config, o.warmup_steps);
        all_baseline_misses += c.baseline_misses;
        r.layer_recall.push_back(Ratio(c.covered, c.baseline_misses));
        if (layer == 0) {
          all_misses += c.baseline_misses;
          continue;
        }
        all_misses += c.misses;
        r.lookups += c.lookups;
        r.prefetched += c.prefetched;
        r.useful += c.useful;
        r.misses += c.misses;
        r.baseline_misses += c.baseline_misses;
        r.covered += c.covered;
        r.induced_misses += c.induced;
      }
      r.wasted = r.prefetched - r.useful;
      r.precision = Ratio(r.useful, r.prefetched);
      r.recall = Ratio(r.covered, r.baseline_misses);
      r.hidden_fraction = Ratio(r.useful, r.useful + r.misses);
      r.baseline_bytes = static_cast<double>(all_baseline_misses) * o.row_bytes;
      r.bytes = static_cast<double>(all_misses + r.prefetched) * o.row_bytes;
      r.critical_bytes = static_cast<double>(all_misses) * o.row_bytes;
      results.push_back(std::move(r));
    }
  }
  if (progress) progress("cross-layer prefetch", total, total);
  return results;
}

std::string CrossLayerTable(const std::vector<CrossLayerResult>& results) {
  std::string out =
      "  cross-layer prefetch (layer L's top-k prefetched into layer L + 1; precision = useful / "
      "prefetched,\n  recall = baseline misses covered / baseline misses, hidden = useful / "
      "(useful + misses)):\n";
  char line[200];
  std::snprintf(line, sizeof(line), "  %9s %-6s %9s %9s %9s %11s %11s %11s\n", "hot slots",
                "policy", "precision", "recall", "hidden", "induced", "bytes", "critical");
  out += line;
  for (const CrossLayerResult& r : results) {
    const auto relative = [&](double bytes) {
      return r.baseline_bytes > 0 ? 100.0 * (bytes / r.baseline_bytes - 1) : 0.0;
    };
    std::snprintf(line, sizeof(line), "  %9d %-6s %9.4f %9.4f %9.4f %11llu %+10.1f%% %+10.1f%%\n",
                  r.hot_slots, r.policy.c_str(), r.precision, r.recall, r.hidden_fraction,
                  static_cast<unsigned long long>(r.induced_misses), relative(r.bytes),
                  relative(r.critical_bytes));
    out += line;
  }
  return out;
}

}  // namespace sparsekv::tools
