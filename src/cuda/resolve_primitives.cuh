// Device building blocks of the resolve kernel (resolve_kernel.cu): an open-addressing hash of
// int32 positions in shared memory, a four-element vector load, and ranks of flags within a warp
// and across the warps of a block.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace sparsekv::resolve {

inline constexpr int32_t kEmptyCell = -1;  // hash cell without a key (valid positions are >= 0)

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

// found[j] = the cell holding position[j], or -1 (also where look[j] is false). The kN probe
// sequences advance together, so that their shared-memory loads overlap: a round costs one load
// latency, and the lookups take as many rounds as the longest sequence, not the sum.
template <int kN>
__device__ __forceinline__ void HashFind(const int32_t* keys, int32_t bits,
                                         const int32_t (&position)[kN], const bool (&look)[kN],
                                         int32_t (&found)[kN]) {
  const int32_t mask = (1 << bits) - 1;
  int32_t cell[kN];
  bool pending[kN];
  bool any = false;
#pragma unroll
  for (int j = 0; j < kN; ++j) {
    found[j] = -1;
    cell[j] = HashCell(position[j], bits);
    pending[j] = look[j];
    any |= look[j];
  }
  while (any) {
    int32_t key[kN];
#pragma unroll
    for (int j = 0; j < kN; ++j) key[j] = pending[j] ? keys[cell[j]] : kEmptyCell;
    any = false;
#pragma unroll
    for (int j = 0; j < kN; ++j) {
      if (pending[j] && key[j] == position[j]) found[j] = cell[j];
      pending[j] = pending[j] && key[j] != position[j] && key[j] != kEmptyCell;
      cell[j] = (cell[j] + 1) & mask;
      any |= pending[j];
    }
  }
}

// out[j] = p[i + j] for j < 4, `fill` at or past n; one 16-byte load when all four are in range
// and aligned (the usual case: the row starts are multiples of 16 bytes when C is a multiple of 4).
__device__ __forceinline__ void Load4(const int32_t* p, int32_t i, int32_t n, int32_t fill,
                                      int32_t (&out)[4]) {
  if (i + 3 < n && reinterpret_cast<uintptr_t>(p + i) % 16 == 0) {
    const int4 q = *reinterpret_cast<const int4*>(p + i);
    out[0] = q.x;
    out[1] = q.y;
    out[2] = q.z;
    out[3] = q.w;
  } else {
#pragma unroll
    for (int j = 0; j < 4; ++j) out[j] = i + j < n ? p[i + j] : fill;
  }
}

// Ranks the set flags (0 or 1) of a blocked arrangement within the calling warp: rank[j] = set
// flags before item j of this thread in the warp's order. Returns the warp's total.
template <int kN>
__device__ __forceinline__ int32_t WarpRank(const int32_t (&flag)[kN], int32_t (&rank)[kN]) {
  const uint32_t lanes_before = (1u << (threadIdx.x % 32)) - 1;
  int32_t before = 0;
  int32_t total = 0;
#pragma unroll
  for (int j = 0; j < kN; ++j) {
    const uint32_t set = __ballot_sync(0xffffffffu, flag[j] != 0);
    before += __popc(set & lanes_before);
    total += __popc(set);
  }
#pragma unroll
  for (int j = 0; j < kN; ++j) {
    rank[j] = before;
    before += flag[j];
  }
  return total;
}

// After a barrier that follows the per-warp totals `warp_total[blockDim.x / 32]`: the totals of the
// warps before the calling one, and (in *all) of every warp.
__device__ __forceinline__ int32_t WarpOffset(const int32_t* warp_total, int32_t* all) {
  const int32_t lane = threadIdx.x % 32;
  const int32_t mine = warp_total[lane];
  *all = __reduce_add_sync(0xffffffffu, mine);
  return __reduce_add_sync(0xffffffffu, lane < static_cast<int32_t>(threadIdx.x / 32) ? mine : 0);
}

}  // namespace sparsekv::resolve
