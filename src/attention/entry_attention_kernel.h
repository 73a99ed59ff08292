// The kernel of SparseEntryAttention (attention.h): DeepSeek-V4's decode attention over two scopes
// of entries with a per-head sink, fused in one launch.
//
// The launcher enqueues one kernel on `stream` and returns the launch status; it neither
// allocates, synchronises nor reads device memory on the host, so it is legal inside graph
// capture. The batch and the indexed scopes' widths are by-value fields: a captured graph replays
// them; a store scope's counts are read on the device by every launch.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "sparsekv/kernel_views.h"
#include "sparsekv/kv_format.h"

namespace sparsekv::mla_cuda {

// One scope of entries (AttentionScope's two forms). Indexed: entry k of request b is row
// indices[b * width + k]; < 0 = masked. Store (store.source set): request b's store.Count(b)
// entries at store.Row(b, k), read in place; rows, row_stride, indices and width are not read.
struct EntryScopeView {
  const std::byte* rows =
      nullptr;             // [rows, row_stride] entries of the scope's format, any alignment
  int64_t row_stride = 0;  // >= the format's row bytes
  const int32_t* indices = nullptr;  // [batch, width], < 0 = masked
  int32_t width = 0;                 // 0: the scope is empty (indexed form)
  StoreScopeView store = {StoreScopeView::kNone, 0, {}, {}};

  bool empty() const { return store.source == StoreScopeView::kNone && width == 0; }
};

// out[b, h, :] for b < batch: the softmax over both scopes' unmasked entries of
// softmax_scale * q[b, h, :] . key, times 1 / (1 + exp(sink[h] - lse)) if sink is not null; zeros
// where every entry is masked.
struct EntryAttentionView {
  const __nv_bfloat16* q = nullptr;  // [batch, heads, 512]
  EntryScopeView selected;
  EntryScopeView window;
  const float* sink = nullptr;   // [heads], or null: no sink
  __nv_bfloat16* out = nullptr;  // [batch, heads, 512]
  int32_t batch = 0;             // <= 65535 (the grid's y dimension)
  int32_t heads = 0;
  float softmax_scale = 0;  // the effective scale, > 0
};

// The formats are the scopes' (KVRowFormat::kFp8Entry584 or kMxfp4Entry368; an empty scope's is
// not read). cudaErrorInvalidValue for another format or a shape out of range.
cudaError_t LaunchEntryAttention(KVRowFormat selected_format, KVRowFormat window_format,
                                 const EntryAttentionView& view, cudaStream_t stream);

}  // namespace sparsekv::mla_cuda
