// Resolve: one CTA of kThreads per batch row classifies the row's top-k against its hot-cache
// block, picks victims (LRU or the clock), updates the block's replacement state, and emits the
// row's misses.
//
// One CTA per row leaves the kernel latency-bound: its time is the chain of dependent phases, so
// the chain is kept short. Two global round trips precede the work (the batch entry; then the
// top-k row and the block's first slot_token and lru_order chunks, issued together), ranks are
// ballots within a warp plus one barrier across warps (no block scan), and the hits-only path
// crosses five barriers.
//
// The top-k entries sit in registers in a blocked arrangement (thread t holds k = t * kItems + j),
// so ranks follow k order. In O(K + C) per row, with every step block-wide:
//   1. Hash the row's valid positions into shared memory (open addressing, linear probing, at least
//      twice as many cells as entries), each cell keeping the smallest k that holds its position:
//      entry k is a duplicate iff its cell's smallest k is not k. Deterministic under any
//      interleaving of the inserts.
//   2. Walk the C slots: a slot whose token is in the hash (and not a window position) is a hit.
//      A second minimum per cell keeps the smallest such slot, so that even a table holding a
//      position twice picks the slot the reference picks.
//   3. Classify (window hit, hit, miss), mark hit slots in a bitmask of C bits, and rank the
//      misses in k order. The per-warp miss totals and counters cross one barrier.
//   4. Rank the "free" slots (not hit) of the old LRU order the same way. The first
//      n_filled = min(misses, free) free slots are the victims, in LRU order, and the same rank
//      gives every slot its place in the stable partition (kept slots first, then hit and filled
//      ones), so the new order is written directly: with u = free slots before position i of the
//      old order,
//        kept   (free, u >= n_filled): new position u - n_filled
//        others (hit, or victim u):    new position n_kept + i - max(0, u - n_filled).
//      The first kLruChunk entries are read into registers at the start; the rest (C > kLruChunk)
//      are copied to shared memory before the first write, since the new order overwrites the
//      old one in place.
//      Segmented LRU (lru_protected set), with the protected part starting at old index C - q:
//        kept probationary:  u - n_filled;   kept protected:  u;
//        hit:                C - n_hit + (i - u);
//        victim u:           a + u, written in step 5 (a is known only after the round that
//                            holds index C - q),
//      where a = max(0, p - n_filled) and p = the u of index C - q: the free probationary slots.
//      The thread holding index C - q also writes the new protected count. No extra ballot or
//      barrier; with no miss this is the LRU formula.
//   5. Miss r takes victim r. The row's misses are appended to the miss list with one atomicAdd,
//      sorted by host row when asked (block radix sort over the row's host-row range only). The
//      atomicAdd and the page-table reads are issued before step 4, whose barriers hide them.
//   6. Counters: warp sums from step 3, summed by warp 0 into one global atomic per nonzero
//      counter, also before step 4.
//   7. With share_duplicates, after a barrier that makes every other output visible, each repeat
//      copies the output (and fill flag) of its first entry, whose k step 1 left in a register.
// With the clock (ResolveView::clock_uses), steps 2 and 4 change and nothing is O(C):
//   2. each valid entry looks its position up in the block's position map (one round of
//      independent global loads) instead of the walk over the C slots;
//   4. the victims come from SweepClock: rounds of min(C, 4096) slots from the hand, each ranking
//      its free slots (not hit, not taken, count 0) with ballots and one barrier, until n_filled
//      are taken; hits raise their counts in step 3 and step 5 also updates the position map.
// Prefetch accounting (ResolveView::prefetch_mark set): step 3 reads the mark of each hit slot
// (a step's launch clears and counts it), step 5 reads and writes each victim's; a view without
// marks skips both on one uniform branch.
// Shared memory: the hash, the LRU copy and the sort's storage are live at disjoint times and share
// one region; the hit bitmask and the victims have their own.
// Each step is a force-inlined function below, named after it; the kernel calls them in order.
// They take the kernel's registers and shared arrays one by one, by value or reference: bundled
// into structs they measured to raise the register spills.
// Over 700 lines: every step shares the kernel's file-local kinds, counts and layout and must
// inline into it; the reusable primitives are in resolve_primitives.cuh.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cub/block/block_radix_sort.cuh>

#include "cuda/kernels.h"
#include "cuda/resolve_primitives.cuh"
#include "cuda/row_gather.cuh"
#include "cuda_common/smem_limit.h"

namespace sparsekv {
namespace {

using resolve::HashFind;
using resolve::HashInsert;
using resolve::kEmptyCell;
using resolve::Load4;
using resolve::WarpOffset;
using resolve::WarpRank;

// 1024 threads: one CTA per row leaves most of the SM's warp slots empty at small batches, and
// the steps are latency-bound; twice the warps of 512 measured to hide more of it.
constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;
static_assert(kWarps == 32, "one warp sums the per-warp totals, a lane per warp");
// Slots (step 2) and old LRU entries (step 4) per thread per round: one 16-byte load.
constexpr int kSlotItems = 4;
constexpr int kLruItems = 4;
constexpr int32_t kSlotChunk = kThreads * kSlotItems;
constexpr int32_t kLruChunk = kThreads * kLruItems;
constexpr int32_t kNone = INT32_MAX;  // no entry / no slot yet, in a hash cell; unranked entry

// What a top-k entry turned out to be. kValid is provisional (until step 3); kUnused marks the
// register slots past top_k.
enum class Kind : uint8_t {
  kUnused,
  kPadding,
  kOutOfRange,
  kValid,
  kDuplicate,
  kWindow,
  kHit,
  kMiss,
};

// Counters summed per warp in step 3.
enum Count { kHits, kWindowHits, kMisses, kPadding, kDuplicates, kOutOfRange, kNumCounts };

template <int kItems>
using Sort = cub::BlockRadixSort<uint32_t, kThreads, kItems, int32_t>;

// Sizes of the dynamic shared memory, computed identically on host and device.
struct SmemLayout {
  int32_t hash_bits;       // log2 of the hash cells
  int32_t region_bytes;    // hash | LRU copy (not with the clock) | sort storage
  int32_t hit_mask_bytes;  // C bits
  int32_t victims_bytes;   // top_k int32

  int32_t total() const { return region_bytes + hit_mask_bytes + victims_bytes; }
};

constexpr int32_t RoundUp16(int64_t bytes) { return static_cast<int32_t>((bytes + 15) / 16 * 16); }

template <int kItems>
SmemLayout MakeLayout(int32_t top_k, int32_t hot_slots, bool clock) {
  SmemLayout layout{};
  // At least 4 cells: each of the hash's three arrays is then a whole number of 16-byte vectors.
  layout.hash_bits = 2;
  while ((1 << layout.hash_bits) < 2 * top_k) ++layout.hash_bits;
  const int64_t hash_bytes = int64_t{3} * sizeof(int32_t) << layout.hash_bits;
  // The clock keeps no order to copy.
  const int64_t lru_bytes =
      clock ? 0 : int64_t{std::max(0, hot_slots - kLruChunk)} * sizeof(uint16_t);
  const int64_t sort_bytes = sizeof(typename Sort<kItems>::TempStorage);
  layout.region_bytes = RoundUp16(std::max({hash_bytes, lru_bytes, sort_bytes}));
  layout.hit_mask_bytes = RoundUp16((int64_t{hot_slots} + 31) / 32 * sizeof(uint32_t));
  layout.victims_bytes = RoundUp16(int64_t{top_k} * sizeof(int32_t));
  return layout;
}

// The layer-wide slots of one block (ResolveView's slot(s)): its page list, or one run of slots
// from `base` when the view has no page lists.
struct BlockSlots {
  const int32_t* pages;  // this block's row of block_pages, or null
  int32_t base;          // block * (C + W)
  int32_t page_rows;

  __device__ __forceinline__ int32_t operator()(int32_t s) const {
    return pages == nullptr ? base + s : __ldg(pages + s / page_rows) + s % page_rows;
  }
};

// Initialises the hash (empty cells: `cells` entries each of keys, first_k and hit_slot) and the
// hit bitmask with 16-byte stores, while round trip 1 is in flight.
__device__ __forceinline__ void InitShared(int32_t* keys, int32_t* first_k, int32_t* hit_slot,
                                           int32_t cells, uint32_t* hit_mask,
                                           int32_t hit_mask_bytes) {
  const int32_t tid = threadIdx.x;
  int4* const keys4 = reinterpret_cast<int4*>(keys);
  int4* const first_k4 = reinterpret_cast<int4*>(first_k);
  int4* const hit_slot4 = reinterpret_cast<int4*>(hit_slot);
  for (int32_t i = tid; i < cells / 4; i += kThreads) {
    keys4[i] = make_int4(kEmptyCell, kEmptyCell, kEmptyCell, kEmptyCell);
    first_k4[i] = make_int4(kNone, kNone, kNone, kNone);
    hit_slot4[i] = make_int4(kNone, kNone, kNone, kNone);
  }
  int4* const hit_mask4 = reinterpret_cast<int4*>(hit_mask);
  for (int32_t i = tid; i < hit_mask_bytes / 16; i += kThreads) {
    hit_mask4[i] = make_int4(0, 0, 0, 0);
  }
}

// Step 1: hash the row's valid positions (pos, k = tid * kItems + j); kind[j] becomes kUnused,
// kPadding, kOutOfRange, kDuplicate or (still provisional) kValid, cell[j] a valid entry's cell
// and first_of[j] the first entry holding its position (kNone if not valid).
template <int kItems>
__device__ __forceinline__ void HashEntries(const int32_t (&pos)[kItems], int32_t top_k,
                                            int32_t seq_len, int32_t* keys, int32_t* first_k,
                                            int32_t hash_bits, Kind (&kind)[kItems],
                                            int32_t (&cell)[kItems], int32_t (&first_of)[kItems]) {
  const int32_t tid = threadIdx.x;
#pragma unroll
  for (int j = 0; j < kItems; ++j) {
    const int32_t k = tid * kItems + j;
    kind[j] = k >= top_k                        ? Kind::kUnused
              : pos[j] == kPaddingPosition      ? Kind::kPadding
              : pos[j] < 0 || pos[j] >= seq_len ? Kind::kOutOfRange
                                                : Kind::kValid;
    if (kind[j] == Kind::kValid) cell[j] = HashInsert(keys, first_k, hash_bits, pos[j], k);
  }
  __syncthreads();
#pragma unroll
  for (int j = 0; j < kItems; ++j) {
    first_of[j] = kind[j] == Kind::kValid ? first_k[cell[j]] : kNone;
    if (kind[j] == Kind::kValid && first_of[j] != tid * kItems + j) kind[j] = Kind::kDuplicate;
  }
}

// Step 2: hits, found from the slots' side: hit_slot[cell] = the smallest slot holding the cell's
// position. `token` holds the first chunk of slot_token; the next chunk's four loads are issued
// together.
__device__ __forceinline__ void FindHits(const int32_t* slot_token, int32_t c, int32_t window_begin,
                                         const int32_t* keys, int32_t* hit_slot, int32_t hash_bits,
                                         int32_t (&token)[kSlotItems]) {
  const int32_t tid = threadIdx.x;
  for (int32_t chunk = 0;;) {
    bool look[kSlotItems];
#pragma unroll
    for (int j = 0; j < kSlotItems; ++j) look[j] = token[j] >= 0 && token[j] < window_begin;
    int32_t found[kSlotItems];
    HashFind(keys, hash_bits, token, look, found);
#pragma unroll
    for (int j = 0; j < kSlotItems; ++j) {
      if (found[j] >= 0) atomicMin(hit_slot + found[j], chunk + tid * kSlotItems + j);
    }
    chunk += kSlotChunk;
    if (chunk >= c) break;
    Load4(slot_token, chunk + tid * kSlotItems, c, -1, token);
  }
  __syncthreads();
}

// Step 3, first part (LRU): each valid entry's slot, from its cell's hit slot (kNone: not held),
// the loads issued together.
template <int kItems>
__device__ __forceinline__ void HitSlotsFromCells(const int32_t (&pos)[kItems],
                                                  const int32_t (&cell)[kItems],
                                                  const Kind (&kind)[kItems],
                                                  const int32_t* hit_slot, int32_t window_begin,
                                                  int32_t (&slot_of)[kItems]) {
#pragma unroll
  for (int j = 0; j < kItems; ++j) {
    slot_of[j] = kind[j] == Kind::kValid && pos[j] < window_begin ? hit_slot[cell[j]] : kNone;
  }
}

// Step 2 and 3's first part with the clock: each valid entry's slot from the block's position
// map (kNone: not held), the loads issued together; O(top_k), no walk over the C slots.
template <int kItems>
__device__ __forceinline__ void HitSlotsFromMap(const int32_t (&pos)[kItems],
                                                const Kind (&kind)[kItems],
                                                const int32_t* position_slot, int32_t c,
                                                int32_t window_begin, int32_t (&slot_of)[kItems]) {
  int32_t mapped[kItems];
#pragma unroll
  for (int j = 0; j < kItems; ++j) {
    mapped[j] = kind[j] == Kind::kValid && pos[j] < window_begin ? position_slot[pos[j]] : -1;
  }
#pragma unroll
  for (int j = 0; j < kItems; ++j) {
    slot_of[j] = static_cast<uint32_t>(mapped[j]) < static_cast<uint32_t>(c) ? mapped[j] : kNone;
  }
}

// Step 3, per thread: classify the valid entries (window hit, hit, miss) given their slots
// (slot_of), set out[j] for all but the misses, mark the hit slots in hit_mask, and count into
// local[].
template <int kItems>
__device__ __forceinline__ void ClassifyEntries(
    const int32_t (&pos)[kItems], const int32_t (&slot_of)[kItems], int32_t window_begin,
    const BlockSlots& block, int32_t c, int32_t w, uint32_t* hit_mask, Kind (&kind)[kItems],
    int32_t (&out)[kItems], int32_t (&is_miss)[kItems], int32_t (&local)[kNumCounts]) {
#pragma unroll
  for (int j = 0; j < kItems; ++j) {
    out[j] = kNullSlot;
    is_miss[j] = 0;
    local[kPadding] += kind[j] == Kind::kPadding;
    local[kOutOfRange] += kind[j] == Kind::kOutOfRange;
    local[kDuplicates] += kind[j] == Kind::kDuplicate;
    if (kind[j] != Kind::kValid) continue;
    if (pos[j] >= window_begin) {
      kind[j] = Kind::kWindow;
      out[j] = block(c + pos[j] % w);
      ++local[kWindowHits];
    } else if (slot_of[j] != kNone) {
      kind[j] = Kind::kHit;
      out[j] = block(slot_of[j]);
      atomicOr(hit_mask + slot_of[j] / 32, 1u << (slot_of[j] % 32));
      ++local[kHits];
    } else {
      kind[j] = Kind::kMiss;
      is_miss[j] = 1;
    }
  }
}

// Writes every output but a filled miss's (and with share_duplicates a repeat's), final after
// step 3, and every fill flag.
template <int kItems>
__device__ __forceinline__ void EmitSettled(const Kind (&kind)[kItems],
                                            const int32_t (&miss_rank)[kItems],
                                            const int32_t (&out)[kItems], int32_t n_filled,
                                            int32_t* out_row, uint8_t* fill_row) {
  const int32_t tid = threadIdx.x;
#pragma unroll
  for (int j = 0; j < kItems; ++j) {
    if (kind[j] == Kind::kUnused) continue;
    if (miss_rank[j] >= n_filled) out_row[tid * kItems + j] = out[j];
    if (fill_row != nullptr) fill_row[tid * kItems + j] = miss_rank[j] < n_filled;
  }
}

// Step 6 (warp_counts being final): one global atomic per nonzero counter.
__device__ __forceinline__ void AddCounters(ResolveCounters* n,
                                            const int32_t (*warp_counts)[kWarps]) {
  const int32_t tid = threadIdx.x;
  const int32_t lane = tid % 32;
  const int32_t warp = tid / 32;
  if (warp == 0) {
    int32_t total[kNumCounts];
#pragma unroll
    for (int i = 0; i < kNumCounts; ++i) {
      total[i] = __reduce_add_sync(0xffffffffu, warp_counts[i][lane]);
    }
    if (lane == 0) {
      const auto add = [](unsigned long long* counter, int32_t value) {
        if (value != 0) atomicAdd(counter, static_cast<unsigned long long>(value));
      };
      add(&n->hits, total[kHits]);
      add(&n->window_hits, total[kWindowHits]);
      add(&n->misses, total[kMisses]);
      add(&n->padding, total[kPadding]);
      add(&n->duplicates, total[kDuplicates]);
      add(&n->out_of_range, total[kOutOfRange]);
    }
  }
}

// Prefetch accounting, hits (a step's launch with prefetch_mark set): a hit slot's mark is read,
// and cleared and counted as useful when set. Each hit slot has one entry, so no two threads
// touch one mark. One atomic per warp that found any.
template <int kItems>
__device__ __forceinline__ void CountPrefetchHits(const Kind (&kind)[kItems],
                                                  const int32_t (&slot_of)[kItems], uint8_t* mark,
                                                  ResolveCounters* n) {
  int32_t useful = 0;
#pragma unroll
  for (int j = 0; j < kItems; ++j) {
    if (kind[j] != Kind::kHit || mark[slot_of[j]] == 0) continue;
    mark[slot_of[j]] = 0;
    ++useful;
  }
  useful = __reduce_add_sync(0xffffffffu, useful);
  if (threadIdx.x % 32 == 0 && useful != 0) {
    atomicAdd(&n->prefetch_useful, static_cast<unsigned long long>(useful));
  }
}

// Prefetch accounting, fills (prefetch_mark set, n_filled > 0): a victim still marked is counted
// as wasted; its mark becomes `fills` (set by a prefetch's launch, cleared by a step's).
template <int kItems>
__device__ __forceinline__ void MarkFilledSlots(const int32_t (&miss_rank)[kItems],
                                                int32_t n_filled, const int32_t* victims, int32_t c,
                                                uint8_t* mark, bool fills, ResolveCounters* n) {
  int32_t wasted = 0;
#pragma unroll
  for (int j = 0; j < kItems; ++j) {
    if (miss_rank[j] >= n_filled) continue;
    const int32_t victim = victims[miss_rank[j]];
    if (static_cast<uint32_t>(victim) >= static_cast<uint32_t>(c)) continue;
    wasted += mark[victim] != 0;
    mark[victim] = fills ? 1 : 0;
  }
  wasted = __reduce_add_sync(0xffffffffu, wasted);
  if (threadIdx.x % 32 == 0 && wasted != 0) {
    atomicAdd(&n->prefetch_wasted, static_cast<unsigned long long>(wasted));
  }
}

// Step 5's global reads (the filled misses' host pages) and, when the row appends its misses, the
// miss list's atomicAdd, issued before step 4 so that its barriers hide them. Returns thread 0's
// place in the list.
template <int kItems>
__device__ __forceinline__ int32_t IssueMissReads(
    const ResolveView& v, int32_t b, int32_t page_table_row, const int32_t (&pos)[kItems],
    const int32_t (&miss_rank)[kItems], int32_t n_filled, bool append, int32_t (&page)[kItems]) {
  int32_t list_base = 0;  // thread 0's
  if (threadIdx.x == 0 && append) {
    // With chunks, the row's chunk: its part of the list and its own count.
    const int32_t chunk = v.chunk_rows > 0 ? b / v.chunk_rows : 0;
    list_base =
        static_cast<int32_t>(chunk * v.chunk_entries()) + atomicAdd(v.miss_count + chunk, n_filled);
  }
  const int32_t* page_row =
      v.page_table + static_cast<int64_t>(page_table_row) * v.pages_per_request;
#pragma unroll
  for (int j = 0; j < kItems; ++j) {
    if (miss_rank[j] < n_filled) page[j] = page_row[pos[j] / v.page_tokens];
  }
  return list_base;
}

// Step 4: victims (victims[u] = the u-th free slot of the old order, u < n_filled) and the new
// LRU order in place; segmented, also victims_at and the new protected count (*protected_count).
// `lru_slot` holds the first chunk of the old order. Called only when a slot is hit or filled.
__device__ __forceinline__ void UpdateRecency(int32_t* lru, int32_t c, int32_t n_filled,
                                              int32_t n_kept, bool segmented,
                                              int32_t first_protected, int32_t protected_capacity,
                                              int32_t* protected_count, const uint32_t* hit_mask,
                                              uint16_t* lru_copy, int32_t* warp_free,
                                              int32_t* victims, int32_t& victims_at,
                                              int32_t (&lru_slot)[kLruItems]) {
  const int32_t tid = threadIdx.x;
  const int32_t lane = tid % 32;
  const int32_t warp = tid / 32;
  for (int32_t i = kLruChunk + tid; i < c; i += kThreads) {
    lru_copy[i - kLruChunk] = static_cast<uint16_t>(lru[i]);
  }
  int32_t free_before = 0;  // free slots in the rounds already ranked
  for (int32_t round = 0;;) {
    int32_t is_free[kLruItems];
#pragma unroll
    for (int j = 0; j < kLruItems; ++j) {
      const int32_t i = round + tid * kLruItems + j;
      // A corrupt entry (outside [0, C)) is never free, hence never a victim. No branch: the
      // four mask loads issue together (the index is clamped into the mask).
      const uint32_t slot = static_cast<uint32_t>(lru_slot[j]);
      const bool in_range = (i < c) & (slot < static_cast<uint32_t>(c));
      const uint32_t probe = in_range ? slot : 0;
      const uint32_t hit = hit_mask[probe / 32] >> (probe % 32) & 1u;
      is_free[j] = in_range & (hit == 0);
    }
    int32_t free_rank[kLruItems];
    const int32_t warp_free_total = WarpRank(is_free, free_rank);
    if (lane == 0) warp_free[warp] = warp_free_total;
    __syncthreads();  // warp_free is complete (and, in round 0, lru_copy)
    int32_t round_free = 0;
    const int32_t free_offset = free_before + WarpOffset(warp_free, &round_free);
#pragma unroll
    for (int j = 0; j < kLruItems; ++j) {
      const int32_t i = round + tid * kLruItems + j;
      if (i >= c) continue;
      const int32_t u = free_offset + free_rank[j];
      // With lru_order a permutation every target is in [0, C); the bound only keeps a corrupt
      // order from writing outside the block.
      int32_t target;
      if (is_free[j] && u >= n_filled) {
        target = segmented && i >= first_protected ? u : u - n_filled;
      } else if (is_free[j]) {
        victims[u] = lru_slot[j];
        // Segmented: the victim's place needs the free count at first_protected (step 5).
        target = segmented ? c : n_kept + i - max(0, u - n_filled);
      } else {
        target = segmented ? n_kept + n_filled + i - u : n_kept + i - max(0, u - n_filled);
      }
      if (target < c) lru[target] = lru_slot[j];
      if (segmented && i == first_protected) {
        // u free slots are probationary: max(0, u - n_filled) of them are kept, and the
        // c - n_hit - u protected ones lose max(0, n_filled - u) victims.
        victims_at = max(0, u - n_filled);
        *protected_count = min(protected_capacity, c - u - max(0, n_filled - u));
      }
    }
    free_before += round_free;
    round += kLruChunk;
    if (round >= c) break;
    __syncthreads();  // every warp has read warp_free before the next round rewrites it
#pragma unroll
    for (int j = 0; j < kLruItems; ++j) {
      const int32_t i = round + tid * kLruItems + j;
      lru_slot[j] = i < c ? lru_copy[i - kLruChunk] : 0;
    }
  }
}

// Clock: slots per thread per round of the sweep (a round covers min(C, kThreads * kClockItems)
// consecutive slots from the hand, so that no slot appears twice in one round).
constexpr int kClockItems = 4;

// Step 4 with the clock: victims[0, n_filled) by the sweep from *hand_ptr (kernel_views.h), the
// counts of the slots it passes decremented and the new hand written. Each round ranks the
// round's free slots (not hit, not taken, count 0) in sweep order; a slot is passed iff fewer
// free slots than still needed precede it. Called only when n_filled > 0; `hand` is the value
// every thread read before the first barrier.
__device__ __forceinline__ void SweepClock(uint8_t* uses, int32_t* hand_ptr, int32_t hand,
                                           int32_t c, int32_t n_filled, uint32_t* hit_mask,
                                           int32_t* warp_free, int32_t* victims) {
  const int32_t tid = threadIdx.x;
  const int32_t lane = tid % 32;
  const int32_t warp = tid / 32;
  const int32_t round_slots = min(c, kThreads * kClockItems);
  if (hand < 0 || hand >= c) hand = 0;
  for (int32_t taken = 0; taken < n_filled;) {
    int32_t slot[kClockItems];
    int32_t use[kClockItems];
    int32_t is_free[kClockItems];
    bool in[kClockItems];
#pragma unroll
    for (int j = 0; j < kClockItems; ++j) {
      const int32_t i = tid * kClockItems + j;
      in[j] = i < round_slots;
      const int32_t s = hand + i >= c ? hand + i - c : hand + i;
      slot[j] = in[j] ? s : 0;
      const bool passed = in[j] && (hit_mask[slot[j] / 32] >> (slot[j] % 32) & 1u) != 0;
      in[j] = in[j] && !passed;  // hit or taken: passed, nothing to do
      use[j] = in[j] ? uses[slot[j]] : 0;
      is_free[j] = in[j] && use[j] == 0;
    }
    int32_t free_rank[kClockItems];
    const int32_t warp_free_total = WarpRank(is_free, free_rank);
    if (lane == 0) warp_free[warp] = warp_free_total;
    __syncthreads();  // warp_free is complete
    int32_t round_free = 0;
    const int32_t free_offset = WarpOffset(warp_free, &round_free);
    const int32_t need = n_filled - taken;
#pragma unroll
    for (int j = 0; j < kClockItems; ++j) {
      const int32_t before = free_offset + free_rank[j];  // free slots before this one
      if (!in[j] || before >= need) continue;             // not reached by the hand
      if (is_free[j]) {
        victims[taken + before] = slot[j];
        atomicOr(hit_mask + slot[j] / 32, 1u << (slot[j] % 32));  // taken: passed from now on
        if (before == need - 1) *hand_ptr = slot[j] + 1 == c ? 0 : slot[j] + 1;
      } else {
        uses[slot[j]] = static_cast<uint8_t>(use[j] - 1);
      }
    }
    taken += min(round_free, need);
    hand = hand + round_slots >= c ? hand + round_slots - c : hand + round_slots;
    __syncthreads();  // victims, the taken marks and the counts are visible; warp_free is read
  }
}

// Step 5, unsorted: each filled miss goes to the list at its rank.
template <int kItems>
__device__ __forceinline__ void AppendMisses(const ResolveView& v, int32_t miss_list_base,
                                             int32_t n_filled, const int32_t (&miss_rank)[kItems],
                                             const int32_t (&host_row)[kItems],
                                             const int32_t (&out)[kItems]) {
#pragma unroll
  for (int j = 0; j < kItems; ++j) {
    const int32_t at = miss_list_base + miss_rank[j];
    if (miss_rank[j] >= n_filled || at >= v.miss_capacity) continue;
    v.miss_host_row[at] = host_row[j];
    v.miss_slot[at] = out[j];
  }
}

// Step 5, sorted: the row's filled misses in host-row order, striped (rank r = j * kThreads + tid
// of the order in key[j], victim[j]). Keys are relative to the row's smallest host row, over just
// the bits its range needs; the ranks past n_filled get the largest such key and, the sort being
// stable and their ranks the highest, stay behind every real miss. Ends with the sort's storage
// (which overlays host_row_by_rank) possibly still being read by other threads.
template <int kItems>
__device__ __forceinline__ void SortMisses(int32_t n_filled, int32_t lowest, int32_t highest,
                                           const int32_t* host_row_by_rank, const int32_t* victims,
                                           typename Sort<kItems>::TempStorage& storage,
                                           uint32_t (&key)[kItems], int32_t (&victim)[kItems]) {
  const int32_t tid = threadIdx.x;
  const uint32_t span = static_cast<uint32_t>(highest) - static_cast<uint32_t>(lowest);
  const int32_t bits = max(1, 32 - __clz(span));
  const uint32_t filler = bits == 32 ? UINT32_MAX : (1u << bits) - 1;
#pragma unroll
  for (int j = 0; j < kItems; ++j) {
    const int32_t r = tid * kItems + j;
    const bool real = r < n_filled;
    key[j] =
        real ? static_cast<uint32_t>(host_row_by_rank[r]) - static_cast<uint32_t>(lowest) : filler;
    victim[j] = real ? victims[r] : kNullSlot;
  }
  __syncthreads();  // host_row_by_rank is read; the sort may take the region
  Sort<kItems>(storage).SortBlockedToStriped(key, victim, 0, bits);
}

// Step 5, sorted: the row's filled misses go to the list in host-row order.
template <int kItems>
__device__ __forceinline__ void AppendMissesSorted(const ResolveView& v, int32_t miss_list_base,
                                                   int32_t n_filled, const BlockSlots& block,
                                                   int32_t lowest, int32_t highest,
                                                   const int32_t* host_row_by_rank,
                                                   const int32_t* victims,
                                                   typename Sort<kItems>::TempStorage& storage) {
  const int32_t tid = threadIdx.x;
  uint32_t key[kItems];
  int32_t victim[kItems];
  SortMisses<kItems>(n_filled, lowest, highest, host_row_by_rank, victims, storage, key, victim);
#pragma unroll
  for (int j = 0; j < kItems; ++j) {
    const int32_t r = j * kThreads + tid;
    const int32_t at = miss_list_base + r;
    if (r >= n_filled || at >= v.miss_capacity) continue;
    v.miss_host_row[at] = static_cast<int32_t>(key[j] + static_cast<uint32_t>(lowest));
    v.miss_slot[at] = block(victim[j]);
  }
}

// The fused copy's rows: rank i of the row's filled misses, host_row_by_rank[i] of the pool into
// the block's slot victims[i] of the hot cache (both in shared memory); invalid outside the view's
// row ranges.
struct OwnMisses {
  const ResolveView& v;
  const int32_t* host_row_by_rank;
  const int32_t* victims;
  BlockSlots block;

  using Entry = int2;  // (host row, slot)

  __device__ __forceinline__ Entry Load(int64_t i) const {
    return {host_row_by_rank[i], block(victims[i])};
  }

  template <typename V>
  __device__ __forceinline__ bool Locate(int64_t, Entry e, const V*& src, V*& dst) const {
    const int64_t s = e.x;
    const int64_t d = e.y;
    const bool valid = s >= 0 && s < v.copy_src_rows && d >= 0 && d < v.copy_dst_rows;
    src = valid ? reinterpret_cast<const V*>(v.copy_src + s * v.copy_src_stride) : nullptr;
    dst = valid ? reinterpret_cast<V*>(v.copy_dst + d * v.copy_dst_stride) : nullptr;
    return valid;
  }
};

// Chunks in flight per lane in the fused copy: with 4 x 16 B the copy fits the kernel's 64
// registers, and 32 warps keep 64 KB in flight per row.
constexpr int kFusedCopyLoads = 4;

// Step 5, fused: the row's n_filled misses (rank i: host_row_by_rank[i], victims[i], written and
// made visible by the caller's barrier) are copied by the CTA's warps, each taking batches of
// whole rows (row_gather::WarpCopyRows), as many per batch as spread the rows over every warp.
// Invalid copies are skipped and counted by one atomic per lane that found any.
template <int kVecBytes>
__device__ __forceinline__ void CopyOwnMisses(const ResolveView& v, int32_t n_filled,
                                              const int32_t* host_row_by_rank,
                                              const int32_t* victims, const BlockSlots& block) {
  const OwnMisses rows{v, host_row_by_rank, victims, block};
  const int32_t warp = threadIdx.x / 32;
  const int32_t g = row_gather::WarpBatchRows(n_filled, kWarps);
  const int32_t chunks = v.copy_row_bytes / kVecBytes;
  int32_t invalid = 0;
  for (int32_t first = warp * g; first < n_filled; first += kWarps * g) {
    invalid += row_gather::WarpCopyRows<kVecBytes, kFusedCopyLoads>(
        rows, first, min(g, n_filled - first), chunks);
  }
  if (invalid != 0 && v.copy_invalid != nullptr) {
    atomicAdd(v.copy_invalid, static_cast<unsigned long long>(invalid));
  }
}

// Step 5, fused: sorts the filled misses by host row when asked (back into host_row_by_rank and
// victims, by their new rank), then copies them. Called after the barrier that completes
// host_row_by_rank, victims and (sorting) the host-row range.
template <int kItems>
__device__ __forceinline__ void CopyMissesFused(const ResolveView& v, int32_t copy_vec,
                                                int32_t n_filled, const BlockSlots& block,
                                                bool sort_misses, int32_t lowest, int32_t highest,
                                                int32_t* host_row_by_rank, int32_t* victims,
                                                typename Sort<kItems>::TempStorage& storage) {
  if (sort_misses) {
    const int32_t tid = threadIdx.x;
    uint32_t key[kItems];
    int32_t victim[kItems];
    SortMisses<kItems>(n_filled, lowest, highest, host_row_by_rank, victims, storage, key, victim);
    __syncthreads();  // every thread is done with the sort's storage (and with victims)
#pragma unroll
    for (int j = 0; j < kItems; ++j) {
      const int32_t r = j * kThreads + tid;
      if (r >= n_filled) continue;
      host_row_by_rank[r] = static_cast<int32_t>(key[j] + static_cast<uint32_t>(lowest));
      victims[r] = victim[j];
    }
    __syncthreads();  // the sorted list is complete
  }
  switch (copy_vec) {
    case 16:
      return CopyOwnMisses<16>(v, n_filled, host_row_by_rank, victims, block);
    case 8:
      return CopyOwnMisses<8>(v, n_filled, host_row_by_rank, victims, block);
    case 4:
      return CopyOwnMisses<4>(v, n_filled, host_row_by_rank, victims, block);
    default:
      return CopyOwnMisses<1>(v, n_filled, host_row_by_rank, victims, block);
  }
}

// Step 7, after a barrier that makes every first entry's output and fill flag visible: repeats
// copy them.
template <int kItems>
__device__ __forceinline__ void ShareDuplicates(const Kind (&kind)[kItems],
                                                const int32_t (&first_of)[kItems], int32_t* out_row,
                                                uint8_t* fill_row) {
  const int32_t tid = threadIdx.x;
  __syncthreads();  // every first entry's output and fill flag is written
#pragma unroll
  for (int j = 0; j < kItems; ++j) {
    if (kind[j] != Kind::kDuplicate) continue;
    out_row[tid * kItems + j] = out_row[first_of[j]];
    if (fill_row != nullptr) fill_row[tid * kItems + j] = fill_row[first_of[j]];
  }
}

// Step 5, first part: filled miss j takes victim miss_rank[j]: slot_token, (segmented) its place
// in lru_order, the output; host_row[j] = its host row, also by rank with `by_rank` (to sort or
// copy them), and the thread's host-row range folded into row_min / row_max.
template <int kItems>
__device__ __forceinline__ void TakeVictims(
    const ResolveView& v, const int32_t (&pos)[kItems], const int32_t (&miss_rank)[kItems],
    const int32_t (&page)[kItems], int32_t n_filled, int32_t positions, const int32_t* victims,
    const int32_t& victims_at, int32_t c, const BlockSlots& block, bool segmented, bool by_rank,
    int32_t* slot_token, int32_t* lru, int32_t* position_slot, int32_t* out_row,
    int32_t* host_row_by_rank, int32_t (&out)[kItems], int32_t (&host_row)[kItems],
    int32_t& row_min, int32_t& row_max) {
  const int32_t tid = threadIdx.x;
#pragma unroll
  for (int j = 0; j < kItems; ++j) {
    if (miss_rank[j] >= n_filled) continue;
    const int32_t p = pos[j];
    const int32_t victim = victims[miss_rank[j]];
    // Always in [0, C) unless lru_order was corrupt (fewer free slots than counted).
    if (static_cast<uint32_t>(victim) < static_cast<uint32_t>(c)) {
      if (position_slot != nullptr) {
        // Clock: the victim's old position leaves the map (it is no miss of this row, whose
        // positions the map did not hold), the new one enters.
        const int32_t old = slot_token[victim];
        if (static_cast<uint32_t>(old) < static_cast<uint32_t>(positions)) position_slot[old] = -1;
        position_slot[p] = victim;
      }
      slot_token[victim] = p;
    }
    if (segmented && victims_at + miss_rank[j] < c) lru[victims_at + miss_rank[j]] = victim;
    out[j] = block(victim);
    out_row[tid * kItems + j] = out[j];
    host_row[j] = page[j] * v.page_tokens + p % v.page_tokens;
    if (by_rank) {
      host_row_by_rank[miss_rank[j]] = host_row[j];
      row_min = min(row_min, host_row[j]);
      row_max = max(row_max, host_row[j]);
    }
  }
}

// A resident row (e.resident >= 0): step 1 for padding, range and duplicates, then the direct
// mapping through the residency table; no replacement state, no misses. `pos` is loaded and the
// shared memory initialised (not yet synchronised).
template <int kItems>
__device__ __forceinline__ void ResolveResidentRow(const ResolveView& v, const BatchEntry& e,
                                                   int32_t b, const int32_t (&pos)[kItems],
                                                   int32_t* keys, int32_t* first_k,
                                                   int32_t hash_bits) {
  enum { kResident, kPad, kRange, kDup, kResidentCounts };
  __shared__ int32_t warp_totals[kResidentCounts][kWarps];
  const int32_t tid = threadIdx.x;
  const int32_t top_k = v.top_k;
  __syncthreads();  // the shared memory is initialised
  Kind kind[kItems];
  int32_t cell[kItems];
  int32_t first_of[kItems];
  HashEntries(pos, top_k, e.seq_len, keys, first_k, hash_bits, kind, cell, first_of);
  const int32_t* pages = v.resident_table + static_cast<int64_t>(e.resident) * v.resident_pages;
  const int32_t r = v.resident_page_rows;
  int32_t* out_row = v.slots_out + static_cast<int64_t>(b) * top_k;
  uint8_t* const fill_row =
      v.fill_mask == nullptr ? nullptr : v.fill_mask + static_cast<int64_t>(b) * top_k;
  int32_t local[kResidentCounts] = {};
#pragma unroll
  for (int j = 0; j < kItems; ++j) {
    if (kind[j] == Kind::kUnused) continue;
    const int32_t k = tid * kItems + j;
    const bool valid = kind[j] == Kind::kValid;
    out_row[k] = valid ? pages[pos[j] / r] + pos[j] % r : kNullSlot;
    if (fill_row != nullptr) fill_row[k] = 0;
    local[kResident] += valid;
    local[kPad] += kind[j] == Kind::kPadding;
    local[kRange] += kind[j] == Kind::kOutOfRange;
    local[kDup] += kind[j] == Kind::kDuplicate;
  }
  const int32_t lane = tid % 32;
#pragma unroll
  for (int i = 0; i < kResidentCounts; ++i) {
    const int32_t sum = __reduce_add_sync(0xffffffffu, local[i]);
    if (lane == 0) warp_totals[i][tid / 32] = sum;
  }
  __syncthreads();
  if (tid < 32) {
    int32_t total[kResidentCounts];
#pragma unroll
    for (int i = 0; i < kResidentCounts; ++i) {
      total[i] = __reduce_add_sync(0xffffffffu, warp_totals[i][lane]);
    }
    if (lane == 0) {
      const auto add = [](unsigned long long* counter, int32_t value) {
        if (value != 0) atomicAdd(counter, static_cast<unsigned long long>(value));
      };
      add(&v.counters->resident_hits, total[kResident]);
      add(&v.counters->padding, total[kPad]);
      add(&v.counters->out_of_range, total[kRange]);
      add(&v.counters->duplicates, total[kDup]);
    }
  }
  if (v.share_duplicates) ShareDuplicates(kind, first_of, out_row, fill_row);
}

// kFused: the view has a fused miss copy (copy_dst set), whose access width is copy_vec bytes.
// kClock: the view has the clock's state (clock_uses set) instead of an LRU order.
template <int kItems, bool kFused, bool kClock>
__global__ void __launch_bounds__(kThreads, 1)
    ResolveKernel(const ResolveView v, const SmemLayout layout, const int32_t copy_vec) {
  const int32_t b = blockIdx.x;
  const int32_t tid = threadIdx.x;
  const int32_t lane = tid % 32;
  const int32_t warp = tid / 32;
  // Global round trip 1: the batch size and the entry together (batch has max_batch = gridDim.x
  // entries, so batch[b] is in bounds whatever the batch size).
  const int32_t batch_size = *v.batch_size;
  const BatchEntry e = v.batch[b];
  const bool sort_misses = v.sort_misses && batch_size >= v.sort_min_batch;
  // This launch's rows copy their own misses instead of appending them (kernel_views.h).
  const bool fused = kFused && batch_size >= v.fused_copy_min_batch;

  extern __shared__ int4 smem[];
  std::byte* const smem_bytes = reinterpret_cast<std::byte*>(smem);
  // Region, in turn: the hash (steps 1-3), the LRU copy past the first chunk (step 4), host rows
  // by miss rank and the sort's storage (step 5; fused, the sorted host rows again).
  const int32_t cells = 1 << layout.hash_bits;
  int32_t* const keys = reinterpret_cast<int32_t*>(smem_bytes);
  int32_t* const first_k = keys + cells;      // smallest k holding the cell's key (step 1)
  int32_t* const hit_slot = first_k + cells;  // smallest slot holding it (step 2)
  uint16_t* const lru_copy = reinterpret_cast<uint16_t*>(smem_bytes);
  int32_t* const host_row_by_rank = reinterpret_cast<int32_t*>(smem_bytes);
  auto& sort_storage = *reinterpret_cast<typename Sort<kItems>::TempStorage*>(smem_bytes);
  uint32_t* const hit_mask = reinterpret_cast<uint32_t*>(smem_bytes + layout.region_bytes);
  int32_t* const victims =
      reinterpret_cast<int32_t*>(smem_bytes + layout.region_bytes + layout.hit_mask_bytes);
  __shared__ int32_t warp_counts[kNumCounts][kWarps];
  __shared__ int32_t warp_free[kWarps];
  __shared__ int32_t miss_base;
  __shared__ int32_t victims_at;  // segmented: where the filled slots start in the new order
  __shared__ int32_t min_host_row;
  __shared__ int32_t max_host_row;

  InitShared(keys, first_k, hit_slot, cells, hit_mask, layout.hit_mask_bytes);
  if (tid == 0) {
    min_host_row = INT32_MAX;
    max_host_row = INT32_MIN;
  }
  if (b >= batch_size || !e.in_use()) return;
  if (e.resident >= 0) {
    int32_t pos[kItems];
#pragma unroll
    for (int j = 0; j < kItems; ++j) {
      const int32_t k = tid * kItems + j;
      pos[j] = k < v.top_k ? v.topk[static_cast<int64_t>(b) * v.topk_stride + k] : kPaddingPosition;
    }
    ResolveResidentRow<kItems>(v, e, b, pos, keys, first_k, layout.hash_bits);
    return;
  }

  const int32_t top_k = v.top_k;
  const int32_t c = v.hot_slots;
  const int32_t w = v.window;
  const BlockSlots block{v.block_pages == nullptr
                             ? nullptr
                             : v.block_pages + static_cast<int64_t>(e.block) * v.pages_per_block,
                         e.block * (c + w), v.block_page_rows};
  const int32_t window_begin = max(0, e.seq_len - w);
  const int32_t* topk = v.topk + static_cast<int64_t>(b) * v.topk_stride;
  int32_t* out_row = v.slots_out + static_cast<int64_t>(b) * top_k;
  int32_t* slot_token = v.slot_token + static_cast<int64_t>(e.block) * c;
  int32_t* lru = kClock ? nullptr : v.lru_order + static_cast<int64_t>(e.block) * c;
  const bool segmented = !kClock && v.lru_protected != nullptr;
  uint8_t* const uses = kClock ? v.clock_uses + static_cast<int64_t>(e.block) * c : nullptr;
  int32_t* const position_slot =
      kClock ? v.position_slot + static_cast<int64_t>(e.block) * v.positions : nullptr;

  // Global round trip 2: the top-k row, the first chunk of slot_token (step 2) and of lru_order
  // (step 4), and the protected count (clock: the hand), all in flight at once; step 1 waits only
  // for the top-k.
  int32_t pos[kItems];
#pragma unroll
  for (int j = 0; j < kItems; ++j) {
    const int32_t k = tid * kItems + j;
    pos[j] = k < top_k ? topk[k] : kPaddingPosition;
  }
  int32_t token[kSlotItems];
  int32_t lru_slot[kLruItems];
  int32_t hand = 0;
  if constexpr (kClock) {
    hand = v.clock_hand[e.block];
  } else {
    Load4(slot_token, tid * kSlotItems, c, -1, token);  // -1: empty, never looked up
    Load4(lru, tid * kLruItems, c, 0, lru_slot);
  }
  // Where the protected part begins in the old order (C: none, or plain LRU).
  const int32_t first_protected = segmented ? c - min(max(v.lru_protected[e.block], 0), c) : c;
  __syncthreads();  // the shared memory is initialised

  Kind kind[kItems];
  int32_t cell[kItems];
  int32_t first_of[kItems];  // a repeat's first entry
  // With the clock, positions past the map are out of range too.
  const int32_t valid_end = kClock ? min(e.seq_len, v.positions) : e.seq_len;
  HashEntries(pos, top_k, valid_end, keys, first_k, layout.hash_bits, kind, cell, first_of);
  int32_t slot_of[kItems];
  if constexpr (kClock) {
    HitSlotsFromMap(pos, kind, position_slot, c, window_begin, slot_of);
  } else {
    FindHits(slot_token, c, window_begin, keys, hit_slot, layout.hash_bits, token);
    HitSlotsFromCells(pos, cell, kind, hit_slot, window_begin, slot_of);
  }

  // Step 3: classify and rank the misses.
  int32_t out[kItems];
  int32_t is_miss[kItems];
  int32_t local[kNumCounts] = {};
  ClassifyEntries(pos, slot_of, window_begin, block, c, w, hit_mask, kind, out, is_miss, local);
  if constexpr (kClock) {
    // A hit raises its slot's count (each hit slot has one entry; the sweep never reads it).
#pragma unroll
    for (int j = 0; j < kItems; ++j) {
      if (kind[j] != Kind::kHit) continue;
      const uint8_t u = uses[slot_of[j]];
      if (u < kClockMaxUses) uses[slot_of[j]] = static_cast<uint8_t>(u + 1);
    }
  }
  // The block's marks are addressed where they are used, not held in a register across the steps.
  if (v.prefetch_mark != nullptr && !v.prefetch_fills) {
    CountPrefetchHits(kind, slot_of, v.prefetch_mark + static_cast<int64_t>(e.block) * c,
                      v.counters);
  }
  int32_t miss_rank[kItems];
  local[kMisses] = WarpRank(is_miss, miss_rank);
#pragma unroll
  for (int i = 0; i < kNumCounts; ++i) {
    const int32_t sum = i == kMisses ? local[i] : __reduce_add_sync(0xffffffffu, local[i]);
    if (lane == 0) warp_counts[i][warp] = sum;
  }
  __syncthreads();  // the hit bitmask and warp_counts are complete
  int32_t n_miss = 0;
  const int32_t miss_offset = WarpOffset(warp_counts[kMisses], &n_miss);
  // Each hit entry has its own position and each position its own slot: n_hit slots are hit.
  const int32_t n_hit = __reduce_add_sync(0xffffffffu, warp_counts[kHits][lane]);
  const int32_t n_filled = min(n_miss, c - n_hit);
  const int32_t n_kept = c - n_hit - n_filled;
  // From here miss_rank[j] < n_filled iff entry j is a miss that gets a slot.
#pragma unroll
  for (int j = 0; j < kItems; ++j) miss_rank[j] = is_miss[j] ? miss_offset + miss_rank[j] : kNone;

  AddCounters(v.counters, warp_counts);  // step 6, early
  if (v.prefetch_mark != nullptr && v.count_prefetch_misses != nullptr && !v.prefetch_fills &&
      tid == 0 && n_miss > 0 && *v.count_prefetch_misses != 0) {
    atomicAdd(&v.counters->prefetch_missed, static_cast<unsigned long long>(n_miss));
  }
  uint8_t* const fill_row =
      v.fill_mask == nullptr ? nullptr : v.fill_mask + static_cast<int64_t>(b) * top_k;
  EmitSettled(kind, miss_rank, out, n_filled, out_row, fill_row);
  // Step 5's global reads and the miss list's atomicAdd, issued now and consumed after step 4.
  int32_t page[kItems];
  const int32_t list_base =
      n_filled > 0 ? IssueMissReads(v, b, e.page_table_row, pos, miss_rank, n_filled, !fused, page)
                   : 0;

  // Step 4. Nothing changes when no slot is hit or filled.
  if constexpr (kClock) {
    if (n_filled > 0) {
      SweepClock(uses, v.clock_hand + e.block, hand, c, n_filled, hit_mask, warp_free, victims);
    }
  } else if (n_hit + n_filled > 0) {
    UpdateRecency(lru, c, n_filled, n_kept, segmented, first_protected, v.protected_capacity,
                  v.lru_protected + e.block, hit_mask, lru_copy, warp_free, victims, victims_at,
                  lru_slot);
  }
  // Segmented, no protected part (no entry at first_protected): every free slot was probationary.
  // With nothing hit or filled the order stays, and so does the protected part (up to capacity).
  if (segmented && tid == 0 && (first_protected == c || n_hit + n_filled == 0)) {
    victims_at = n_kept;
    v.lru_protected[e.block] =
        min(v.protected_capacity, n_hit + n_filled > 0 ? n_hit : c - first_protected);
  }

  // Step 5: misses take their victims.
  if (n_filled > 0) {
    if (tid == 0) miss_base = list_base;
    __syncthreads();  // victims and miss_base are written
    int32_t host_row[kItems];
    int32_t row_min = INT32_MAX;
    int32_t row_max = INT32_MIN;
    TakeVictims(v, pos, miss_rank, page, n_filled, v.positions, victims, victims_at, c, block,
                segmented, sort_misses || fused, slot_token, lru, position_slot, out_row,
                host_row_by_rank, out, host_row, row_min, row_max);
    if (v.prefetch_mark != nullptr) {
      MarkFilledSlots(miss_rank, n_filled, victims, c,
                      v.prefetch_mark + static_cast<int64_t>(e.block) * c, v.prefetch_fills,
                      v.counters);
    }
    if (sort_misses) {
      row_min = __reduce_min_sync(0xffffffffu, row_min);
      row_max = __reduce_max_sync(0xffffffffu, row_max);
      if (lane == 0) {
        atomicMin(&min_host_row, row_min);
        atomicMax(&max_host_row, row_max);
      }
    }
    __syncthreads();  // host_row_by_rank and the host-row range are complete
    const int32_t miss_list_base = miss_base;
    if (fused) {
      CopyMissesFused<kItems>(v, copy_vec, n_filled, block, sort_misses, min_host_row, max_host_row,
                              host_row_by_rank, victims, sort_storage);
    } else if (!sort_misses) {
      AppendMisses(v, miss_list_base, n_filled, miss_rank, host_row, out);
    } else {
      AppendMissesSorted<kItems>(v, miss_list_base, n_filled, block, min_host_row, max_host_row,
                                 host_row_by_rank, victims, sort_storage);
    }
  }

  if (v.share_duplicates) ShareDuplicates(kind, first_of, out_row, fill_row);  // step 7
}

template <int kItems, bool kFused, bool kClock>
cudaError_t LaunchKernel(const ResolveView& view, int32_t max_batch, int32_t copy_vec,
                         cudaStream_t stream) {
  const SmemLayout layout = MakeLayout<kItems>(view.top_k, view.hot_slots, kClock);
  int32_t limit = 0;
  if (cudaError_t err = cuda_common::OptInMaxDynamicSmem(
          reinterpret_cast<const void*>(ResolveKernel<kItems, kFused, kClock>), &limit);
      err != cudaSuccess) {
    return err;
  }
  if (layout.total() > limit) return kUnsupported;
  ResolveKernel<kItems, kFused, kClock>
      <<<max_batch, kThreads, layout.total(), stream>>>(view, layout, copy_vec);
  return cudaGetLastError();
}

template <int kItems, bool kClock>
cudaError_t Launch(const ResolveView& view, int32_t max_batch, cudaStream_t stream) {
  if (view.copy_dst == nullptr) {
    return LaunchKernel<kItems, false, kClock>(view, max_batch, 0, stream);
  }
  const int copy_vec = row_gather::VectorBytes(view.copy_src, view.copy_dst, view.copy_row_bytes,
                                               view.copy_src_stride, view.copy_dst_stride);
  return LaunchKernel<kItems, true, kClock>(view, max_batch, copy_vec, stream);
}

template <int kItems>
cudaError_t Launch(const ResolveView& view, int32_t max_batch, cudaStream_t stream) {
  return view.clock_uses != nullptr ? Launch<kItems, true>(view, max_batch, stream)
                                    : Launch<kItems, false>(view, max_batch, stream);
}

}  // namespace

cudaError_t LaunchResolve(const ResolveView& view, int32_t max_batch, cudaStream_t stream) {
  if (view.top_k < 0 || view.top_k > kMaxResolveTopK || view.hot_slots < 1 ||
      view.hot_slots > kMaxResolveHotSlots || view.window < 0 || view.topk_stride < view.top_k ||
      view.page_tokens < 1 || max_batch < 0 ||
      (view.resident_table != nullptr && view.resident_page_rows < 1) ||
      (view.block_pages != nullptr && (view.block_page_rows < 1 || view.pages_per_block < 1)) ||
      view.chunk_rows < 0 ||
      (view.chunk_stride != 0 && view.chunk_stride < int64_t{view.chunk_rows} * view.top_k) ||
      (view.clock_uses != nullptr &&
       (view.clock_hand == nullptr || view.position_slot == nullptr || view.positions < 1)) ||
      (view.copy_dst != nullptr &&
       (view.copy_row_bytes < 1 || view.copy_row_bytes > kMaxFusedCopyRowBytes ||
        view.copy_src_stride < 0 || view.copy_dst_stride < 0 || view.copy_src_rows < 0 ||
        view.copy_dst_rows < 0))) {
    return kUnsupported;
  }
  if (view.top_k == 0 || max_batch == 0) return cudaSuccess;
  switch ((view.top_k + kThreads - 1) / kThreads) {
    case 1:
      return Launch<1>(view, max_batch, stream);
    case 2:
      return Launch<2>(view, max_batch, stream);
    case 3:
    case 4:
      return Launch<4>(view, max_batch, stream);
    default:
      return kUnsupported;
  }
}

}  // namespace sparsekv
