#include "tools/sparsekv/replay/replay.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <iterator>
#include <numeric>
#include <vector>

namespace sparsekv::tools {
namespace {

struct ReplayPolicy {
  std::string name;
  PolicyConfig config;
};

std::vector<ReplayPolicy> PoliciesFor(const ReplayOptions& o, int32_t hot_slots, int32_t top_k) {
  std::vector<ReplayPolicy> out;
  for (PolicyKind kind : o.policies) {
    out.push_back(
        {PolicyName(kind), {kind, hot_slots, 1, o.decay, o.protected_percent, o.aging_shift}});
  }
  // Same memory as the others: hot_slots + 1 slots, of which window_split are the window.
  const int32_t replaceable = hot_slots + 1 - o.window_split;
  if (o.window_split > 1 && replaceable >= top_k) {
    out.push_back({"window" + std::to_string(o.window_split) + "-lru",
                   {PolicyKind::kLru, replaceable, o.window_split, o.decay}});
  }
  return out;
}

double Ratio(double a, double b) { return b > 0 ? a / b : 0; }

PolicyResult RunPolicy(const Trace& trace, const ReplayPolicy& policy, int32_t hot_slots,
                       const ReplayOptions& o) {
  PolicyResult r;
  r.policy = policy.name;
  r.hot_slots = hot_slots;
  std::vector<double> step_hits(trace.steps, 0), step_lookups(trace.steps, 0);
  double hits = 0, lookups = 0;
  for (int32_t layer = 0; layer < trace.layers; ++layer) {
    std::unique_ptr<PolicySimulator> sim = MakePolicy(policy.config);
    double layer_hits = 0, layer_lookups = 0;
    for (int32_t step = 0; step < trace.steps; ++step) {
      const RowOutcome out = sim->Step(trace.row(step, layer), trace.seq_len_at(step, layer));
      const double h = out.hits + out.window_hits;
      step_hits[step] += h;
      step_lookups[step] += h + out.misses;
      if (step < o.warmup_steps) continue;
      layer_hits += h;
      layer_lookups += h + out.misses;
      r.misses += out.misses;
    }
    r.layer_hit_rate.push_back(Ratio(layer_hits, layer_lookups));
    hits += layer_hits;
    lookups += layer_lookups;
  }
  for (int32_t s = 0; s < trace.steps; ++s) {
    r.step_hit_rate.push_back(Ratio(step_hits[s], step_lookups[s]));
  }
  r.hit_rate = Ratio(hits, lookups);
  r.bytes_moved = static_cast<double>(r.misses) * o.row_bytes;
  r.bytes_per_step = Ratio(r.bytes_moved, std::max(0, trace.steps - o.warmup_steps));
  return r;
}

// Sinks: the leading positions (at most kMaxSinks) selected in at least 90% of all rows.
int32_t CountSinks(const Trace& trace) {
  constexpr int32_t kMaxSinks = 16;
  std::array<int64_t, kMaxSinks> selected{};
  for (size_t r = 0; r < trace.seq_len.size(); ++r) {
    const std::span<const int32_t> row(trace.positions.data() + r * trace.top_k, trace.top_k);
    for (int32_t p : row) {
      if (p >= 0 && p < kMaxSinks) ++selected[p];
    }
  }
  int32_t sinks = 0;
  while (sinks < kMaxSinks && selected[sinks] >= 0.9 * static_cast<double>(trace.seq_len.size())) {
    ++sinks;
  }
  return sinks;
}

}  // namespace

TraceEntryCounts CountTraceEntries(const Trace& trace) {
  TraceEntryCounts c;
  std::vector<int32_t> valid;
  for (int32_t step = 0; step < trace.steps; ++step) {
    for (int32_t layer = 0; layer < trace.layers; ++layer) {
      const int32_t seq_len = trace.seq_len_at(step, layer);
      valid.clear();
      for (int32_t p : trace.row(step, layer)) {
        ++c.entries;
        if (p == -1) {
          ++c.padding;
        } else if (p < 0 || p >= seq_len) {
          ++c.out_of_range;
        } else {
          valid.push_back(p);
        }
      }
      std::sort(valid.begin(), valid.end());
      c.duplicates += valid.size() - static_cast<size_t>(std::distance(
                                         valid.begin(), std::unique(valid.begin(), valid.end())));
    }
  }
  return c;
}

TraceStats MeasureTrace(const Trace& trace, int32_t working_set_steps) {
  TraceStats st;
  const int32_t k = trace.top_k;
  const int32_t sinks = CountSinks(trace);
  double seq_len_sum = 0;
  for (int32_t layer = 0; layer < trace.layers; ++layer) {
    std::vector<int32_t> last_step;  // position -> last step selected + 1 (0 = never)
    double reuse = 0, recency = 0, working_set = 0;
    int32_t working_set_samples = 0;
    for (int32_t step = 0; step < trace.steps; ++step) {
      const int32_t seq_len = trace.seq_len_at(step, layer);
      if (last_step.size() < static_cast<size_t>(seq_len)) last_step.resize(seq_len, 0);
      const int32_t recent_begin = seq_len - std::max(1, seq_len / 10);
      seq_len_sum += seq_len;
      for (int32_t p : trace.row(step, layer)) {
        if (p < 0 || p >= seq_len) continue;
        const int32_t last = last_step[p];
        if (last == step + 1) continue;  // a duplicate within the row
        if (last == 0) {
          ++st.first_uses;
        } else {
          const int32_t distance = step + 1 - last;
          const auto bucket =
              std::lower_bound(kReuseDistanceBounds.begin(), kReuseDistanceBounds.end(), distance) -
              kReuseDistanceBounds.begin();
          ++st.reuse_distance[bucket];
        }
        // The generator's shares: sinks first, then reuse of the previous row, then recency.
        if (step > 0 && p >= sinks) {
          if (last == step) {
            reuse += 1.0 / k;
          } else if (p >= recent_begin) {
            recency += 1.0 / k;
          }
        }
        last_step[p] = step + 1;
      }
      if (step + 1 >= working_set_steps) {
        const int32_t since = step + 1 - working_set_steps;
        working_set += static_cast<double>(std::count_if(last_step.begin(), last_step.end(),
                                                         [&](int32_t s) { return s > since; }));
        ++working_set_samples;
      }
    }
    const double transitions = std::max(1, trace.steps - 1);
    st.layer_reuse.push_back(reuse / transitions);
    st.layer_recency.push_back(recency / transitions);
    st.layer_working_set.push_back(working_set_samples > 0 ? working_set / working_set_samples : 0);
  }
  st.mean_seq_len = seq_len_sum / std::max<size_t>(1, trace.seq_len.size());

  TopKGeneratorOptions& f = st.fitted;
  f.top_k = k;
  f.sinks = sinks;
  const auto mean = [](auto first, auto last) {
    return first == last ? 0.0 : std::accumulate(first, last, 0.0) / std::distance(first, last);
  };
  const int32_t early = std::min(f.early_layers, trace.layers);
  f.early_layer_reuse = mean(st.layer_reuse.begin(), st.layer_reuse.begin() + early);
  f.reuse = early < trace.layers ? mean(st.layer_reuse.begin() + early, st.layer_reuse.end())
                                 : f.early_layer_reuse;
  f.early_layer_reuse = std::min(f.early_layer_reuse, f.reuse);
  f.recency = early < trace.layers ? mean(st.layer_recency.begin() + early, st.layer_recency.end())
                                   : mean(st.layer_recency.begin(), st.layer_recency.end());
  return st;
}

StatusOr<ReplayResult> Replay(const Trace& trace, const ReplayOptions& o,
                              const ReplayProgressFn& progress) {
  if (o.hot_slots.empty()) return InvalidArgument("no hot-cache size to replay");
  for (int32_t c : o.hot_slots) {
    if (c < trace.top_k) {
      return InvalidArgument("--hot-slots " + std::to_string(c) + " is below the trace's top-k (" +
                             std::to_string(trace.top_k) + "): every step's misses need victims");
    }
  }
  if (o.decay <= 0 || o.decay > 1) return InvalidArgument("--decay must be in (0, 1]");
  if (o.protected_percent < 0 || o.protected_percent > 100) {
    return InvalidArgument("--protected-percent must be in [0, 100]");
  }
  if (o.aging_shift < 1 || o.aging_shift > 15) {
    return InvalidArgument("--aging-shift must be in [1, 15]");
  }
  if (o.warmup_steps < 0 || o.warmup_steps >= trace.steps) {
    return InvalidArgument("--warmup must be in [0, steps of the trace)");
  }
  ReplayResult result;
  result.stats = MeasureTrace(trace, o.working_set_steps);
  std::vector<std::pair<int32_t, ReplayPolicy>> runs;
  for (int32_t c : o.hot_slots) {
    for (ReplayPolicy& p : PoliciesFor(o, c, trace.top_k)) runs.emplace_back(c, std::move(p));
  }
  for (size_t i = 0; i < runs.size(); ++i) {
    if (progress) progress("replay", static_cast<int64_t>(i), static_cast<int64_t>(runs.size()));
    result.results.push_back(RunPolicy(trace, runs[i].second, runs[i].first, o));
  }
  if (progress) progress("replay", static_cast<int64_t>(runs.size()), runs.size());
  return result;
}

Trace SyntheticTrace(const TopKGeneratorOptions& options, int32_t layers, int32_t steps,
                     int32_t context) {
  Trace t;
  t.Resize(layers, options.top_k, steps);
  const size_t k = options.top_k;
  std::vector<LayerTopKGenerator> generators;
  for (int32_t layer = 0; layer < layers; ++layer) generators.emplace_back(options, layer, 1);
  for (int32_t step = 0; step < steps; ++step) {
    const int32_t seq_len = context + step;
    for (int32_t layer = 0; layer < layers; ++layer) {
      const size_t record = static_cast<size_t>(step) * layers + layer;
      t.seq_len[record] = seq_len;
      const std::span<int32_t> out(t.positions.data() + record * k, k);
      if (layer == 0) {
        generators[layer].Next(std::span(&seq_len, 1), out);
      } else {
        generators[layer].Next(std::span(&seq_len, 1), out,
                               std::span<const int32_t>(t.positions.data() + (record - 1) * k, k));
      }
    }
  }
  return t;
}

std::vector<MissCurvePoint> LruMissCurve(const Trace& trace, const std::vector<int32_t>& hot_slots,
                                         int32_t warmup_steps) {
  ReplayOptions o;
  o.warmup_steps = warmup_steps;
  std::vector<MissCurvePoint> curve;
  for (int32_t c : hot_slots) {
    const ReplayPolicy lru{"lru", {PolicyKind::kLru, c, 1, o.decay}};
    curve.push_back({c, 1 - RunPolicy(trace, lru, c, o).hit_rate});
  }
  return curve;
}

LayerOverlap MeasureLayerOverlap(const Trace& trace) {
  LayerOverlap r;
  std::vector<int32_t> mark;  // position -> step * layers + layer + 1 of the lower row
  for (int32_t layer = 0; layer + 1 < trace.layers; ++layer) {
    double sum = 0;
    for (int32_t step = 0; step < trace.steps; ++step) {
      const int32_t stamp = step * trace.layers + layer + 1;
      for (int32_t p : trace.row(step, layer)) {
        if (p < 0) continue;
        if (mark.size() <= static_cast<size_t>(p)) mark.resize(p + 1, 0);
        mark[p] = stamp;
      }
      int32_t shared = 0;
      for (int32_t p : trace.row(step, layer + 1)) {
        shared += p >= 0 && static_cast<size_t>(p) < mark.size() && mark[p] == stamp;
      }
      sum += static_cast<double>(shared) / trace.top_k;
    }
    r.pair.push_back(sum / std::max(1, trace.steps));
  }
  if (!r.pair.empty()) r.mean = std::accumulate(r.pair.begin(), r.pair.end(), 0.0) / r.pair.size();
  return r;
}

LocalityFit FitLocality(const std::vector<MissCurvePoint>& target, const TopKGeneratorOptions& base,
                        const LocalityFitOptions& fit) {
  std::vector<int32_t> sizes;
  for (const MissCurvePoint& p : target) sizes.push_back(p.hot_slots);
  const auto evaluate = [&](double reuse, double exponent, double recency) {
    LocalityFit f;
    f.options = base;
    f.options.locality = true;
    f.options.miss_rate = -1;
    f.options.reuse = reuse;
    f.options.zipf_exponent = exponent;
    f.options.recency = recency;
    const Trace t = SyntheticTrace(f.options, fit.layers, fit.steps, fit.context);
    f.curve = LruMissCurve(t, sizes, fit.warmup_steps);
    for (size_t i = 0; i < target.size(); ++i) {
      const double e = f.curve[i].miss_rate - target[i].miss_rate;
      f.squared_error += e * e;
    }
    return f;
  };
  LocalityFit best;
  best.squared_error = 1e300;
  // A 3 x 3 x 3 grid of half-widths (dr, da, dc) around the centre (a 5-point one on the first
  // pass), each pass halving them around the best point so far.
  const auto search = [&](double r0, double a0, double c0, double dr, double da, double dc,
                          int32_t half) {
    for (int32_t i = -half; i <= half; ++i) {
      for (int32_t j = -half; j <= half; ++j) {
        for (int32_t l = -half; l <= half; ++l) {
          const double r = std::clamp(r0 + i * dr, 0.0, 0.95);
          const double a = std::max(0.0, a0 + j * da);
          const double c = std::clamp(c0 + l * dc, 0.0, 1.0 - r);
          LocalityFit f = evaluate(r, a, c);
          if (f.squared_error < best.squared_error) best = std::move(f);
        }
      }
    }
  };
  search(0.5, 1.6, 0.15, 0.1, 0.2, 0.05, 2);
  for (double scale : {0.5, 0.25}) {
    const TopKGeneratorOptions centre = best.options;
    search(centre.reuse, centre.zipf_exponent, centre.recency, 0.1 * scale, 0.2 * scale,
           0.05 * scale, 1);
  }
  return best;
}

}  // namespace sparsekv::tools
