#include "tools/sparsekv/replay/prefetch_predictors.h"

#include <algorithm>
#include <array>
#include <cstdio>
#include <deque>
#include <memory>
#include <unordered_set>
#include <utility>

#include "sparsekv/prefetch.h"
#include "tools/sparsekv/replay/policies.h"

namespace sparsekv::tools {
namespace {

constexpr int32_t kWindow = 1;  // the manager's default, as in the replay's policies

// The simulated cache's content, followed from the slots the simulator returns: an entry given
// slot s < slots whose position differs from s's previous one filled s (a miss or a fetch).
class ResidencyMirror {
 public:
  explicit ResidencyMirror(int32_t slots) : slot_token_(slots, -1) {}

  // Records one Step's slots; fill[k] = 1 where entry k filled a slot; appends evicted positions.
  void Observe(std::span<const int32_t> row, std::span<const int32_t> slots, int32_t seq_len,
               std::vector<uint8_t>& fill, std::vector<int32_t>& evicted) {
    if (slot_of_.size() < static_cast<size_t>(seq_len)) slot_of_.resize(seq_len, -1);
    fill.assign(row.size(), 0);
    for (size_t k = 0; k < row.size(); ++k) {
      const int32_t s = slots[k];
      if (s < 0 || s >= static_cast<int32_t>(slot_token_.size()) || slot_token_[s] == row[k]) {
        continue;
      }
      if (const int32_t old = slot_token_[s]; old >= 0) {
        slot_of_[old] = -1;
        evicted.push_back(old);
      }
      slot_token_[s] = row[k];
      slot_of_[row[k]] = s;
      fill[k] = 1;
    }
  }
  bool Resident(int32_t p) const {
    return p >= 0 && static_cast<size_t>(p) < slot_of_.size() && slot_of_[p] >= 0;
  }

 private:
  std::vector<int32_t> slot_token_;  // slot -> position, -1 = empty
  std::vector<int32_t> slot_of_;     // position -> slot, -1 = not resident
};

// What a predictor sees after step t.
struct PredictorInput {
  std::span<const int32_t> row;      // step t's top-k
  std::span<const uint8_t> fill;     // 1 = the entry missed at step t
  int32_t seq_len;                   // at step t
  const ResidencyMirror& cache;      // after step t
  std::span<const int32_t> evicted;  // positions evicted since the previous prediction
};

class Predictor {
 public:
  virtual ~Predictor() = default;
  // Appends up to `budget` distinct positions for step t + 1 to `out` (empty on entry).
  virtual void Predict(const PredictorInput& in, int32_t budget, std::vector<int32_t>& out) = 0;
};

class WindowExit final : public Predictor {
 public:
  void Predict(const PredictorInput& in, int32_t budget, std::vector<int32_t>& out) override {
    if (budget > 0 && in.seq_len >= kWindow) out.push_back(in.seq_len - kWindow);
  }
};

// The device operator's reference over a batch of one.
class Neighbours final : public Predictor {
 public:
  void Predict(const PredictorInput& in, int32_t budget, std::vector<int32_t>& out) override {
    const int32_t batch_size = 1;
    const BatchEntry entry{0, in.seq_len, 0};
    predicted_.resize(budget);
    const PrefetchView view{&batch_size,
                            &entry,
                            in.row.data(),
                            static_cast<int32_t>(in.row.size()),
                            static_cast<int32_t>(in.row.size()),
                            in.fill.data(),
                            kWindow,
                            budget,
                            predicted_.data()};
    PredictPrefetchReference(view);
    for (int32_t p : predicted_) {
      if (p >= 0) out.push_back(p);
    }
  }

 private:
  std::vector<int32_t> predicted_;
};

class Evicted final : public Predictor {
 public:
  void Predict(const PredictorInput& in, int32_t budget, std::vector<int32_t>& out) override {
    ++step_;
    if (selected_.size() < static_cast<size_t>(in.seq_len)) {
      selected_.resize(in.seq_len, 0);
      last_step_.resize(in.seq_len, 0);
    }
    for (int32_t p : in.row) {
      if (p < 0 || p >= in.seq_len || last_step_[p] == step_) continue;
      last_step_[p] = step_;
      ++selected_[p];
    }
    for (int32_t p : in.evicted) recent_.push_front({step_, p});
    while (!recent_.empty() && recent_.back().first <= step_ - kEvictedSteps) recent_.pop_back();
    taken_.clear();
    for (const auto& [step, p] : recent_) {
      if (static_cast<int32_t>(out.size()) == budget) break;
      if (selected_[p] >= 2 && !in.cache.Resident(p) && taken_.insert(p).second) out.push_back(p);
    }
  }

 private:
  int64_t step_ = 0;
  std::vector<int32_t> selected_;                   // position -> steps that selected it
  std::vector<int64_t> last_step_;                  // position -> last step that counted it
  std::deque<std::pair<int64_t, int32_t>> recent_;  // (step, position), newest first
  std::unordered_set<int32_t> taken_;
};

class Dropped final : public Predictor {
 public:
  void Predict(const PredictorInput& in, int32_t budget, std::vector<int32_t>& out) override {
    ++step_;
    if (mark_.size() < static_cast<size_t>(in.seq_len)) mark_.resize(in.seq_len, {0, 0, 0});
    // mark_[p] = the last three steps (newest first) whose row held p.
    for (int32_t p : in.row) {
      if (p < 0 || p >= in.seq_len || mark_[p][0] == step_) continue;
      mark_[p] = {step_, mark_[p][0], mark_[p][1]};
    }
    for (int32_t p : previous_) {
      if (static_cast<int32_t>(out.size()) == budget) break;
      if (mark_[p][0] == step_ - 1 && mark_[p][1] == step_ - 2 && !in.cache.Resident(p)) {
        out.push_back(p);
      }
    }
    previous_.clear();
    for (int32_t p : in.row) {
      if (p >= 0 && p < in.seq_len && mark_[p][0] == step_) previous_.push_back(p);
    }
  }

 private:
  int64_t step_ = 0;
  std::vector<std::array<int64_t, 3>> mark_;
  std::vector<int32_t> previous_;  // step t - 1's row, valid positions
};

class Combined final : public Predictor {
 public:
  void Predict(const PredictorInput& in, int32_t budget, std::vector<int32_t>& out) override {
    std::unordered_set<int32_t> taken;
    for (Predictor* p : {static_cast<Predictor*>(&neighbours_), static_cast<Predictor*>(&evicted_),
                         static_cast<Predictor*>(&dropped_)}) {
      part_.clear();
      p->Predict(in, budget, part_);  // every part runs, so that its history stays current
      for (int32_t q : part_) {
        if (static_cast<int32_t>(out.size()) < budget && taken.insert(q).second) out.push_back(q);
      }
    }
  }

 private:
  Neighbours neighbours_;
  Evicted evicted_;
  Dropped dropped_;
  std::vector<int32_t> part_;
};

std::unique_ptr<Predictor> MakePredictor(PredictorKind kind) {
  switch (kind) {
    case PredictorKind::kWindowExit:
      return std::make_unique<WindowExit>();
    case PredictorKind::kEvicted:
      return std::make_unique<Evicted>();
    case PredictorKind::kDropped:
      return std::make_unique<Dropped>();
    case PredictorKind::kCombined:
      return std::make_unique<Combined>();
    case PredictorKind::kNeighbours:
      break;
  }
  return std::make_unique<Neighbours>();
}

struct Counts {
  uint64_t lookups = 0, misses = 0, fetched = 0, useful = 0;
};

// One layer of the trace through an lru cache of `slots`, with prefetch if `predictor` is set.
Counts RunLayer(const Trace& trace, int32_t layer, int32_t slots, Predictor* predictor,
                int32_t budget, int32_t warmup) {
  std::unique_ptr<PolicySimulator> sim = MakePolicy({PolicyKind::kLru, slots, kWindow});
  ResidencyMirror cache(slots);
  std::vector<int32_t> out(trace.top_k), predicted, prefetch_out;
  std::vector<uint8_t> fill, prefetch_fill;
  std::vector<int32_t> evicted;
  std::unordered_set<int32_t> fetched;  // positions the last prefetch brought in
  Counts c;
  for (int32_t step = 0; step < trace.steps; ++step) {
    const std::span<const int32_t> row = trace.row(step, layer);
    const int32_t seq_len = trace.seq_len_at(step, layer);
    const RowOutcome o = sim->Step(row, seq_len, out);
    cache.Observe(row, out, seq_len, fill, evicted);
    const bool counted = step >= warmup;
    if (counted) {
      c.lookups += o.hits + o.window_hits + o.misses;
      c.misses += o.misses;
      for (size_t k = 0; k < row.size(); ++k) {
        if (out[k] >= 0 && fill[k] == 0 && fetched.count(row[k]) != 0) ++c.useful;
      }
    }
    fetched.clear();
    if (predictor == nullptr || step + 1 == trace.steps) {
      evicted.clear();
      continue;
    }
    predicted.clear();
    predictor->Predict({row, fill, seq_len, cache, evicted}, budget, predicted);
    evicted.clear();
    prefetch_out.resize(predicted.size());
    sim->Step(predicted, trace.seq_len_at(step + 1, layer), prefetch_out);
    cache.Observe(predicted, prefetch_out, trace.seq_len_at(step + 1, layer), prefetch_fill,
                  evicted);
    for (size_t i = 0; i < predicted.size(); ++i) {
      if (prefetch_fill[i] != 0) fetched.insert(predicted[i]);
    }
    if (step + 1 >= warmup) c.fetched += fetched.size();
  }
  return c;
}

double Ratio(double a, double b) { return b > 0 ? a / b : 0; }

}  // namespace

std::string PredictorName(PredictorKind kind) {
  switch (kind) {
    case PredictorKind::kWindowExit:
      return "window-exit";
    case PredictorKind::kNeighbours:
      return "neighbours";
    case PredictorKind::kEvicted:
      return "evicted";
    case PredictorKind::kDropped:
      return "dropped";
    case PredictorKind::kCombined:
      return "combined";
  }
  return "unknown";
}

StatusOr<PredictorKind> ParsePredictor(const std::string& name) {
  for (PredictorKind k :
       {PredictorKind::kWindowExit, PredictorKind::kNeighbours, PredictorKind::kEvicted,
        PredictorKind::kDropped, PredictorKind::kCombined}) {
    if (name == PredictorName(k)) return k;
  }
  return InvalidArgument("unknown predictor '" + name +
                         "' (known: window-exit, neighbours, evicted, dropped, combined)");
}

StatusOr<std::vector<PrefetchResult>> ReplayPrefetch(const Trace& trace, const PrefetchOptions& o,
                                                     const ReplayProgressFn& progress) {
  if (o.hot_slots.empty() || o.predictors.empty() || o.budgets.empty()) {
    return InvalidArgument("prefetch replay needs a hot-cache size, a predictor and a budget");
  }
  const int32_t smallest = *std::min_element(o.hot_slots.begin(), o.hot_slots.end());
  if (smallest < trace.top_k) {
    return InvalidArgument("--hot-slots " + std::to_string(smallest) +
                           " is below the trace's top-k (" + std::to_string(trace.top_k) + ")");
  }
  for (int32_t p : o.budgets) {
    if (p < 1 || p > smallest) {
      return InvalidArgument("--prefetch-budget " + std::to_string(p) + " is outside [1, " +
                             std::to_string(smallest) + "] (the smallest hot-cache size)");
    }
  }
  if (o.warmup_steps < 0 || o.warmup_steps >= trace.steps) {
    return InvalidArgument("--warmup must be in [0, steps of the trace)");
  }
  std::vector<PrefetchResult> results;
  const int64_t total = static_cast<int64_t>(o.hot_slots.size()) *
                        (1 + o.predictors.size() * o.budgets.size()) * trace.layers;
  int64_t done = 0;
  const auto tick = [&] {
    if (progress) progress("prefetch", done++, total);
  };
  for (int32_t slots : o.hot_slots) {
    uint64_t baseline = 0;
    for (int32_t layer = 0; layer < trace.layers; ++layer, tick()) {
      baseline += RunLayer(trace, layer, slots, nullptr, 0, o.warmup_steps).misses;
    }
    for (PredictorKind kind : o.predictors) {
      for (int32_t budget : o.budgets) {
        Counts sum;
        for (int32_t layer = 0; layer < trace.layers; ++layer, tick()) {
          std::unique_ptr<Predictor> predictor = MakePredictor(kind);
          const Counts c = RunLayer(trace, layer, slots, predictor.get(), budget, o.warmup_steps);
          sum.lookups += c.lookups;
          sum.misses += c.misses;
          sum.fetched += c.fetched;
          sum.useful += c.useful;
        }
        PrefetchResult r;
        r.predictor = PredictorName(kind);
        r.budget = budget;
        r.hot_slots = slots;
        r.lookups = sum.lookups;
        r.baseline_misses = baseline;
        r.misses = sum.misses;
        r.fetched = sum.fetched;
        r.useful = sum.useful;
        r.precision = Ratio(sum.useful, sum.fetched);
        r.recall = Ratio(sum.useful, sum.useful + sum.misses);
        r.baseline_miss_rate = Ratio(baseline, sum.lookups);
        r.net_miss_rate = Ratio(sum.misses, sum.lookups);
        r.extra_bytes = static_cast<double>(sum.fetched) * o.row_bytes;
        r.net_bytes = static_cast<double>(sum.misses + sum.fetched) * o.row_bytes;
        results.push_back(std::move(r));
      }
    }
  }
  if (progress) progress("prefetch", total, total);
  return results;
}

const PrefetchResult* BestPrefetch(const std::vector<PrefetchResult>& results, int32_t hot_slots) {
  const PrefetchResult* best = nullptr;
  for (const PrefetchResult& r : results) {
    if (r.hot_slots != hot_slots) continue;
    if (best == nullptr || r.net_miss_rate < best->net_miss_rate ||
        (r.net_miss_rate == best->net_miss_rate && r.budget < best->budget)) {
      best = &r;
    }
  }
  return best;
}

std::string PrefetchTable(const std::vector<PrefetchResult>& results, int32_t row_bytes) {
  std::string out =
      "  prefetch (lru; precision = useful / fetched, recall = useful / (useful + misses)):\n";
  char line[160];
  std::snprintf(line, sizeof(line), "  %9s %-12s %6s %9s %9s %9s %9s %9s %11s\n", "hot slots",
                "predictor", "budget", "precision", "recall", "miss rate", "baseline", "B/lookup",
                "net bytes");
  out += line;
  for (const PrefetchResult& r : results) {
    const double baseline_bytes = static_cast<double>(r.baseline_misses) * row_bytes;
    std::snprintf(line, sizeof(line), "  %9d %-12s %6d %9.4f %9.4f %9.4f %9.4f %9.2f %+10.1f%%\n",
                  r.hot_slots, r.predictor.c_str(), r.budget, r.precision, r.recall,
                  r.net_miss_rate, r.baseline_miss_rate,
                  r.lookups > 0 ? r.extra_bytes / static_cast<double>(r.lookups) : 0.0,
                  baseline_bytes > 0 ? 100.0 * (r.net_bytes / baseline_bytes - 1) : 0.0);
    out += line;
  }
  return out;
}

}  // namespace sparsekv::tools
