// The row gather behind IndexCopy and Assemble: whole rows, chosen by index, copied between any two
// of pinned host memory (read or written by the SMs over UVA) and device memory.
//
// Work decomposition. A row of `row_bytes` is `chunks` vectors of kVecBytes (16 when every address
// is 16-B aligned: 656 B = 41 chunks, 1152 B = 72). The grid is persistent (sized once from the
// capacity and the SM count, since the row count is only known on the device) and its T threads
// form a fixed lattice: `lanes = min(chunks, T)` consecutive threads share a row, one chunk each,
// and the T / lanes groups of them stride over the rows. Hence
//   * no lane idles on a ragged row (a warp per 41-chunk row leaves 23 of 64 lanes idle), and a
//     warp's 32 accesses are contiguous runs within at most two rows once rows have >= 32 chunks;
//   * there is no division per element: a thread's chunk is fixed, only its row advances;
//   * each thread resolves kRowsInFlight rows (kUnroll = 4 by default), issues all of their loads,
//     then all of their stores, so every thread keeps that many independent reads in flight. A
//     read of pinned host memory takes on the order of a microsecond, so ~55 GB/s needs ~100 KB in
//     flight: a few thousand threads with four 16-B reads each; the resident grid (4 x 256
//     threads per SM) has ample margin.
// Rows far longer than the grid (chunks > T) fall out of the same loop: lanes = T and each thread
// walks several chunks of the row.
// WarpCopyRows (below) is the other decomposition: a warp per batch of whole rows, used by
// IndexCopy's kWarpRows and by Resolve's fused miss copy.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

namespace sparsekv::row_gather {

// Threads per block, and the blocks per SM guaranteed by __launch_bounds__ (<= 64 registers).
inline constexpr int kThreads = 256;
inline constexpr int kMinBlocksPerSm = 4;
// Rows a thread has in flight (GatherRows' default).
inline constexpr int kUnroll = 4;

// The access unit: kVecBytes bytes, naturally aligned.
template <int kVecBytes>
struct Vec;
template <>
struct Vec<16> {
  using Type = uint4;
};
template <>
struct Vec<8> {
  using Type = uint2;
};
template <>
struct Vec<4> {
  using Type = unsigned int;
};
template <>
struct Vec<1> {
  using Type = unsigned char;
};

// The widest access (16, 8, 4 or 1 bytes) that divides every address the gather forms.
inline int VectorBytes(const void* a, const void* b, int64_t row_bytes, int64_t stride_a,
                       int64_t stride_b) {
  const uint64_t bits = reinterpret_cast<uintptr_t>(a) | reinterpret_cast<uintptr_t>(b) |
                        static_cast<uint64_t>(row_bytes) | static_cast<uint64_t>(stride_a) |
                        static_cast<uint64_t>(stride_b);
  for (int vec : {16, 8, 4}) {
    if (bits % vec == 0) return vec;
  }
  return 1;
}

// `wanted` blocks, capped at what the current device holds resident at once (blocks_per_sm per
// SM) and, when max_blocks > 0, at max_blocks (a copy that runs beside other kernels and leaves
// them the rest of the SMs); at least 1.
inline cudaError_t CappedBlocks(int64_t wanted, int max_blocks, int blocks_per_sm, int* blocks) {
  int device = 0;
  int sms = 0;
  if (cudaError_t err = cudaGetDevice(&device); err != cudaSuccess) return err;
  if (cudaError_t err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
      err != cudaSuccess) {
    return err;
  }
  const int64_t resident = static_cast<int64_t>(sms) * blocks_per_sm;
  const int64_t limit = max_blocks > 0 ? std::min<int64_t>(max_blocks, resident) : resident;
  *blocks = static_cast<int>(std::clamp<int64_t>(wanted, 1, limit));
  return cudaSuccess;
}

// Blocks of kThreads for `rows` rows of `chunks` chunks: one thread per (row, chunk) pair, capped
// as CappedBlocks does.
inline cudaError_t GridBlocks(int64_t rows, int64_t chunks, int max_blocks, int* blocks,
                              int blocks_per_sm = kMinBlocksPerSm) {
  return CappedBlocks((rows * chunks + kThreads - 1) / kThreads, max_blocks, blocks_per_sm, blocks);
}

// Copies rows [0, n). For row i, `rows.Load(i)` reads its indices (an Entry) and
// `rows.Locate(i, entry, src, dst)` sets the source row (nullptr: zero-fill) and the destination
// row (nullptr: skip the row) and returns false for an entry that counts as invalid. Returns how
// many invalid entries this thread counted; grid-wide, each is counted exactly once (by the thread
// holding chunk 0 of its row). Each thread has kRowsInFlight rows in flight.
// REQUIRES: the destination of one row is no other row's source (all loads of a batch of
// kRowsInFlight rows are issued before their stores, by many threads at once).
template <int kVecBytes, int kRowsInFlight = kUnroll, typename Rows>
__device__ __forceinline__ int32_t GatherRows(const Rows& rows, int64_t n, int64_t chunks) {
  using V = typename Vec<kVecBytes>::Type;
  const int64_t threads = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t lanes = chunks < threads ? chunks : threads;
  const int64_t row_step = threads / lanes;
  const int64_t first_chunk = t % lanes;
  // Threads past the last full group of `lanes` have no row.
  const int64_t first_row = t < row_step * lanes ? t / lanes : n;
  int32_t invalid = 0;
  for (int64_t row0 = first_row; row0 < n; row0 += kRowsInFlight * row_step) {
    // All index loads first, unconditionally (rows past n read row0's), so that they issue back to
    // back; the rows past n are dropped afterwards.
    typename Rows::Entry entry[kRowsInFlight];
#pragma unroll
    for (int u = 0; u < kRowsInFlight; ++u) {
      const int64_t i = row0 + u * row_step;
      entry[u] = rows.Load(i < n ? i : row0);
    }
    const V* src[kRowsInFlight];
    V* dst[kRowsInFlight];
#pragma unroll
    for (int u = 0; u < kRowsInFlight; ++u) {
      const int64_t i = row0 + u * row_step;
      const bool valid = rows.Locate(i, entry[u], src[u], dst[u]);
      if (i >= n) {
        src[u] = nullptr;
        dst[u] = nullptr;
      } else if (!valid && first_chunk == 0) {
        ++invalid;
      }
    }
    for (int64_t c = first_chunk; c < chunks; c += lanes) {
      V v[kRowsInFlight];
#pragma unroll
      for (int u = 0; u < kRowsInFlight; ++u) {
        // Streaming loads: every source byte is read once.
        v[u] = src[u] != nullptr ? __ldcs(src[u] + c) : V{};
      }
#pragma unroll
      for (int u = 0; u < kRowsInFlight; ++u) {
        if (dst[u] != nullptr) dst[u][c] = v[u];
      }
    }
  }
  return invalid;
}

// Copies rows [first, first + count) of `rows` (the interface of GatherRows), count <= 32, with the
// calling warp, which must be converged and call it with the same arguments in every lane. Lane u
// reads row first + u's indices; the batch's count * chunks chunks are then taken in order (row by
// row), lane l taking chunks l, l + 32, l + 64, ..., kLoads at a time: all kLoads loads are issued
// before their stores. A row's pointers reach the lanes that copy it by shuffles, so a warp's 32
// accesses are consecutive chunks of at most two or three rows and no lane idles on a ragged row.
// Returns the invalid entries among the rows this lane read the indices of (each row is counted
// by one lane).
// REQUIRES: as GatherRows.
template <int kVecBytes, int kLoads, typename Rows>
__device__ __forceinline__ int32_t WarpCopyRows(const Rows& rows, int64_t first, int32_t count,
                                                int32_t chunks) {
  using V = typename Vec<kVecBytes>::Type;
  const int32_t lane = threadIdx.x % 32;
  const V* my_src = nullptr;
  V* my_dst = nullptr;
  int32_t invalid = 0;
  if (lane < count) {
    const int64_t i = first + lane;
    invalid = rows.Locate(i, rows.Load(i), my_src, my_dst) ? 0 : 1;
  }
  const int32_t items = count * chunks;
  // This lane's next chunk f = lane + 32 * t as (row, chunk); each step adds 32 chunks.
  int32_t row = lane / chunks;
  int32_t chunk = lane % chunks;
  const int32_t step_rows = 32 / chunks;
  const int32_t step_chunks = 32 % chunks;
  // The loop bound is the warp's, not the lane's: every lane takes part in every shuffle.
  for (int32_t round = 0; round < items; round += 32 * kLoads) {
    const V* src[kLoads];
    V* dst[kLoads];
    int32_t at[kLoads];
#pragma unroll
    for (int u = 0; u < kLoads; ++u) {
      const bool in_batch = round + 32 * u + lane < items;
      const int32_t from = in_batch ? row : 0;
      src[u] = reinterpret_cast<const V*>(
          __shfl_sync(0xffffffffu, reinterpret_cast<uintptr_t>(my_src), from));
      dst[u] =
          reinterpret_cast<V*>(__shfl_sync(0xffffffffu, reinterpret_cast<uintptr_t>(my_dst), from));
      if (!in_batch) {
        src[u] = nullptr;
        dst[u] = nullptr;
      }
      at[u] = chunk;
      row += step_rows;
      chunk += step_chunks;
      if (chunk >= chunks) {
        chunk -= chunks;
        ++row;
      }
    }
    V v[kLoads];
#pragma unroll
    for (int u = 0; u < kLoads; ++u) v[u] = src[u] != nullptr ? __ldcs(src[u] + at[u]) : V{};
#pragma unroll
    for (int u = 0; u < kLoads; ++u) {
      if (dst[u] != nullptr) dst[u][at[u]] = v[u];
    }
  }
  return invalid;
}

// Rows per warp batch when `warps` warps share n rows: as many as spread them over every warp, at
// most 32 (one row's indices per lane), at least 1.
__device__ __forceinline__ int32_t WarpBatchRows(int64_t n, int64_t warps) {
  const int64_t per_warp = (n + warps - 1) / warps;
  return static_cast<int32_t>(per_warp < 1 ? 1 : per_warp > 32 ? 32 : per_warp);
}

}  // namespace sparsekv::row_gather
