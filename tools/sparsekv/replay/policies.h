// Hot-cache replacement policies, simulated on the CPU over top-k traces (`sparsekv replay`).
//
// A simulator holds one request's hot cache for one layer: `slots` replaceable slots plus the
// `window` newest tokens, always resident. Each step classifies a top-k row exactly as ResolveView
// does (kernel_views.h): padding, out-of-range and repeated positions are skipped, positions in
// [seq_len - window, seq_len) are window hits, resident positions are hits, and every other
// position is a miss that takes a victim slot not hit in this step; the i-th miss of the row (in
// row order) gets the i-th victim the policy names. The policies differ only in that order:
//   lru:       least recently used first; the manager's policy, reproduced slot for slot (its
//              test checks this against SparseKVCacheManager on the CPU backend);
//   clock:     second chance: a hand sweeps the slots, clearing set reference bits, and takes the
//              first slot whose bit is clear (hits and fills set the bit);
//   lfu-decay: lowest score first, score = sum over past uses of decay^(steps since the use)
//              (empty slots first, ties to the least recently used).
//   slru:      segmented lru, the manager's EvictionPolicy::kSegmentedLru reproduced slot for
//              slot (ResolveView): one explicit order [probationary | protected], each part least
//              recently used first. Victims are the first untouched slots of the order
//              (probationary ones first), as in lru. After a step the order is the stable
//              partition [untouched probationary][filled][untouched protected][hit], and the
//              protected part is its last min(P, untouched protected + hit) entries, P = slots *
//              protected_percent / 100 (rounded down): hits are promoted, fills enter the
//              probationary part, and protected overflow (its least recently used entries) is
//              demoted to the probationary part, after this step's fills.
//   aging:     integer lfu with decay 1 - 2^-aging_shift: each step every resident slot's score
//              becomes s - (s >> aging_shift), then a hit adds kAgingIncrement and a fill sets
//              it to kAgingIncrement (empty slots: 0). The order is kept sorted by score (ties:
//              untouched before filled before hit, then the previous order); victims are the
//              first untouched slots of the order. Exact integers, so any backend agrees bit
//              for bit. aging_shift 1 (decay 1/2) is lru but for the order of a step's fills
//              and hits: a use outweighs all older ones.
// A "window + LRU split" is lru with a wider window at the same memory (replay.h builds it).
//
// Cost: O(top_k + slots) per step for lru and clock, plus O(slots log slots) for lfu-decay's
// victim order and the stable sorts of slru and aging; memory O(slots + the largest position
// seen).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "sparsekv/status.h"

namespace sparsekv::tools {

enum class PolicyKind { kLru, kClock, kLfuDecay, kSlru, kAging };
std::string PolicyName(PolicyKind kind);  // "lru", "clock", "lfu-decay", "slru", "aging"
StatusOr<PolicyKind> ParsePolicy(const std::string& name);

struct PolicyConfig {
  PolicyKind kind = PolicyKind::kLru;
  int32_t slots = 4096;            // replaceable slots (the manager's hot_slots); must be >= top_k
  int32_t window = 1;              // newest tokens always resident, beyond `slots`
  double decay = 0.8;              // lfu-decay: weight of a use per step of age, in (0, 1]
  int32_t protected_percent = 80;  // slru: the protected part's capacity, % of slots
  int32_t aging_shift = 4;         // aging: decay 1 - 2^-aging_shift, in [1, 15]
};

// aging: the score a use adds; with aging_shift <= 15 scores stay below 2^32.
inline constexpr uint32_t kAgingIncrement = 1u << 16;

// The counts of one row, as ResolveCounters defines them.
struct RowOutcome {
  int32_t hits = 0;
  int32_t window_hits = 0;
  int32_t misses = 0;
  int32_t skipped = 0;  // padding, out of range, duplicates
};

class PolicySimulator {
 public:
  virtual ~PolicySimulator() = default;
  // One step. If `slots_out` is not empty (size >= row.size()), it receives per entry the slot
  // within the request's block that ResolveView would return: [0, slots) for hits and misses,
  // slots + p % window for window hits, -1 for skipped entries.
  // REQUIRES: the row has at most `slots` entries that are not skipped or window hits.
  RowOutcome Step(std::span<const int32_t> row, int32_t seq_len, std::span<int32_t> slots_out = {});

 protected:
  explicit PolicySimulator(const PolicyConfig& config);
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

std::unique_ptr<PolicySimulator> MakePolicy(const PolicyConfig& config);

}  // namespace sparsekv::tools
