// Hot-cache replacement policies, simulated on the CPU over top-k traces (`sparsekv replay`).
//
// A simulator holds one request's hot cache for one layer: `slots` replaceable slots plus the
// `window` newest tokens, always resident. Each step classifies a top-k row exactly as ResolveView
// does (kernel_views.h): padding, out-of-range and repeated positions are skipped, positions in
// [seq_len - window, seq_len) are window hits, resident positions are hits, and every other
// position is a miss that takes a victim slot not hit in this step; the i-th miss of the row (in
// row order) gets the i-th victim the policy names. The policies differ only in that order:
//   lru:       least recently used first: the manager's policy (EvictionPolicy::kLru), run by the
//              library's own resolve, the CPU reference backend's, over a one-request view;
//   clock:     the manager's EvictionPolicy::kClock (a hand sweeps the slots, decrementing use
//              counts that hits raised up to kClockMaxUses, and takes the first slot at 0; a fill
//              starts at 0: ResolveView, kernel_views.h), run like lru by the library's own
//              resolve;
//   lfu-decay: lowest score first, score = sum over past uses of decay^(steps since the use)
//              (empty slots first, ties to the least recently used).
//   slru:      segmented lru: the manager's EvictionPolicy::kSegmentedLru (its order is defined
//              with ResolveView, kernel_views.h), run like lru by the library's own resolve;
//   aging:     integer lfu with decay 1 - 2^-aging_shift: each step every resident slot's score
//              becomes s - (s >> aging_shift), then a hit adds kAgingIncrement and a fill sets
//              it to kAgingIncrement (empty slots: 0). The order is kept sorted by score (ties:
//              untouched before filled before hit, then the previous order); victims are the
//              first untouched slots of the order. Exact integers, so any backend agrees bit
//              for bit. aging_shift 1 (decay 1/2) is lru but for the order of a step's fills
//              and hits: a use outweighs all older ones.
// A "window + LRU split" is lru with a wider window at the same memory (replay.h builds it).
//
// lfu-decay and aging are simulated here (the library does not implement them).
//
// Cost: O(top_k + slots) per step for lru, slru and clock (through the reference resolve's hash
// maps and per-step arrays), plus O(slots log slots) for lfu-decay's victim order and the stable
// sorts of slru and aging; memory O(slots + the largest position seen).
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
  virtual RowOutcome Step(std::span<const int32_t> row, int32_t seq_len,
                          std::span<int32_t> slots_out = {}) = 0;
};

std::unique_ptr<PolicySimulator> MakePolicy(const PolicyConfig& config);

}  // namespace sparsekv::tools
