// IndexCopy ("UniDex"): dst[dst_index[i]] = src[src_index[i]] for i < min(*count, capacity).
//
// One persistent grid of row_gather::GatherRows (design at the top of row_gather.cuh): the number
// of entries is read on the device, so the grid is sized from the capacity and every thread exits
// once its rows run past *count. Invalid entries are counted per thread, summed per block, and
// added to *invalid with one atomic per block that found any.
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/kernels.h"
#include "cuda/row_gather.cuh"

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

template <int kVecBytes>
__global__ void __launch_bounds__(kThreads, kMinBlocksPerSm)
    IndexCopyKernel(const IndexCopyView view) {
  const int32_t n = min(max(*view.count, 0), view.capacity);
  const int32_t invalid =
      row_gather::GatherRows<kVecBytes>(IndexCopyRows{view}, n, view.row_bytes / kVecBytes);
  if (view.invalid == nullptr) return;

  __shared__ int32_t block_invalid;
  if (threadIdx.x == 0) block_invalid = 0;
  __syncthreads();
  const int32_t warp_invalid = __reduce_add_sync(0xffffffffu, invalid);
  if (threadIdx.x % 32 == 0 && warp_invalid != 0) atomicAdd(&block_invalid, warp_invalid);
  __syncthreads();
  if (threadIdx.x == 0 && block_invalid != 0) {
    atomicAdd(view.invalid, static_cast<unsigned long long>(block_invalid));
  }
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
  int blocks = 0;
  if (cudaError_t err =
          row_gather::GridBlocks(view.capacity, view.row_bytes / vec, view.max_blocks, &blocks);
      err != cudaSuccess) {
    return err;
  }
  switch (vec) {
    case 16:
      IndexCopyKernel<16><<<blocks, kThreads, 0, stream>>>(view);
      break;
    case 8:
      IndexCopyKernel<8><<<blocks, kThreads, 0, stream>>>(view);
      break;
    case 4:
      IndexCopyKernel<4><<<blocks, kThreads, 0, stream>>>(view);
      break;
    case 1:
      IndexCopyKernel<1><<<blocks, kThreads, 0, stream>>>(view);
      break;
    default:
      return kUnsupported;
  }
  return cudaGetLastError();
}

}  // namespace sparsekv
