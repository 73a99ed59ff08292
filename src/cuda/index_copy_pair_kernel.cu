// IndexCopyPair: two IndexCopys in one launch (semantics in kernel_views.h), for a step's append
// of its new rows and their indexer keys.
//
// The lists are short (one entry per batch row, read on the device up to *count), so the kernel is
// latency, not bandwidth: block i copies entry i of both views (a grid-stride loop past the grid),
// its threads over the row's bytes in the widest access that every address of that view allows
// (16, 4 or 1 bytes). The grid is sized from the capacities alone, so a captured graph stays valid
// whatever the count.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "cuda/kernels.h"

namespace sparsekv {
namespace {

constexpr int kThreads = 64;
// Blocks of the grid-stride loop: more entries than this share blocks.
constexpr int32_t kMaxBlocks = 1024;

// The widest access (16, 4 or 1 bytes) dividing every address a copy of `v` forms.
__device__ __forceinline__ int32_t AccessBytes(const IndexCopyView& v) {
  const uint64_t bits = reinterpret_cast<uintptr_t>(v.src) | reinterpret_cast<uintptr_t>(v.dst) |
                        static_cast<uint64_t>(v.row_bytes) | static_cast<uint64_t>(v.src_stride) |
                        static_cast<uint64_t>(v.dst_stride);
  return bits % 16 == 0 ? 16 : bits % 4 == 0 ? 4 : 1;
}

// Entry i of `v`, copied by the calling block (every thread calls it); an invalid entry is counted
// once, by thread 0.
__device__ __forceinline__ void CopyEntry(const IndexCopyView& v, int32_t i, int32_t access) {
  const int64_t s = v.src_index[i];
  const int64_t d = v.dst_index[i];
  if (s < 0 || s >= v.src_rows || d < 0 || d >= v.dst_rows) {
    if (v.invalid != nullptr && threadIdx.x == 0) atomicAdd(v.invalid, 1ull);
    return;
  }
  const std::byte* src = v.src + s * v.src_stride;
  std::byte* dst = v.dst + d * v.dst_stride;
  if (access == 16) {
    for (int32_t c = threadIdx.x; c < v.row_bytes / 16; c += blockDim.x) {
      reinterpret_cast<uint4*>(dst)[c] = reinterpret_cast<const uint4*>(src)[c];
    }
  } else if (access == 4) {
    for (int32_t c = threadIdx.x; c < v.row_bytes / 4; c += blockDim.x) {
      reinterpret_cast<uint32_t*>(dst)[c] = reinterpret_cast<const uint32_t*>(src)[c];
    }
  } else {
    for (int32_t c = threadIdx.x; c < v.row_bytes; c += blockDim.x) dst[c] = src[c];
  }
}

__device__ __forceinline__ int32_t Entries(const IndexCopyView& v) {
  return min(max(*v.count, 0), v.capacity);
}

__global__ void __launch_bounds__(kThreads) IndexCopyPairKernel(const IndexCopyPairView v) {
  const int32_t n_first = Entries(v.first);
  const int32_t n_second = Entries(v.second);
  const int32_t first_access = AccessBytes(v.first);
  const int32_t second_access = AccessBytes(v.second);
  for (int32_t i = blockIdx.x; i < max(n_first, n_second); i += gridDim.x) {
    if (i < n_first) CopyEntry(v.first, i, first_access);
    if (i < n_second) CopyEntry(v.second, i, second_access);
  }
}

bool ShapeOk(const IndexCopyView& v) {
  return v.capacity >= 0 && v.row_bytes >= 1 && v.src_stride >= 0 && v.dst_stride >= 0 &&
         v.src_rows >= 0 && v.dst_rows >= 0;
}

}  // namespace

cudaError_t LaunchIndexCopyPair(const IndexCopyPairView& view, cudaStream_t stream) {
  if (!ShapeOk(view.first) || !ShapeOk(view.second)) return kUnsupported;
  const int32_t entries = std::max(view.first.capacity, view.second.capacity);
  if (entries == 0) return cudaSuccess;
  IndexCopyPairKernel<<<std::min(entries, kMaxBlocks), kThreads, 0, stream>>>(view);
  return cudaGetLastError();
}

}  // namespace sparsekv
