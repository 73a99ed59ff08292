// Assemble: out[b, k] = hot[slots[b, k]] for b < *batch_size, zero rows for skipped entries.
//
// The same persistent row gather as IndexCopy (design at the top of row_gather.cuh), over the
// max_batch * top_k entries of the slot table: the grid is sized from that bound, and every thread
// exits once its rows run past *batch_size * top_k. Entry i's destination is simply row i of out.
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/kernels.h"
#include "cuda/row_gather.cuh"

namespace sparsekv {
namespace {

using row_gather::kMinBlocksPerSm;
using row_gather::kThreads;

// Entry i of an AssembleView: hot row slots[i] into out row i; no source (zero-fill) when the slot
// is kNullSlot or outside the hot rows.
struct AssembleRows {
  using Entry = int32_t;  // slots[i]

  AssembleView view;

  __device__ __forceinline__ Entry Load(int64_t i) const { return __ldg(view.slots + i); }

  template <typename V>
  __device__ __forceinline__ bool Locate(int64_t i, Entry slot, const V*& src, V*& dst) const {
    const bool resident = slot >= 0 && slot < view.hot_rows;
    src = resident ? reinterpret_cast<const V*>(view.hot + slot * view.stride) : nullptr;
    dst = reinterpret_cast<V*>(view.out + i * view.stride);
    return true;
  }
};

template <int kVecBytes>
__global__ void __launch_bounds__(kThreads, kMinBlocksPerSm)
    AssembleKernel(const AssembleView view, int32_t max_batch) {
  const int64_t rows = static_cast<int64_t>(min(max(*view.batch_size, 0), max_batch)) * view.top_k;
  row_gather::GatherRows<kVecBytes>(AssembleRows{view}, rows, view.row_bytes / kVecBytes);
}

}  // namespace

cudaError_t LaunchAssemble(const AssembleView& view, int32_t max_batch, cudaStream_t stream) {
  if (view.top_k < 0 || view.row_bytes < 1 || view.stride < view.row_bytes || view.hot_rows < 0 ||
      max_batch < 0) {
    return kUnsupported;
  }
  const int64_t capacity = static_cast<int64_t>(max_batch) * view.top_k;
  if (capacity == 0) return cudaSuccess;
  const int vec =
      row_gather::VectorBytes(view.hot, view.out, view.row_bytes, view.stride, view.stride);
  int blocks = 0;
  if (cudaError_t err = row_gather::GridBlocks(capacity, view.row_bytes / vec, 0, &blocks);
      err != cudaSuccess) {
    return err;
  }
  switch (vec) {
    case 16:
      AssembleKernel<16><<<blocks, kThreads, 0, stream>>>(view, max_batch);
      break;
    case 8:
      AssembleKernel<8><<<blocks, kThreads, 0, stream>>>(view, max_batch);
      break;
    case 4:
      AssembleKernel<4><<<blocks, kThreads, 0, stream>>>(view, max_batch);
      break;
    case 1:
      AssembleKernel<1><<<blocks, kThreads, 0, stream>>>(view, max_batch);
      break;
    default:
      return kUnsupported;
  }
  return cudaGetLastError();
}

}  // namespace sparsekv
