#include "tools/sparsekv/replay/policies.h"

#include <algorithm>
#include <cassert>
#include <cmath>

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

PolicySimulator::PolicySimulator(const PolicyConfig& config)
    : config_(config), slot_token_(config.slots, -1), touched_(config.slots, 0) {}

RowOutcome PolicySimulator::Step(std::span<const int32_t> row, int32_t seq_len,
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

namespace {

// Victims as lru takes them: the first untouched slots of an explicit order.
void FirstUntouched(const std::vector<int32_t>& order, const std::vector<char>& touched, int32_t n,
                    std::vector<int32_t>& victims) {
  for (size_t i = 0; i < order.size() && static_cast<int32_t>(victims.size()) < n; ++i) {
    if (!touched[order[i]]) victims.push_back(order[i]);
  }
}

// The manager's policy (reference_ops.cc): an explicit order, least recently used first; after a
// step the untouched slots keep their relative order at the front and the touched ones follow,
// also in their previous relative order.
class Lru final : public PolicySimulator {
 public:
  explicit Lru(const PolicyConfig& c) : PolicySimulator(c), order_(c.slots) {
    for (int32_t s = 0; s < c.slots; ++s) order_[s] = s;
  }

 private:
  void PickVictims(int32_t n, std::vector<int32_t>& victims) override {
    FirstUntouched(order_, touched_, n, victims);
  }
  void Use(int32_t, bool) override {}
  void EndStep() override {
    std::stable_partition(order_.begin(), order_.end(), [&](int32_t s) { return !touched_[s]; });
  }
  std::vector<int32_t> order_;
};

class Clock final : public PolicySimulator {
 public:
  explicit Clock(const PolicyConfig& c) : PolicySimulator(c), referenced_(c.slots, 0) {}

 private:
  // Terminates within two sweeps: the first clears every untouched slot's bit.
  void PickVictims(int32_t n, std::vector<int32_t>& victims) override {
    while (static_cast<int32_t>(victims.size()) < n) {
      const int32_t s = hand_;
      hand_ = hand_ + 1 == config_.slots ? 0 : hand_ + 1;
      if (touched_[s]) continue;
      if (referenced_[s]) {
        referenced_[s] = 0;
      } else {
        victims.push_back(s);
        touched_[s] = 1;  // not picked twice; Step sets it again when it fills the slot
      }
    }
  }
  void Use(int32_t s, bool) override { referenced_[s] = 1; }
  std::vector<char> referenced_;
  int32_t hand_ = 0;
};

class LfuDecay final : public PolicySimulator {
 public:
  explicit LfuDecay(const PolicyConfig& c)
      : PolicySimulator(c), score_(c.slots, 0), last_(c.slots, 0), log_decay_(std::log(c.decay)) {}

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

class Slru final : public PolicySimulator {
 public:
  explicit Slru(const PolicyConfig& c)
      : PolicySimulator(c),
        order_(c.slots),
        hit_(c.slots, 0),
        capacity_(static_cast<int32_t>(int64_t{c.slots} * c.protected_percent / 100)) {
    for (int32_t s = 0; s < c.slots; ++s) order_[s] = s;
  }

 private:
  void PickVictims(int32_t n, std::vector<int32_t>& victims) override {
    FirstUntouched(order_, touched_, n, victims);
  }
  void Use(int32_t s, bool filled) override { hit_[s] = filled ? 0 : 1; }
  // Classes of the new order: 0 untouched probationary, 1 filled, 2 untouched protected, 3 hit.
  void EndStep() override {
    const int32_t first_protected = config_.slots - protected_;
    class_.resize(config_.slots);
    int32_t promoted = 0;
    for (int32_t i = 0; i < config_.slots; ++i) {
      const int32_t s = order_[i];
      class_[s] = touched_[s] ? (hit_[s] ? 3 : 1) : (i >= first_protected ? 2 : 0);
      promoted += class_[s] >= 2;
    }
    std::stable_sort(order_.begin(), order_.end(),
                     [&](int32_t a, int32_t b) { return class_[a] < class_[b]; });
    protected_ = std::min(capacity_, promoted);
  }
  std::vector<int32_t> order_;
  std::vector<char> hit_;    // slot -> touched by a hit (not a fill) in this step
  std::vector<char> class_;  // slot -> its class in EndStep
  const int32_t capacity_;   // P
  int32_t protected_ = 0;    // entries at the end of order_ that are protected
};

class Aging final : public PolicySimulator {
 public:
  explicit Aging(const PolicyConfig& c)
      : PolicySimulator(c), order_(c.slots), score_(c.slots, 0), class_(c.slots, 0) {
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
      return std::make_unique<Clock>(config);
    case PolicyKind::kLfuDecay:
      return std::make_unique<LfuDecay>(config);
    case PolicyKind::kSlru:
      return std::make_unique<Slru>(config);
    case PolicyKind::kAging:
      return std::make_unique<Aging>(config);
    case PolicyKind::kLru:
      break;
  }
  return std::make_unique<Lru>(config);
}

}  // namespace sparsekv::tools
