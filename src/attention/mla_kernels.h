// The custom kernels of sparse MLA attention (the GEMMs between them are cuBLAS calls).
//
// Each launcher enqueues one kernel on `stream` and returns the launch status; none allocates,
// synchronises or reads device memory on the host, so all are legal inside graph capture. The batch
// size is a by-value field: the grid is sized from it, and a captured graph replays that size.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "sparsekv/attention.h"

namespace sparsekv::mla_cuda {

// keys[r] = dequantised row indices[r] for every flat entry r = b * top_k + k of the batch; a zero
// row where indices[r] < 0.
struct GatherDequantView {
  const std::byte* kv_rows;  // [rows, row_stride] one layer; 16-B aligned
  int64_t row_stride;        // multiple of 16
  const int32_t* indices;    // [batch, top_k], < 0 = masked
  __nv_bfloat16* keys;       // [batch, top_k, 576]
  int32_t batch;
  int32_t top_k;
};

// probs[b, h, k] = softmax over the unmasked k of exp2(scores[b, h, k]), 0 where indices[b, k] < 0;
// a row with no unmasked entry is all zeros.
struct MaskedSoftmaxView {
  const float* scores;     // [batch, heads, top_k], already scaled by softmax_scale * log2(e)
  const int32_t* indices;  // [batch, top_k], < 0 = masked
  __nv_bfloat16* probs;    // [batch, heads, top_k]
  int32_t batch;
  int32_t heads;
  int32_t top_k;
};

// Unsupported (cudaErrorInvalidValue): a misaligned row buffer or stride.
cudaError_t LaunchGatherDequant(KVRowFormat format, const GatherDequantView& view,
                                cudaStream_t stream);
cudaError_t LaunchMaskedSoftmax(const MaskedSoftmaxView& view, cudaStream_t stream);

}  // namespace sparsekv::mla_cuda
