// Resolve: one CTA of kThreads per batch row classifies the row's top-k against its hot-cache
// block, picks LRU victims, updates slot_token and lru_order, and emits the row's misses.
//
// The top-k entries sit in registers in a blocked arrangement (thread t holds k = t * kItems + j),
// so block scans rank them in k order. In O(K + C) per row, with every step block-wide:
//   1. Hash the row's valid positions into shared memory (open addressing, linear probing, at least
//      twice as many cells as entries), each cell keeping the smallest k that holds its position:
//      entry k is a duplicate iff its cell's smallest k is not k. Deterministic under any
//      interleaving of the inserts.
//   2. Walk the C slots: a slot whose token is in the hash (and not a window position) is a hit.
//      The cell keeps the smallest such slot, so that even a table holding a position twice picks
//      the slot the reference picks.
//   3. Classify (window hit, hit, miss) and rank the misses in k order with a block scan. Hit slots
//      are marked in a bitmask of C bits.
//   4. One scan over the old LRU order (copied to shared memory, since the new order overwrites it
//      in place) ranks the "free" slots (not hit). The first n_filled = min(misses, free) free
//      slots are the victims, in LRU order, and the same scan gives every slot its place in the
//      stable partition (kept slots first, then hit and filled ones), so the new order is written
//      directly: with u = free slots before position i of the old order,
//        kept   (free, u >= n_filled): new position u - n_filled
//        others (hit, or victim u):    new position n_kept + i - max(0, u - n_filled).
//   5. Miss r takes victim r. The row's misses are appended to the miss list with one atomicAdd,
//      sorted by host row when asked (block radix sort over the row's host-row range only).
//   6. Counters: warp sums, then shared sums, then one global atomic per nonzero counter.
// Shared memory: the hash, the LRU copy and the sort's storage are live at disjoint times and share
// one region; the hit bitmask and the victims have their own.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cub/block/block_radix_sort.cuh>
#include <cub/block/block_scan.cuh>
#include <map>
#include <mutex>

#include "cuda/kernels.h"

namespace sparsekv {
namespace {

// 1024 threads: one CTA per row leaves most of the SM's warp slots empty at small batches, and
// the steps are latency-bound; twice the warps of 512 measured to hide more of it.
constexpr int kThreads = 1024;
// Old LRU entries per thread per round of the scan in step 4.
constexpr int kLruItems = 4;
constexpr int32_t kEmptyCell = -1;    // hash cell without a key (valid positions are >= 0)
constexpr int32_t kNone = INT32_MAX;  // no entry / no slot yet, in a hash cell

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

// Counters summed in shared memory; misses come from the scan.
enum Count { kHits, kWindowHits, kPadding, kDuplicates, kOutOfRange, kNumCounts };

using Scan = cub::BlockScan<int32_t, kThreads>;
template <int kItems>
using Sort = cub::BlockRadixSort<uint32_t, kThreads, kItems, int32_t>;

// Sizes of the dynamic shared memory, computed identically on host and device.
struct SmemLayout {
  int32_t hash_bits;       // log2 of the hash cells
  int32_t region_bytes;    // hash | LRU copy | sort storage
  int32_t hit_mask_bytes;  // C bits
  int32_t victims_bytes;   // top_k int32

  int32_t total() const { return region_bytes + hit_mask_bytes + victims_bytes; }
};

constexpr int32_t RoundUp16(int64_t bytes) { return static_cast<int32_t>((bytes + 15) / 16 * 16); }

template <int kItems>
SmemLayout MakeLayout(int32_t top_k, int32_t hot_slots) {
  SmemLayout layout{};
  layout.hash_bits = 1;
  while ((1 << layout.hash_bits) < 2 * top_k) ++layout.hash_bits;
  const int64_t hash_bytes = int64_t{2} * sizeof(int32_t) << layout.hash_bits;
  const int64_t lru_bytes = int64_t{hot_slots} * sizeof(uint16_t);
  const int64_t sort_bytes = sizeof(typename Sort<kItems>::TempStorage);
  layout.region_bytes = RoundUp16(std::max({hash_bytes, lru_bytes, sort_bytes}));
  layout.hit_mask_bytes = RoundUp16((int64_t{hot_slots} + 31) / 32 * sizeof(uint32_t));
  layout.victims_bytes = RoundUp16(int64_t{top_k} * sizeof(int32_t));
  return layout;
}

__device__ __forceinline__ int32_t HashCell(int32_t position, int32_t bits) {
  return static_cast<int32_t>((static_cast<uint32_t>(position) * 0x9E3779B1u) >> (32 - bits));
}

// Inserts `position` for entry k; returns its cell. The table never fills (cells >= 2 * entries).
__device__ __forceinline__ int32_t HashInsert(int32_t* keys, int32_t* min_k, int32_t bits,
                                              int32_t position, int32_t k) {
  const int32_t mask = (1 << bits) - 1;
  for (int32_t cell = HashCell(position, bits);; cell = (cell + 1) & mask) {
    const int32_t prev = atomicCAS(keys + cell, kEmptyCell, position);
    if (prev == kEmptyCell || prev == position) {
      atomicMin(min_k + cell, k);
      return cell;
    }
  }
}

// The cell holding `position`, or -1.
__device__ __forceinline__ int32_t HashFind(const int32_t* keys, int32_t bits, int32_t position) {
  const int32_t mask = (1 << bits) - 1;
  for (int32_t cell = HashCell(position, bits);; cell = (cell + 1) & mask) {
    const int32_t key = keys[cell];
    if (key == position) return cell;
    if (key == kEmptyCell) return -1;
  }
}

// Adds `value` of every thread into *total (a shared-memory counter).
__device__ __forceinline__ void BlockAdd(int32_t* total, int32_t value) {
  const int32_t warp_sum = __reduce_add_sync(0xffffffffu, value);
  if (threadIdx.x % 32 == 0 && warp_sum != 0) atomicAdd(total, warp_sum);
}

template <int kItems>
__global__ void __launch_bounds__(kThreads, 1)
    ResolveKernel(const ResolveView v, const SmemLayout layout) {
  const int32_t b = blockIdx.x;
  if (b >= *v.batch_size) return;
  const BatchEntry e = v.batch[b];
  if (e.block < 0) return;

  const int32_t tid = threadIdx.x;
  const int32_t top_k = v.top_k;
  const int32_t c = v.hot_slots;
  const int32_t w = v.window;
  const int32_t base = e.block * (c + w);
  const int32_t window_begin = max(0, e.seq_len - w);
  const int32_t* topk = v.topk + static_cast<int64_t>(b) * v.topk_stride;
  int32_t* out_row = v.slots_out + static_cast<int64_t>(b) * top_k;
  int32_t* slot_token = v.slot_token + static_cast<int64_t>(e.block) * c;
  int32_t* lru = v.lru_order + static_cast<int64_t>(e.block) * c;

  extern __shared__ int4 smem[];
  std::byte* const smem_bytes = reinterpret_cast<std::byte*>(smem);
  // Region, in turn: the hash (steps 1-3), the LRU copy (step 4), host rows by miss rank and the
  // sort's storage (step 5).
  const int32_t cells = 1 << layout.hash_bits;
  int32_t* const keys = reinterpret_cast<int32_t*>(smem_bytes);
  int32_t* const cell_min = keys + cells;  // smallest k (step 1), then smallest hit slot (2, 3)
  uint16_t* const lru_copy = reinterpret_cast<uint16_t*>(smem_bytes);
  int32_t* const host_row_by_rank = reinterpret_cast<int32_t*>(smem_bytes);
  auto& sort_storage = *reinterpret_cast<typename Sort<kItems>::TempStorage*>(smem_bytes);
  uint32_t* const hit_mask = reinterpret_cast<uint32_t*>(smem_bytes + layout.region_bytes);
  int32_t* const victims =
      reinterpret_cast<int32_t*>(smem_bytes + layout.region_bytes + layout.hit_mask_bytes);
  __shared__ typename Scan::TempStorage scan_storage;
  __shared__ int32_t counts[kNumCounts];
  __shared__ int32_t miss_base;
  __shared__ int32_t min_host_row;
  __shared__ int32_t max_host_row;

  for (int32_t i = tid; i < cells; i += kThreads) {
    keys[i] = kEmptyCell;
    cell_min[i] = kNone;
  }
  for (int32_t i = tid; i < layout.hit_mask_bytes / 4; i += kThreads) hit_mask[i] = 0;
  if (tid < kNumCounts) counts[tid] = 0;
  if (tid == 0) {
    min_host_row = INT32_MAX;
    max_host_row = INT32_MIN;
  }
  int32_t pos[kItems];
  Kind kind[kItems];
#pragma unroll
  for (int j = 0; j < kItems; ++j) {
    const int32_t k = tid * kItems + j;
    pos[j] = k < top_k ? topk[k] : kPaddingPosition;
    kind[j] = k >= top_k                          ? Kind::kUnused
              : pos[j] == kPaddingPosition        ? Kind::kPadding
              : pos[j] < 0 || pos[j] >= e.seq_len ? Kind::kOutOfRange
                                                  : Kind::kValid;
  }
  __syncthreads();

  // Step 1: hash; duplicates.
  int32_t cell[kItems];
#pragma unroll
  for (int j = 0; j < kItems; ++j) {
    if (kind[j] == Kind::kValid) {
      cell[j] = HashInsert(keys, cell_min, layout.hash_bits, pos[j], tid * kItems + j);
    }
  }
  __syncthreads();
  bool first[kItems];
#pragma unroll
  for (int j = 0; j < kItems; ++j) {
    first[j] = kind[j] == Kind::kValid && cell_min[cell[j]] == tid * kItems + j;
    if (kind[j] == Kind::kValid && !first[j]) kind[j] = Kind::kDuplicate;
  }
  __syncthreads();
  // Every entry has read its cell; the cell's first entry now resets it for step 2.
#pragma unroll
  for (int j = 0; j < kItems; ++j) {
    if (first[j]) cell_min[cell[j]] = kNone;
  }
  __syncthreads();

  // Step 2: hits, found from the slots' side.
  for (int32_t s = tid; s < c; s += kThreads) {
    const int32_t token = slot_token[s];
    if (token < 0 || token >= window_begin) continue;
    const int32_t found = HashFind(keys, layout.hash_bits, token);
    if (found >= 0) atomicMin(cell_min + found, s);
  }
  __syncthreads();

  // Step 3: classify and rank the misses.
  int32_t out[kItems];
  int32_t is_miss[kItems];
  int32_t local[kNumCounts] = {};
#pragma unroll
  for (int j = 0; j < kItems; ++j) {
    out[j] = kNullSlot;
    is_miss[j] = 0;
    switch (kind[j]) {
      case Kind::kPadding:
        ++local[kPadding];
        break;
      case Kind::kOutOfRange:
        ++local[kOutOfRange];
        break;
      case Kind::kDuplicate:
        ++local[kDuplicates];
        break;
      case Kind::kValid:
        if (pos[j] >= window_begin) {
          kind[j] = Kind::kWindow;
          out[j] = base + c + pos[j] % w;
          ++local[kWindowHits];
        } else if (const int32_t slot = cell_min[cell[j]]; slot != kNone) {
          kind[j] = Kind::kHit;
          out[j] = base + slot;
          atomicOr(hit_mask + slot / 32, 1u << (slot % 32));
          ++local[kHits];
        } else {
          kind[j] = Kind::kMiss;
          is_miss[j] = 1;
        }
        break;
      default:
        break;
    }
  }
#pragma unroll
  for (int i = 0; i < kNumCounts; ++i) BlockAdd(counts + i, local[i]);
  int32_t miss_rank[kItems];
  int32_t n_miss = 0;
  Scan(scan_storage).ExclusiveSum(is_miss, miss_rank, n_miss);
  __syncthreads();
  // Each hit entry has its own position and each position its own slot: n_hit slots are hit.
  const int32_t n_hit = counts[kHits];
  const int32_t n_filled = min(n_miss, c - n_hit);
  const int32_t n_kept = c - n_hit - n_filled;

  // Step 4: victims and the new LRU order. Nothing changes when no slot is hit or filled.
  if (n_hit + n_filled > 0) {
    for (int32_t i = tid; i < c; i += kThreads) lru_copy[i] = static_cast<uint16_t>(lru[i]);
    __syncthreads();
    int32_t free_before = 0;  // free slots in the rounds already scanned
    for (int32_t round = 0; round < c; round += kThreads * kLruItems) {
      int32_t slot[kLruItems];
      int32_t is_free[kLruItems];
      int32_t free_rank[kLruItems];
#pragma unroll
      for (int j = 0; j < kLruItems; ++j) {
        const int32_t i = round + tid * kLruItems + j;
        slot[j] = i < c ? lru_copy[i] : 0;
        // A corrupt entry (>= C) is never free, hence never a victim.
        is_free[j] = i < c && slot[j] < c && !(hit_mask[slot[j] / 32] >> (slot[j] % 32) & 1u);
      }
      int32_t round_free = 0;
      Scan(scan_storage).ExclusiveSum(is_free, free_rank, round_free);
#pragma unroll
      for (int j = 0; j < kLruItems; ++j) {
        const int32_t i = round + tid * kLruItems + j;
        if (i >= c) continue;
        const int32_t u = free_before + free_rank[j];
        // With lru_order a permutation every target is in [0, C); the bound only keeps a corrupt
        // order from writing outside the block.
        int32_t target;
        if (is_free[j] && u >= n_filled) {
          target = u - n_filled;
        } else {
          if (is_free[j]) victims[u] = slot[j];
          target = n_kept + i - max(0, u - n_filled);
        }
        if (target < c) lru[target] = slot[j];
      }
      free_before += round_free;
      __syncthreads();
    }
  }

  // Step 5: misses take their victims.
  int32_t host_row[kItems];
  if (n_filled > 0) {
    if (tid == 0) miss_base = atomicAdd(v.miss_count, n_filled);
    int32_t row_min = INT32_MAX;
    int32_t row_max = INT32_MIN;
    const int32_t* page_row =
        v.page_table + static_cast<int64_t>(e.page_table_row) * v.pages_per_request;
#pragma unroll
    for (int j = 0; j < kItems; ++j) {
      if (kind[j] != Kind::kMiss || miss_rank[j] >= n_filled) continue;
      const int32_t p = pos[j];
      const int32_t victim = victims[miss_rank[j]];
      // Always in [0, C) unless lru_order was corrupt (fewer free slots than counted).
      if (static_cast<uint32_t>(victim) < static_cast<uint32_t>(c)) slot_token[victim] = p;
      out[j] = base + victim;
      host_row[j] = page_row[p / v.page_tokens] * v.page_tokens + p % v.page_tokens;
      if (v.sort_misses) {
        host_row_by_rank[miss_rank[j]] = host_row[j];
        row_min = min(row_min, host_row[j]);
        row_max = max(row_max, host_row[j]);
      }
    }
    if (v.sort_misses) {
      row_min = __reduce_min_sync(0xffffffffu, row_min);
      row_max = __reduce_max_sync(0xffffffffu, row_max);
      if (tid % 32 == 0) {
        atomicMin(&min_host_row, row_min);
        atomicMax(&max_host_row, row_max);
      }
    }
    __syncthreads();
    const int32_t list_base = miss_base;
    if (!v.sort_misses) {
#pragma unroll
      for (int j = 0; j < kItems; ++j) {
        const int32_t at = list_base + miss_rank[j];
        if (kind[j] != Kind::kMiss || miss_rank[j] >= n_filled || at >= v.miss_capacity) continue;
        v.miss_host_row[at] = host_row[j];
        v.miss_slot[at] = out[j];
      }
    } else {
      // Keys relative to the row's smallest host row, over just the bits its range needs; the
      // ranks past n_filled get the largest such key and, the sort being stable and their ranks
      // the highest, stay behind every real miss.
      const int32_t lowest = min_host_row;
      const uint32_t span = static_cast<uint32_t>(max_host_row) - static_cast<uint32_t>(lowest);
      const int32_t bits = max(1, 32 - __clz(span));
      const uint32_t filler = bits == 32 ? UINT32_MAX : (1u << bits) - 1;
      uint32_t key[kItems];
      int32_t slot[kItems];
#pragma unroll
      for (int j = 0; j < kItems; ++j) {
        const int32_t r = tid * kItems + j;
        const bool real = r < n_filled;
        key[j] = real ? static_cast<uint32_t>(host_row_by_rank[r]) - static_cast<uint32_t>(lowest)
                      : filler;
        slot[j] = real ? base + victims[r] : kNullSlot;
      }
      __syncthreads();  // host_row_by_rank is read; the sort may take the region
      Sort<kItems>(sort_storage).SortBlockedToStriped(key, slot, 0, bits);
#pragma unroll
      for (int j = 0; j < kItems; ++j) {
        const int32_t r = j * kThreads + tid;
        const int32_t at = list_base + r;
        if (r >= n_filled || at >= v.miss_capacity) continue;
        v.miss_host_row[at] = static_cast<int32_t>(key[j] + static_cast<uint32_t>(lowest));
        v.miss_slot[at] = slot[j];
      }
    }
  }

#pragma unroll
  for (int j = 0; j < kItems; ++j) {
    if (kind[j] != Kind::kUnused) out_row[tid * kItems + j] = out[j];
  }

  // Step 6: counters (counts[] is final since the sync after the miss scan).
  if (tid == 0) {
    ResolveCounters* n = v.counters;
    const auto add = [](unsigned long long* counter, int32_t value) {
      if (value != 0) atomicAdd(counter, static_cast<unsigned long long>(value));
    };
    add(&n->hits, counts[kHits]);
    add(&n->window_hits, counts[kWindowHits]);
    add(&n->misses, n_miss);
    add(&n->padding, counts[kPadding]);
    add(&n->duplicates, counts[kDuplicates]);
    add(&n->out_of_range, counts[kOutOfRange]);
  }
}

// The dynamic shared memory ResolveKernel<kItems> may use on the current device. The first call
// per device raises the kernel's limit to the device's opt-in maximum.
template <int kItems>
cudaError_t MaxDynamicSmem(int32_t* bytes) {
  static std::mutex mu;
  static std::map<int, int32_t> limit_by_device;
  int device = 0;
  if (cudaError_t err = cudaGetDevice(&device); err != cudaSuccess) return err;
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = limit_by_device.find(device); it != limit_by_device.end()) {
    *bytes = it->second;
    return cudaSuccess;
  }
  int optin = 0;
  cudaFuncAttributes attributes{};
  if (cudaError_t err =
          cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
      err != cudaSuccess) {
    return err;
  }
  if (cudaError_t err = cudaFuncGetAttributes(&attributes, ResolveKernel<kItems>);
      err != cudaSuccess) {
    return err;
  }
  const int32_t limit = optin - static_cast<int32_t>(attributes.sharedSizeBytes);
  if (cudaError_t err = cudaFuncSetAttribute(ResolveKernel<kItems>,
                                             cudaFuncAttributeMaxDynamicSharedMemorySize, limit);
      err != cudaSuccess) {
    return err;
  }
  limit_by_device.emplace(device, limit);
  *bytes = limit;
  return cudaSuccess;
}

template <int kItems>
cudaError_t Launch(const ResolveView& view, int32_t max_batch, cudaStream_t stream) {
  const SmemLayout layout = MakeLayout<kItems>(view.top_k, view.hot_slots);
  int32_t limit = 0;
  if (cudaError_t err = MaxDynamicSmem<kItems>(&limit); err != cudaSuccess) return err;
  if (layout.total() > limit) return kUnsupported;
  ResolveKernel<kItems><<<max_batch, kThreads, layout.total(), stream>>>(view, layout);
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchResolve(const ResolveView& view, int32_t max_batch, cudaStream_t stream) {
  if (view.top_k < 0 || view.top_k > kMaxResolveTopK || view.hot_slots < 1 ||
      view.hot_slots > kMaxResolveHotSlots || view.window < 0 || view.topk_stride < view.top_k ||
      view.page_tokens < 1 || max_batch < 0) {
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
