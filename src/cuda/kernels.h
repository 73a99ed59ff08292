// Launchers of the CUDA backend's kernels (semantics in sparsekv/kernel_views.h).
//
// Each launcher is host code: it maps the view's runtime shape onto one kernel instantiation,
// enqueues it on `stream` and returns the launch status. None synchronises, allocates device memory
// or reads device memory, so all are legal inside CUDA graph capture. A shape no instantiation
// covers returns kUnsupported without launching anything.
#pragma once

#include <cuda_runtime.h>

#include "sparsekv/kernel_views.h"

namespace sparsekv {

// What every launcher returns for a shape no instantiation covers.
inline constexpr cudaError_t kUnsupported = cudaErrorInvalidValue;

// Unsupported: capacity < 0, row_bytes < 1, negative strides or row counts. view.strategy picks the
// kernel (CopyStrategy); one that does not apply to the view runs kLattice.
cudaError_t LaunchIndexCopy(const IndexCopyView& view, cudaStream_t stream);

// Unsupported: either view with what LaunchIndexCopy refuses (max_blocks and strategy aside,
// which it does not read).
cudaError_t LaunchIndexCopyPair(const IndexCopyPairView& view, cudaStream_t stream);

// Unsupported: top_k > kMaxResolveTopK, hot_slots outside [1, kMaxResolveHotSlots], window < 0,
// topk_stride < top_k, page_tokens < 1, a residency table with resident_page_rows < 1, a fused
// miss copy (copy_dst set) with copy_row_bytes outside [1, kMaxFusedCopyRowBytes] (kernel_views.h)
// or a negative copy stride or row count, or a shared-memory need above the device's limit.
inline constexpr int32_t kMaxResolveTopK = 4096;
inline constexpr int32_t kMaxResolveHotSlots = 65536;
static_assert(kMaxResolveHotSlots == kMaxHotSlots, "kernel_views.h states the kernels' limit");
cudaError_t LaunchResolve(const ResolveView& view, int32_t max_batch, cudaStream_t stream);

// Unsupported: top_k < 0, row_bytes < 1, stride < row_bytes, hot_rows < 0.
cudaError_t LaunchAssemble(const AssembleView& view, int32_t max_batch, cudaStream_t stream);

// Unsupported: places outside [1, kMaxRoutePlaces], page_rows < 1, capacity < 0 or pages < 0.
// Enqueues a memset of the counts before the kernel.
cudaError_t LaunchRouteRows(const RouteRowsView& view, cudaStream_t stream);

// Unsupported: what DenseAppendShapeOk (kernel_views.h) refuses, or max_batch < 0.
cudaError_t LaunchDenseAppend(const DenseAppendView& view, int32_t max_batch, cudaStream_t stream);

}  // namespace sparsekv
