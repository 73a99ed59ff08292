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

// Which entries a split-attention half covers (SparseMLAAttention::RunHits / RunFillsAndMerge).
enum class FillPart : int32_t {
  kAll = 0,    // every entry (no split)
  kHits = 1,   // entries with fill[r] == 0
  kFills = 2,  // entries with fill[r] == 1
};

// keys[r] = dequantised row indices[r] for every flat entry r = b * top_k + k of the batch; a zero
// row where indices[r] < 0. With part kHits, entries with fill 1 get zero rows too; with part
// kFills, only the entries with fill 1 are written (the others keep what kHits wrote).
struct GatherDequantView {
  const std::byte* kv_rows;  // [rows, row_stride] one layer; 16-B aligned
  int64_t row_stride;        // multiple of 16
  const int32_t* indices;    // [batch, top_k], < 0 = masked
  __nv_bfloat16* keys;       // [batch, top_k, 576]
  int32_t batch;
  int32_t top_k;
  const uint8_t* fill = nullptr;  // [batch, top_k]; read unless part is kAll
  FillPart part = FillPart::kAll;
};

// probs[b, h, k] = softmax over the unmasked k of exp2(scores[b, h, k]), 0 where indices[b, k] < 0
// or the entry is outside `part`; a row with no unmasked entry is all zeros. If lse is not null,
// lse[b, h] = log2 of the sum of exp2(scores) over the unmasked k (-inf for none).
struct MaskedSoftmaxView {
  const float* scores;     // [batch, heads, top_k], already scaled by softmax_scale * log2(e)
  const int32_t* indices;  // [batch, top_k], < 0 = masked
  __nv_bfloat16* probs;    // [batch, heads, top_k]
  int32_t batch;
  int32_t heads;
  int32_t top_k;
  const uint8_t* fill = nullptr;  // [batch, top_k]; read unless part is kAll
  FillPart part = FillPart::kAll;
  float* lse = nullptr;  // [batch, heads] or nullptr
};

// out[b, h, :] = (2^lse_a o_a + 2^lse_b o_b) / (2^lse_a + 2^lse_b) for b < batch, in bf16: two
// softmax-normalised partial attentions over disjoint entries merged into the attention over
// their union; zeros where both are empty (lse -inf).
struct MergeView {
  const float* out_a;  // [batch, heads, 512]
  const float* lse_a;  // [batch, heads]
  const float* out_b;
  const float* lse_b;
  __nv_bfloat16* out;  // [batch, heads, 512]
  int32_t batch;
  int32_t heads;
};

// Unsupported (cudaErrorInvalidValue): a misaligned row buffer or stride.
cudaError_t LaunchGatherDequant(KVRowFormat format, const GatherDequantView& view,
                                cudaStream_t stream);
cudaError_t LaunchMaskedSoftmax(const MaskedSoftmaxView& view, cudaStream_t stream);
cudaError_t LaunchMerge(const MergeView& view, cudaStream_t stream);

}  // namespace sparsekv::mla_cuda
