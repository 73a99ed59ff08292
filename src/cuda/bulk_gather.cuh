// A row gather through Hopper's bulk copy engine (cp.async.bulk), behind IndexCopy's kBulk: rows
// are staged in shared memory, so that the bytes in flight cost shared memory rather than
// registers.
//
// Each warp works alone, on batches of G = StageRows(row_bytes) rows: lane u copies row u of a
// batch. The warp's shared memory holds two stages of G rows and one mbarrier per stage. Batch b
// goes to stage s = b % 2; in the warp's iteration b:
//   1. each lane waits until its own bulk store of batch b - 2 (stage s) has read the stage
//      (cp.async.bulk.wait_group.read 0: the bulk-group state is per thread, and the lane that
//      stores a row is the lane that next loads into its place);
//   2. lane 0 arms stage s's mbarrier with the batch's byte count (arrive.expect_tx); after a
//      __syncwarp, each lane with a valid row issues its row's bulk load host -> shared, completing
//      on that mbarrier;
//   3. every lane waits for stage s ^ 1's mbarrier (batch b - 1 has landed), then each lane with a
//      row in it issues the bulk store shared -> destination and commits a bulk group.
// So one batch loads while the previous one is stored, and no barrier spans more than the warp.
// Each mbarrier expects one arrival per phase (lane 0's, in step 2); a phase completes when that
// arrival and all of the batch's bytes are in. Step 3's waiter tracks the phase parity. An
// mbarrier is re-armed (step 2 of iteration b + 2) only after its phase was waited for (step 3 of
// iteration b + 1). Before leaving, each lane waits for its bulk stores to complete.
// The bulk copies need 16-B aligned addresses and sizes (row_bytes, the strides and both bases).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "cuda/row_gather.cuh"

namespace sparsekv::bulk_gather {

inline constexpr int kThreads = 256;
inline constexpr int kWarps = kThreads / 32;
// Bytes of rows per warp and stage: two stages of 8 warps take about 110 KB, so that two blocks
// share an SM (the H200 gives a block up to 227 KB).
inline constexpr int32_t kStageBytes = 7168;
// The longest row staged; longer rows are gathered without the bulk copy engine.
inline constexpr int32_t kMaxRowBytes = 4096;
// Shared memory before the rows: two 8-byte mbarriers per warp.
inline constexpr int32_t kBarrierBytes = kWarps * 2 * 8;

// Rows per batch (G) for rows of `row_bytes` <= kMaxRowBytes: at most 32, one per lane.
__host__ __device__ constexpr int32_t StageRows(int32_t row_bytes) {
  const int32_t rows = kStageBytes / row_bytes;
  return rows < 1 ? 1 : rows > 32 ? 32 : rows;
}

// Dynamic shared memory of one block.
__host__ __device__ constexpr int32_t SmemBytes(int32_t row_bytes) {
  return kBarrierBytes + kWarps * 2 * StageRows(row_bytes) * row_bytes;
}

// Whether a copy of these rows can go through the bulk copy engine (with 16-B accesses, `vec` of
// row_gather::VectorBytes is 16).
inline bool Applies(int vec, int32_t row_bytes) { return vec == 16 && row_bytes <= kMaxRowBytes; }

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900

__device__ __forceinline__ uint32_t SharedAddress(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void InitBarrier(uint64_t* bar, uint32_t arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(SharedAddress(bar)), "r"(arrivals)
               : "memory");
}

// Makes initialised mbarriers visible to the bulk copy engine (the async proxy).
__device__ __forceinline__ void FenceBarrierInit() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

// One arrival that also expects `bytes` more bytes of transactions in the current phase.
__device__ __forceinline__ void ArriveExpectBytes(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(SharedAddress(bar)),
               "r"(bytes)
               : "memory");
}

__device__ __forceinline__ void WaitPhase(uint64_t* bar, uint32_t parity) {
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n"
        "}\n"
        : "=r"(done)
        : "r"(SharedAddress(bar)), "r"(parity)
        : "memory");
  } while (done == 0);
}

// global (device or host memory) -> shared, completing `bytes` transactions on `bar`.
__device__ __forceinline__ void LoadBulk(void* smem, const void* src, uint32_t bytes,
                                         uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::
          "r"(SharedAddress(smem)),
      "l"(src), "r"(bytes), "r"(SharedAddress(bar))
      : "memory");
}

// shared -> global, in the calling thread's current bulk group.
__device__ __forceinline__ void StoreBulk(void* dst, const void* smem, uint32_t bytes) {
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(dst),
               "r"(SharedAddress(smem)), "r"(bytes)
               : "memory");
}

__device__ __forceinline__ void CommitBulkGroup() {
  asm volatile("cp.async.bulk.commit_group;" ::: "memory");
}

// Waits until the calling thread's committed bulk groups have read their shared memory.
__device__ __forceinline__ void WaitBulkReads() {
  asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
}

// Waits until the calling thread's committed bulk groups are complete.
__device__ __forceinline__ void WaitBulkDone() {
  asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
}

// Orders what the async proxy wrote to shared memory (a landed load, seen through its mbarrier)
// before the async-proxy read of the store that follows.
__device__ __forceinline__ void FenceAsyncShared() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

#endif  // __CUDA_ARCH__ >= 900

// Copies rows [0, n) of `rows` (row_gather::GatherRows' interface, with Locate giving both
// pointers or neither) with every warp of the grid, as described at the top; `smem` is the block's
// SmemBytes(row_bytes) of dynamic shared memory, 16-B aligned. Returns the invalid entries this
// thread counted (each entry is counted once grid-wide). Compiled for an architecture before
// sm_90, it runs row_gather::GatherRows instead.
// REQUIRES: blockDim.x == kThreads; row_bytes <= kMaxRowBytes, and it, both bases and both
// strides are multiples of 16; the destination of one row is no other row's source.
template <typename Rows>
__device__ __forceinline__ int32_t GatherRows(const Rows& rows, int64_t n, int32_t row_bytes,
                                              std::byte* smem) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const int32_t lane = threadIdx.x % 32;
  const int32_t warp = threadIdx.x / 32;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kWarps;
  const int32_t g = StageRows(row_bytes);
  uint64_t* const bar = reinterpret_cast<uint64_t*>(smem) + warp * 2;
  std::byte* const stage_base =
      smem + kBarrierBytes + static_cast<int64_t>(warp) * 2 * g * row_bytes;
  // This lane's row in stage s (no arrays indexed by s: they would live in local memory).
  const auto slot = [&](int stage) { return stage_base + (stage * g + lane) * row_bytes; };
  if (lane == 0) {
    InitBarrier(&bar[0], 1);
    InitBarrier(&bar[1], 1);
    FenceBarrierInit();
  }
  __syncwarp();

  int32_t invalid = 0;
  uint32_t parity = 0;  // bit s: the parity of stage s's next phase to wait for
  int s = 0;
  std::byte* pending_dst = nullptr;  // this lane's destination in the batch of stage s ^ 1
  bool pending = false;              // whether stage s ^ 1 holds a batch (the warp's, uniform)
  for (int64_t first = (static_cast<int64_t>(blockIdx.x) * kWarps + warp) * g;;
       first += warps * g) {
    const bool more = first < n;  // the warp's
    std::byte* dst = nullptr;
    if (more) {
      WaitBulkReads();  // step 1
      const int64_t i = first + lane;
      const uint4* src = nullptr;
      uint4* dst4 = nullptr;
      if (lane < g && i < n) invalid += rows.Locate(i, rows.Load(i), src, dst4) ? 0 : 1;
      const bool copies = src != nullptr && dst4 != nullptr;
      const uint32_t loading = __ballot_sync(0xffffffffu, copies);
      if (lane == 0) ArriveExpectBytes(&bar[s], __popc(loading) * static_cast<uint32_t>(row_bytes));
      __syncwarp();  // the stage is armed before any of its bytes can land
      if (copies) {
        LoadBulk(slot(s), src, row_bytes, &bar[s]);
        dst = reinterpret_cast<std::byte*>(dst4);
      }
    }
    if (pending) {  // step 3
      WaitPhase(&bar[s ^ 1], parity >> (s ^ 1) & 1u);
      parity ^= 1u << (s ^ 1);
      if (pending_dst != nullptr) {
        FenceAsyncShared();
        StoreBulk(pending_dst, slot(s ^ 1), row_bytes);
      }
      CommitBulkGroup();
    }
    if (!more) break;
    pending_dst = dst;
    pending = true;
    s ^= 1;
  }
  WaitBulkDone();
  return invalid;
#else
  (void)smem;
  return row_gather::GatherRows<16>(rows, n, row_bytes / 16);
#endif
}

}  // namespace sparsekv::bulk_gather
