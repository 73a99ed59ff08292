// The prefetch predictor on the GPU (semantics in sparsekv/prefetch.h): one CTA of kThreads per
// batch row, in three block-wide phases.
//   1. Hash the row's valid positions into shared memory (open addressing, linear probing, at
//      least twice as many cells as entries): the membership test for "an entry of the row".
//   2. Compact the flagged entries' positions in k order (a block scan per chunk of kThreads
//      entries). Repeats stay in the list: every candidate they make repeats an earlier
//      candidate of the same round, which phase 3 drops, so the result is the reference's.
//   3. Walk the candidate sequence (exit position, then m + d, m - d for d = 1, 2) in chunks of
//      kThreads, one candidate per thread. A candidate survives if it is in range, not an entry
//      of the row below exit_begin, not accepted by an earlier chunk (a second hash of at least
//      2 * budget cells) and the first of its value in the chunk (a per-chunk hash keeping the
//      smallest sequence index per value). A block scan ranks the survivors; those that fit in
//      the budget are written and added to the accepted hash. The walk stops when the budget is
//      full.
// Shared memory (dynamic): row hash 4 * 2^row_bits, misses 4 * top_k, accepted hash
// 4 * 2^accepted_bits, chunk hash 8 * kChunkCells bytes.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cub/block/block_scan.cuh>
#include <string>

#include "cuda_common/cuda_check.h"
#include "cuda_common/smem_limit.h"
#include "sparsekv/prefetch.h"

namespace sparsekv {
namespace {

constexpr int kThreads = 256;
constexpr int32_t kChunkBits = 9;
constexpr int32_t kChunkCells = 1 << kChunkBits;
static_assert(kChunkCells == 2 * kThreads, "a chunk's candidates fill at most half the cells");
constexpr int32_t kEmptyCell = -1;  // valid positions are >= 0
constexpr int32_t kNoIndex = INT32_MAX;
constexpr int32_t kInvalid = -1;  // a candidate that is not a position

using Scan = cub::BlockScan<int32_t, kThreads>;

struct SmemLayout {
  int32_t row_bits;
  int32_t accepted_bits;
  int32_t misses_offset;  // bytes from the start
  int32_t accepted_offset;
  int32_t chunk_offset;
  int32_t total;
};

int32_t CeilLog2AtLeast(int64_t n, int32_t min_bits) {
  int32_t bits = min_bits;
  while ((int64_t{1} << bits) < n) ++bits;
  return bits;
}

SmemLayout MakeLayout(int32_t top_k, int32_t budget) {
  SmemLayout l{};
  l.row_bits = CeilLog2AtLeast(int64_t{2} * top_k, 2);
  l.accepted_bits = CeilLog2AtLeast(int64_t{2} * budget, 2);
  l.misses_offset = static_cast<int32_t>(sizeof(int32_t)) << l.row_bits;
  l.accepted_offset = l.misses_offset + std::max(1, top_k) * static_cast<int32_t>(sizeof(int32_t));
  l.chunk_offset = l.accepted_offset + (static_cast<int32_t>(sizeof(int32_t)) << l.accepted_bits);
  l.total = l.chunk_offset + 2 * kChunkCells * static_cast<int32_t>(sizeof(int32_t));
  return l;
}

__device__ __forceinline__ uint32_t HashCell(int32_t position, int32_t bits) {
  return (static_cast<uint32_t>(position) * 0x9E3779B1u) >> (32 - bits);
}

// Inserts `position`; returns its cell. The table never fills (cells >= 2 * insertions).
__device__ __forceinline__ uint32_t HashInsert(int32_t* keys, int32_t bits, int32_t position) {
  const uint32_t mask = (1u << bits) - 1;
  for (uint32_t cell = HashCell(position, bits);; cell = (cell + 1) & mask) {
    const int32_t prev = atomicCAS(keys + cell, kEmptyCell, position);
    if (prev == kEmptyCell || prev == position) return cell;
  }
}

__device__ __forceinline__ bool HashContains(const int32_t* keys, int32_t bits, int32_t position) {
  const uint32_t mask = (1u << bits) - 1;
  for (uint32_t cell = HashCell(position, bits);; cell = (cell + 1) & mask) {
    const int32_t key = keys[cell];
    if (key == position) return true;
    if (key == kEmptyCell) return false;
  }
}

__global__ void __launch_bounds__(kThreads) PrefetchKernel(PrefetchView v, SmemLayout layout) {
  const int32_t b = blockIdx.x;
  if (b >= *v.batch_size) return;
  extern __shared__ __align__(16) unsigned char smem[];
  int32_t* row_keys = reinterpret_cast<int32_t*>(smem);
  int32_t* misses = reinterpret_cast<int32_t*>(smem + layout.misses_offset);
  int32_t* accepted = reinterpret_cast<int32_t*>(smem + layout.accepted_offset);
  int32_t* chunk_keys = reinterpret_cast<int32_t*>(smem + layout.chunk_offset);
  int32_t* chunk_first = chunk_keys + kChunkCells;
  __shared__ typename Scan::TempStorage scan;

  const int tid = threadIdx.x;
  const int32_t budget = v.budget;
  int32_t* out = v.predicted + int64_t{b} * budget;
  const BatchEntry e = v.batch[b];
  int32_t n = 0;  // predictions written
  if (e.block >= 0) {
    const int32_t* row = v.topk + int64_t{b} * v.topk_stride;
    const uint8_t* fill = v.fill_mask + int64_t{b} * v.top_k;
    const int32_t exit_begin = max(0, e.seq_len - v.window);
    const int32_t limit = min(max(e.seq_len + 1 - v.window, 0), max(e.seq_len, 0));
    // Phases 1 and 2 are skipped where the exit position alone fills the budget (P = 1, the
    // recommended budget): phase 3 then never looks at the row.
    const bool walk_row = budget > (exit_begin < limit ? 1 : 0);
    for (int32_t i = tid; walk_row && i < (1 << layout.row_bits); i += kThreads) {
      row_keys[i] = kEmptyCell;
    }
    for (int32_t i = tid; i < (1 << layout.accepted_bits); i += kThreads) accepted[i] = kEmptyCell;
    __syncthreads();

    int32_t miss_count = 0;
    for (int32_t base = 0; walk_row && base < v.top_k; base += kThreads) {
      const int32_t k = base + tid;
      const int32_t p = k < v.top_k ? row[k] : kInvalid;
      const bool valid = p >= 0 && p < e.seq_len;
      if (valid) HashInsert(row_keys, layout.row_bits, p);
      const int32_t flagged = valid && fill[k] != 0 ? 1 : 0;
      int32_t index = 0, total = 0;
      Scan(scan).ExclusiveSum(flagged, index, total);
      if (flagged) misses[miss_count + index] = p;
      miss_count += total;
      __syncthreads();  // scan storage reuse; the last pass also publishes the hash and misses
    }

    // Phase 3.
    const int64_t candidates = 1 + int64_t{4} * miss_count;
    for (int64_t base = 0; base < candidates && n < budget; base += kThreads) {
      chunk_keys[tid] = kEmptyCell;
      chunk_keys[tid + kThreads] = kEmptyCell;
      chunk_first[tid] = kNoIndex;
      chunk_first[tid + kThreads] = kNoIndex;
      const int64_t j = base + tid;
      int64_t c = kInvalid;
      if (j == 0) {
        c = exit_begin;
      } else if (j < candidates) {
        const int64_t rest = j - 1;
        const int32_t d = 1 + static_cast<int32_t>(rest / (2 * int64_t{miss_count}));
        const int64_t m = misses[(rest % (2 * int64_t{miss_count})) / 2];
        c = (rest & 1) == 0 ? m + d : m - d;
      }
      const int32_t p = static_cast<int32_t>(c);
      bool keep = c >= 0 && c < limit &&
                  !(p < exit_begin && HashContains(row_keys, layout.row_bits, p)) &&
                  !HashContains(accepted, layout.accepted_bits, p);
      __syncthreads();  // chunk hash cleared
      uint32_t cell = 0;
      if (keep) {
        cell = HashInsert(chunk_keys, kChunkBits, p);
        atomicMin(chunk_first + cell, static_cast<int32_t>(j - base));
      }
      __syncthreads();
      keep = keep && chunk_first[cell] == static_cast<int32_t>(j - base);
      int32_t rank = 0, total = 0;
      Scan(scan).ExclusiveSum(keep ? 1 : 0, rank, total);
      if (keep && n + rank < budget) {
        out[n + rank] = p;
        HashInsert(accepted, layout.accepted_bits, p);
      }
      n = min(budget, n + total);
      __syncthreads();  // accepted hash and scan storage before the next chunk
    }
  }
  for (int32_t i = n + tid; i < budget; i += kThreads) out[i] = -1;
}

}  // namespace

Status PredictPrefetchCuda(const PrefetchView& view, int32_t max_batch, StreamHandle stream) {
  if (view.top_k < 0 || view.top_k > kMaxPrefetchTopK || view.budget < 0 ||
      view.budget > kMaxPrefetchBudget || view.topk_stride < view.top_k || view.window < 0 ||
      max_batch < 0) {
    return InvalidArgument(
        "PredictPrefetchCuda: top_k=" + std::to_string(view.top_k) + " (max " +
        std::to_string(kMaxPrefetchTopK) + ") budget=" + std::to_string(view.budget) + " (max " +
        std::to_string(kMaxPrefetchBudget) + ") topk_stride=" + std::to_string(view.topk_stride) +
        " window=" + std::to_string(view.window) + " max_batch=" + std::to_string(max_batch));
  }
  if (max_batch == 0 || view.budget == 0) return Status::Ok();
  const SmemLayout layout = MakeLayout(view.top_k, view.budget);
  int32_t smem_limit = 0;
  SPARSEKV_CUDA_RETURN_IF_ERROR(
      cuda_common::OptInMaxDynamicSmem(reinterpret_cast<const void*>(PrefetchKernel), &smem_limit));
  if (layout.total > smem_limit) {
    return InvalidArgument("PredictPrefetchCuda: needs " + std::to_string(layout.total) +
                           " B of shared memory, the device allows " + std::to_string(smem_limit));
  }
  PrefetchKernel<<<max_batch, kThreads, layout.total, static_cast<cudaStream_t>(stream)>>>(view,
                                                                                           layout);
  SPARSEKV_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return Status::Ok();
}

}  // namespace sparsekv
