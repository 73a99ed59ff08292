#include "tools/sparsekv/replay/policies.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <limits>

#include "sparsekv/backend.h"
#include "sparsekv/kernel_views.h"
#include "sparsekv/options.h"

namespace sparsekv::tools {

std::string PolicyName(PolicyKind kind) {
  switch (kind) {
    case PolicyKind::kLru:
      return "lru";
    case PolicyKind::kClock:
      return "clock";
    case PolicyKind::kLfuDecay:
      return "lfu-decay";
    case PolicyKind::kSlru:
      return "slru";
    case PolicyKind::kAging:
      return "aging";
  }
  return "unknown";
}

StatusOr<PolicyKind> ParsePolicy(const std::string& name) {
  for (PolicyKind k : {PolicyKind::kLru, PolicyKind::kClock, PolicyKind::kLfuDecay,
                       PolicyKind::kSlru, PolicyKind::kAging}) {
    if (name == PolicyName(k)) return k;
  }
  return InvalidArgument("unknown policy '" + name +
                         "' (known: lru, clock, lfu-decay, slru, aging)");
}

namespace {

// The simulators of this file: Step classifies the row and places the misses on the victims
// the policy names; the policies differ only in PickVictims, Use and EndStep.
class VictimOrderSimulator : public PolicySimulator {
 public:
  RowOutcome Step(std::span<const int32_t> row, int32_t seq_len,
                  std::span<int32_t> slots_out) override;

 protected:
  explicit VictimOrderSimulator(const PolicyConfig& config)
      : config_(config), slot_token_(config.slots, -1), touched_(config.slots, 0) {}
  // Appends `n` victims, distinct and not touched in this step, to `victims`.
  virtual void PickVictims(int32_t n, std::vector<int32_t>& victims) = 0;
  // Slot `s` was hit (filled = false) or filled with a new position (filled = true) this step.
  virtual void Use(int32_t s, bool filled) = 0;
  // Called after the step's hits and fills, with touched_ marking them.
  virtual void EndStep() {}

  const PolicyConfig config_;
  int64_t step_ = 0;
  std::vector<int32_t> slot_token_;  // slot -> position, -1 = empty
  std::vector<char> touched_;        // slot -> hit or filled in this step

 private:
  std::vector<int32_t> slot_of_;  // position -> slot, -1 = not resident
  std::vector<int64_t> seen_;     // position -> last step (+1) it appeared in a row
  std::vector<int32_t> misses_;   // row indices of this step's misses
  std::vector<int32_t> victims_;
};

RowOutcome VictimOrderSimulator::Step(std::span<const int32_t> row, int32_t seq_len,
                                      std::span<int32_t> slots_out) {
  ++step_;
  const int32_t window_begin = std::max(0, seq_len - config_.window);
  if (slot_of_.size() < static_cast<size_t>(seq_len)) {
    slot_of_.resize(seq_len, -1);
    seen_.resize(seq_len, 0);
  }
  std::fill(touched_.begin(), touched_.end(), 0);
  misses_.clear();
  RowOutcome o;
  for (size_t k = 0; k < row.size(); ++k) {
    const int32_t p = row[k];
    int32_t out = -1;
    if (p < 0 || p >= seq_len || seen_[p] == step_) {
      ++o.skipped;
    } else if (seen_[p] = step_; p >= window_begin) {
      ++o.window_hits;
      out = config_.slots + p % config_.window;
    } else if (const int32_t s = slot_of_[p]; s >= 0) {
      ++o.hits;
      out = s;
      touched_[s] = 1;
      Use(s, /*filled=*/false);
    } else {
      misses_.push_back(static_cast<int32_t>(k));
    }
    if (!slots_out.empty()) slots_out[k] = out;
  }
  victims_.clear();
  PickVictims(static_cast<int32_t>(misses_.size()), victims_);
  assert(victims_.size() == misses_.size());
  for (size_t i = 0; i < misses_.size(); ++i) {
    const int32_t k = misses_[i];
    const int32_t s = victims_[i];
    if (slot_token_[s] >= 0) slot_of_[slot_token_[s]] = -1;
    slot_token_[s] = row[k];
    slot_of_[row[k]] = s;
    touched_[s] = 1;
    Use(s, /*filled=*/true);
    if (!slots_out.empty()) slots_out[k] = s;
  }
  o.misses = static_cast<int32_t>(misses_.size());
  EndStep();
  return o;
}

// Victims as lru takes them: the first untouched slots of an explicit order.
void FirstUntouched(const std::vector<int32_t>& order, const std::vector<char>& touched, int32_t n,
                    std::vector<int32_t>& victims) {
  for (size_t i = 0; i < order.size() && static_cast<int32_t>(victims.size()) < n; ++i) {
    if (!touched[order[i]]) victims.push_back(order[i]);
  }
}

// lru, slru and clock: the library's own resolve (the CPU reference backend) over a one-request
// view of one block, so that replay measures exactly the policy the manager runs.
class ReferenceResolve final : public PolicySimulator {
 public:
  ReferenceResolve(const PolicyConfig& c, EvictionPolicy policy)
      : backend_(CreateCpuBackend()),
        policy_(policy),
        slot_token_(c.slots, -1),
        lru_order_(c.slots),
        clock_uses_(c.slots, 0) {
    for (int32_t s = 0; s < c.slots; ++s) lru_order_[s] = s;
    view_.batch_size = &batch_size_;
    view_.batch = &entry_;
    const bool segmented = policy == EvictionPolicy::kSegmentedLru;
    view_.lru_protected = segmented ? &protected_count_ : nullptr;
    view_.protected_capacity = static_cast<int32_t>(int64_t{c.slots} * c.protected_percent / 100);
    view_.hot_slots = c.slots;
    view_.window = c.window;
    // One page spanning every position: a miss's host row is its position (unused here).
    view_.page_table = &page_;
    view_.pages_per_request = 1;
    view_.page_tokens = std::numeric_limits<int32_t>::max();
    view_.miss_count = &miss_count_;
    view_.counters = &counters_;
  }

  RowOutcome Step(std::span<const int32_t> row, int32_t seq_len,
                  std::span<int32_t> slots_out) override {
    const int32_t k = static_cast<int32_t>(row.size());
    slots_.resize(row.size());
    miss_host_row_.resize(row.size());
    miss_slot_.resize(row.size());
    entry_ = {.block = 0, .seq_len = seq_len, .page_table_row = 0};
    miss_count_ = 0;
    counters_ = {};
    view_.topk = row.data();
    view_.top_k = k;
    view_.topk_stride = k;
    view_.slots_out = slots_.data();
    view_.slot_token = slot_token_.data();
    if (policy_ == EvictionPolicy::kClock) {
      // The position map grows with the trace's history (the manager sizes it by max_context).
      if (position_slot_.size() < static_cast<size_t>(seq_len)) position_slot_.resize(seq_len, -1);
      view_.clock_uses = clock_uses_.data();
      view_.clock_hand = &clock_hand_;
      view_.position_slot = position_slot_.data();
      view_.positions = static_cast<int32_t>(position_slot_.size());
    } else {
      view_.lru_order = lru_order_.data();
    }
    view_.miss_host_row = miss_host_row_.data();
    view_.miss_slot = miss_slot_.data();
    view_.miss_capacity = k;
    // The CPU backend's Resolve runs synchronously and returns OK for every view.
    [[maybe_unused]] const Status status = backend_->Resolve(view_, 1, nullptr);
    assert(status.ok());
    if (!slots_out.empty()) std::copy(slots_.begin(), slots_.end(), slots_out.begin());
    RowOutcome o;
    o.hits = static_cast<int32_t>(counters_.hits);
    o.window_hits = static_cast<int32_t>(counters_.window_hits);
    o.misses = static_cast<int32_t>(counters_.misses);
    o.skipped =
        static_cast<int32_t>(counters_.padding + counters_.duplicates + counters_.out_of_range);
    return o;
  }

 private:
  std::shared_ptr<Backend> backend_;
  EvictionPolicy policy_;
  std::vector<int32_t> slot_token_;     // [slots] slot -> position, -1 = empty
  std::vector<int32_t> lru_order_;      // [slots] least recently used first
  int32_t protected_count_ = 0;         // slru: entries at lru_order_'s end that are protected
  std::vector<uint8_t> clock_uses_;     // clock: [slots] use counts
  int32_t clock_hand_ = 0;              // clock: where the next sweep starts
  std::vector<int32_t> position_slot_;  // clock: [positions seen] slot, -1 = none
  ResolveView view_{};
  BatchEntry entry_{};
  int32_t batch_size_ = 1;
  int32_t page_ = 0;
  int32_t miss_count_ = 0;
  ResolveCounters counters_{};
  std::vector<int32_t> slots_;  // [top_k] the resolve's output, copied to slots_out
  std::vector<int32_t> miss_host_row_;
  std::vector<int32_t> miss_slot_;
};

class LfuDecay final : public VictimOrderSimulator {
 public:
  explicit LfuDecay(const PolicyConfig& c)
      : VictimOrderSimulator(c),
        score_(c.slots, 0),
        last_(c.slots, 0),
        log_decay_(std::log(c.decay)) {}

 private:
  double Score(int32_t s) const {
    if (slot_token_[s] < 0) return -1;  // empty slots go first
    return score_[s] * std::exp(log_decay_ * static_cast<double>(step_ - last_[s]));
  }
  void PickVictims(int32_t n, std::vector<int32_t>& victims) override {
    if (n == 0) return;
    candidates_.clear();
    for (int32_t s = 0; s < config_.slots; ++s) {
      if (!touched_[s]) candidates_.push_back({Score(s), last_[s], s});
    }
    std::partial_sort(candidates_.begin(), candidates_.begin() + n, candidates_.end());
    for (int32_t i = 0; i < n; ++i) victims.push_back(candidates_[i].slot);
  }
  void Use(int32_t s, bool filled) override {
    score_[s] = (filled ? 0 : Score(s)) + 1;
    last_[s] = step_;
  }
  struct Candidate {
    double score;
    int64_t last;
    int32_t slot;
    bool operator<(const Candidate& o) const {
      return score != o.score ? score < o.score : last != o.last ? last < o.last : slot < o.slot;
    }
  };
  std::vector<double> score_;
  std::vector<int64_t> last_;
  std::vector<Candidate> candidates_;
  double log_decay_;
};

class Aging final : public VictimOrderSimulator {
 public:
  explicit Aging(const PolicyConfig& c)
      : VictimOrderSimulator(c), order_(c.slots), score_(c.slots, 0), class_(c.slots, 0) {
    for (int32_t s = 0; s < c.slots; ++s) order_[s] = s;
  }

 private:
  void PickVictims(int32_t n, std::vector<int32_t>& victims) override {
    FirstUntouched(order_, touched_, n, victims);
  }
  // Decay first: s - (s >> shift) of the score before this step, then the use.
  void Use(int32_t s, bool filled) override {
    score_[s] = filled ? kAgingIncrement : Decayed(score_[s]) + kAgingIncrement;
    class_[s] = filled ? 1 : 2;
  }
  void EndStep() override {
    for (int32_t s = 0; s < config_.slots; ++s) {
      if (!touched_[s]) {
        score_[s] = Decayed(score_[s]);
        class_[s] = 0;
      }
    }
    std::stable_sort(order_.begin(), order_.end(), [&](int32_t a, int32_t b) {
      return score_[a] != score_[b] ? score_[a] < score_[b] : class_[a] < class_[b];
    });
  }
  uint32_t Decayed(uint32_t s) const { return s - (s >> config_.aging_shift); }
  std::vector<int32_t> order_;  // sorted by score, lowest first
  std::vector<uint32_t> score_;
  std::vector<char> class_;  // 0 untouched, 1 filled, 2 hit in this step
};

}  // namespace

std::unique_ptr<PolicySimulator> MakePolicy(const PolicyConfig& config) {
  switch (config.kind) {
    case PolicyKind::kClock:
      return std::make_unique<ReferenceResolve>(config, EvictionPolicy::kClock);
    case PolicyKind::kLfuDecay:
      return std::make_unique<LfuDecay>(config);
    case PolicyKind::kSlru:
      return std::make_unique<ReferenceResolve>(config, EvictionPolicy::kSegmentedLru);
    case PolicyKind::kAging:
      return std::make_unique<Aging>(config);
    case PolicyKind::kLru:
      break;
  }
  return std::make_unique<ReferenceResolve>(config, EvictionPolicy::kLru);
}

}  // namespace sparsekv::tools
