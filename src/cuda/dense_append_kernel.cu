// DenseAppend: the step's entry and raw window row of one layer into each request's pages and
// ring (semantics in kernel_views.h).
//
// One block per batch row of max_batch; a block past *batch_size, or whose row is unused, exits
// at once, so the launch is sized from max_batch alone and a captured graph stays valid whatever
// the batch and whichever rows complete an entry. A block's threads copy the row's bytes in
// 16-B chunks when every address and the row size allow it, else byte by byte. Rows are a few
// hundred bytes and at most two per batch row: this kernel is latency, not bandwidth.
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/kernels.h"

namespace sparsekv {
namespace {

constexpr int kThreads = 64;

__device__ __forceinline__ void CopyRow(std::byte* dst, const std::byte* src, int32_t bytes) {
  const bool wide = ((reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src) |
                      static_cast<uintptr_t>(bytes)) &
                     15) == 0;
  if (wide) {
    for (int32_t i = threadIdx.x; i < bytes / 16; i += blockDim.x) {
      reinterpret_cast<uint4*>(dst)[i] = reinterpret_cast<const uint4*>(src)[i];
    }
  } else {
    for (int32_t i = threadIdx.x; i < bytes; i += blockDim.x) dst[i] = src[i];
  }
}

__global__ void __launch_bounds__(kThreads) DenseAppendKernel(const DenseAppendView v) {
  const int32_t b = blockIdx.x;
  if (b >= *v.batch_size) return;
  bool skipped = false;
  if (std::byte* dst = v.EntryDestination(b, &skipped)) {
    CopyRow(dst, v.entry_rows + b * v.entry_stride, v.row_bytes);
  }
  if (skipped && v.invalid != nullptr && threadIdx.x == 0) atomicAdd(v.invalid, 1ull);
  if (std::byte* dst = v.WindowDestination(b, &skipped)) {
    CopyRow(dst, v.window_rows + b * v.window_stride, v.row_bytes);
  }
  if (skipped && v.invalid != nullptr && threadIdx.x == 0) atomicAdd(v.invalid, 1ull);
}

}  // namespace

cudaError_t LaunchDenseAppend(const DenseAppendView& view, int32_t max_batch, cudaStream_t stream) {
  if (!DenseAppendShapeOk(view) || max_batch < 0) return kUnsupported;
  if (max_batch == 0) return cudaSuccess;
  DenseAppendKernel<<<max_batch, kThreads, 0, stream>>>(view);
  return cudaGetLastError();
}

}  // namespace sparsekv
