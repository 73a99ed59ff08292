// IndexCopy ("UniDex"): dst[dst_index[i]] = src[src_index[i]] for i < min(*count, capacity).
//
// The number of entries is read on the device, so every grid is persistent, sized from the
// capacity, and each thread exits once its rows run past *count. One kernel per CopyStrategy:
//   kLattice, kLatticeWide  row_gather::GatherRows (design at the top of row_gather.cuh) with 4 or
//                           8 rows in flight per thread; the wide one at 3 blocks per SM, so that
//                           its registers fit;
//   kWarpRows               row_gather::WarpCopyRows: each warp takes batches of whole rows, as
//                           many per batch as spread *count over every warp of the grid (<= 32);
//   kBulk                   bulk_gather::GatherRows (design at the top of bulk_gather.cuh), on
//                           devices of compute capability 9.0 and rows it applies to; kLattice
//                           otherwise.
// Invalid entries are counted per thread, summed per block, and added to *invalid with one atomic
// per block that found any.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "cuda/bulk_gather.cuh"
#include "cuda/kernels.h"
#include "cuda/row_gather.cuh"
#include "cuda_common/smem_limit.h"

namespace sparsekv {
namespace {

using row_gather::kMinBlocksPerSm;
using row_gather::kThreads;

// Entry i of an IndexCopyView as a (source row, destination row) pair; both null when invalid.
struct IndexCopyRows {
  using Entry = int2;  // (src_index[i], dst_index[i])

  IndexCopyView view;

  __device__ __forceinline__ Entry Load(int64_t i) const {
    return {__ldg(view.src_index + i), __ldg(view.dst_index + i)};
  }

  template <typename V>
  __device__ __forceinline__ bool Locate(int64_t, Entry e, const V*& src, V*& dst) const {
    const int64_t s = e.x;
    const int64_t d = e.y;
    const bool valid = s >= 0 && s < view.src_rows && d >= 0 && d < view.dst_rows;
    src = valid ? reinterpret_cast<const V*>(view.src + s * view.src_stride) : nullptr;
    dst = valid ? reinterpret_cast<V*>(view.dst + d * view.dst_stride) : nullptr;
    return valid;
  }
};

// Adds each thread's `invalid` to *invalid: one shared atomic per warp that found any, one global
// atomic per block that did. Called by every thread of the block.
__device__ __forceinline__ void AddInvalid(unsigned long long* total, int32_t invalid) {
  if (total == nullptr) return;
  __shared__ int32_t block_invalid;
  if (threadIdx.x == 0) block_invalid = 0;
  __syncthreads();
  const int32_t warp_invalid = __reduce_add_sync(0xffffffffu, invalid);
  if (threadIdx.x % 32 == 0 && warp_invalid != 0) atomicAdd(&block_invalid, warp_invalid);
  __syncthreads();
  if (threadIdx.x == 0 && block_invalid != 0) {
    atomicAdd(total, static_cast<unsigned long long>(block_invalid));
  }
}

__device__ __forceinline__ int32_t EntryCount(const IndexCopyView& view) {
  return min(max(*view.count, 0), view.capacity);
}

// Blocks per SM of the wide lattice: 8 rows in flight need more than 64 registers per thread.
constexpr int kWideBlocksPerSm = 3;

template <int kVecBytes>
__global__ void __launch_bounds__(kThreads, kMinBlocksPerSm)
    IndexCopyKernel(const IndexCopyView view) {
  const int32_t invalid = row_gather::GatherRows<kVecBytes>(IndexCopyRows{view}, EntryCount(view),
                                                            view.row_bytes / kVecBytes);
  AddInvalid(view.invalid, invalid);
}

template <int kVecBytes>
__global__ void __launch_bounds__(kThreads, kWideBlocksPerSm)
    IndexCopyWideKernel(const IndexCopyView view) {
  const int32_t invalid = row_gather::GatherRows<kVecBytes, 8>(
      IndexCopyRows{view}, EntryCount(view), view.row_bytes / kVecBytes);
  AddInvalid(view.invalid, invalid);
}

// Chunks in flight per lane of kWarpRows, and the longest row it takes (a batch of 32 rows counts
// its chunks in 32 bits); longer rows go to kLattice.
constexpr int kWarpLoads = 4;
constexpr int64_t kMaxWarpRowChunks = int64_t{1} << 24;

template <int kVecBytes>
__global__ void __launch_bounds__(kThreads, kMinBlocksPerSm)
    IndexCopyWarpKernel(const IndexCopyView view) {
  const int64_t n = EntryCount(view);
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (kThreads / 32);
  const int64_t warp = (static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x) / 32;
  const int32_t g = row_gather::WarpBatchRows(n, warps);
  const int32_t chunks = view.row_bytes / kVecBytes;
  int32_t invalid = 0;
  for (int64_t first = warp * g; first < n; first += warps * g) {
    const int32_t count = static_cast<int32_t>(min(static_cast<int64_t>(g), n - first));
    invalid +=
        row_gather::WarpCopyRows<kVecBytes, kWarpLoads>(IndexCopyRows{view}, first, count, chunks);
  }
  AddInvalid(view.invalid, invalid);
}

__global__ void __launch_bounds__(bulk_gather::kThreads)
    IndexCopyBulkKernel(const IndexCopyView view) {
  extern __shared__ int4 smem[];
  const int32_t invalid = bulk_gather::GatherRows(
      IndexCopyRows{view}, EntryCount(view), view.row_bytes, reinterpret_cast<std::byte*>(smem));
  AddInvalid(view.invalid, invalid);
}

// Launches kernel<vec> for the view's access width.
template <template <int> class Kernel>
cudaError_t LaunchForWidth(int vec, int blocks, const IndexCopyView& view, cudaStream_t stream) {
  switch (vec) {
    case 16:
      Kernel<16>::Launch(blocks, view, stream);
      break;
    case 8:
      Kernel<8>::Launch(blocks, view, stream);
      break;
    case 4:
      Kernel<4>::Launch(blocks, view, stream);
      break;
    case 1:
      Kernel<1>::Launch(blocks, view, stream);
      break;
    default:
      return kUnsupported;
  }
  return cudaGetLastError();
}

template <int kVecBytes>
struct Lattice {
  static void Launch(int blocks, const IndexCopyView& view, cudaStream_t stream) {
    IndexCopyKernel<kVecBytes><<<blocks, kThreads, 0, stream>>>(view);
  }
};
template <int kVecBytes>
struct LatticeWide {
  static void Launch(int blocks, const IndexCopyView& view, cudaStream_t stream) {
    IndexCopyWideKernel<kVecBytes><<<blocks, kThreads, 0, stream>>>(view);
  }
};
template <int kVecBytes>
struct WarpRows {
  static void Launch(int blocks, const IndexCopyView& view, cudaStream_t stream) {
    IndexCopyWarpKernel<kVecBytes><<<blocks, kThreads, 0, stream>>>(view);
  }
};

// Whether the current device has the bulk copy engine (compute capability 9.0 or later).
cudaError_t HasBulkCopy(bool* has) {
  int device = 0;
  int major = 0;
  if (cudaError_t err = cudaGetDevice(&device); err != cudaSuccess) return err;
  if (cudaError_t err = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
      err != cudaSuccess) {
    return err;
  }
  *has = major >= 9;
  return cudaSuccess;
}

cudaError_t LaunchBulk(const IndexCopyView& view, cudaStream_t stream) {
  const int32_t smem = bulk_gather::SmemBytes(view.row_bytes);
  int32_t limit = 0;
  if (cudaError_t err = cuda_common::OptInMaxDynamicSmem(
          reinterpret_cast<const void*>(IndexCopyBulkKernel), &limit);
      err != cudaSuccess) {
    return err;
  }
  if (smem > limit) return kUnsupported;
  int per_sm = 0;
  if (cudaError_t err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, IndexCopyBulkKernel,
                                                                      bulk_gather::kThreads, smem);
      err != cudaSuccess) {
    return err;
  }
  // A block takes kWarps batches of StageRows rows at a time.
  const int64_t rows_per_block =
      int64_t{bulk_gather::kWarps} * bulk_gather::StageRows(view.row_bytes);
  int blocks = 0;
  if (cudaError_t err =
          row_gather::CappedBlocks((view.capacity + rows_per_block - 1) / rows_per_block,
                                   view.max_blocks, std::max(per_sm, 1), &blocks);
      err != cudaSuccess) {
    return err;
  }
  IndexCopyBulkKernel<<<blocks, bulk_gather::kThreads, smem, stream>>>(view);
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchIndexCopy(const IndexCopyView& view, cudaStream_t stream) {
  if (view.capacity < 0 || view.row_bytes < 1 || view.src_stride < 0 || view.dst_stride < 0 ||
      view.src_rows < 0 || view.dst_rows < 0 || view.max_blocks < 0) {
    return kUnsupported;
  }
  if (view.capacity == 0) return cudaSuccess;
  const int vec =
      row_gather::VectorBytes(view.src, view.dst, view.row_bytes, view.src_stride, view.dst_stride);
  const int64_t chunks = view.row_bytes / vec;
  CopyStrategy strategy = view.strategy;
  if (strategy == CopyStrategy::kBulk) {
    bool has_bulk = false;
    if (cudaError_t err = HasBulkCopy(&has_bulk); err != cudaSuccess) return err;
    if (has_bulk && bulk_gather::Applies(vec, view.row_bytes)) return LaunchBulk(view, stream);
    strategy = CopyStrategy::kLattice;
  }
  // A warp batch counts its chunks in 32 bits.
  if (strategy == CopyStrategy::kWarpRows && chunks > kMaxWarpRowChunks) {
    strategy = CopyStrategy::kLattice;
  }
  int blocks = 0;
  switch (strategy) {
    case CopyStrategy::kLattice:
      if (cudaError_t err = row_gather::GridBlocks(view.capacity, chunks, view.max_blocks, &blocks);
          err != cudaSuccess) {
        return err;
      }
      return LaunchForWidth<Lattice>(vec, blocks, view, stream);
    case CopyStrategy::kLatticeWide:
      if (cudaError_t err = row_gather::GridBlocks(view.capacity, chunks, view.max_blocks, &blocks,
                                                   kWideBlocksPerSm);
          err != cudaSuccess) {
        return err;
      }
      return LaunchForWidth<LatticeWide>(vec, blocks, view, stream);
    case CopyStrategy::kWarpRows:
      // Up to a warp per row.
      if (cudaError_t err = row_gather::GridBlocks(view.capacity, 32, view.max_blocks, &blocks);
          err != cudaSuccess) {
        return err;
      }
      return LaunchForWidth<WarpRows>(vec, blocks, view, stream);
    default:
      return kUnsupported;
  }
}

}  // namespace sparsekv
