// RouteRows: splits an index list into one list per place of its source rows (kernel_views.h).
//
// One thread per entry over a grid-stride loop; each warp appends its entries place by place with
// one atomic per (warp, place) that has any (a ballot picks the lanes, their rank in the ballot is
// their offset), so a list keeps its input order within each warp's run of 32 entries. The counts
// are zeroed by a memset enqueued before the kernel.
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/kernels.h"
#include "cuda/row_gather.cuh"

namespace sparsekv {
namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads) RouteRowsKernel(const RouteRowsView view) {
  const int32_t n = min(max(*view.count, 0), view.capacity);
  const unsigned lane = threadIdx.x % 32;
  const unsigned lower_lanes = (1u << lane) - 1;
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  // Whole warps iterate together, so that every lane takes part in the ballots.
  for (int64_t base = int64_t{blockIdx.x} * blockDim.x + (threadIdx.x - lane); base < n;
       base += stride) {
    const int64_t i = base + lane;
    const bool active = i < n;
    int32_t place = -1;
    int32_t src = 0;
    int32_t dst = 0;
    if (active) {
      int64_t r = view.src_index[i];
      dst = view.dst_index[i];
      place = 0;
      if (r >= 0 && r < view.pages * view.page_rows) {
        const int64_t q = r / view.page_rows;
        const int32_t t = view.page_place[q];
        if (t >= 1 && t < view.places) {
          place = t;
          r = view.page_row[q] + r % view.page_rows;
        }
      }
      src = static_cast<int32_t>(r);
    }
    for (int32_t t = 0; t < view.places; ++t) {
      const unsigned members = __ballot_sync(0xffffffffu, place == t);
      if (members == 0) continue;
      int32_t first = 0;
      if (lane == static_cast<unsigned>(__ffs(members) - 1)) {
        first = atomicAdd(view.out_count + t, __popc(members));
        if (t > 0 && view.routed != nullptr) {
          atomicAdd(view.routed, static_cast<unsigned long long>(__popc(members)));
        }
      }
      first = __shfl_sync(0xffffffffu, first, __ffs(members) - 1);
      if (place == t) {
        const int64_t j = int64_t{t} * view.capacity + first + __popc(members & lower_lanes);
        view.out_src[j] = src;
        view.out_dst[j] = dst;
      }
    }
  }
}

}  // namespace

cudaError_t LaunchRouteRows(const RouteRowsView& view, cudaStream_t stream) {
  if (view.places < 1 || view.places > kMaxRoutePlaces || view.page_rows < 1 || view.capacity < 0 ||
      view.pages < 0) {
    return kUnsupported;
  }
  if (cudaError_t err = cudaMemsetAsync(view.out_count, 0, sizeof(int32_t) * view.places, stream);
      err != cudaSuccess) {
    return err;
  }
  if (view.capacity == 0) return cudaSuccess;
  // The grid is sized from the capacity (the count is read on the device), at most 4 blocks of
  // kThreads per SM.
  int blocks = 0;
  if (cudaError_t err = row_gather::CappedBlocks((int64_t{view.capacity} + kThreads - 1) / kThreads,
                                                 0, 4, &blocks);
      err != cudaSuccess) {
    return err;
  }
  RouteRowsKernel<<<blocks, kThreads, 0, stream>>>(view);
  return cudaGetLastError();
}

}  // namespace sparsekv
