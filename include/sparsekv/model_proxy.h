// WeightStreamProxy: a stand-in for the rest of a decode step's layer (everything but attention).
//
// At small batches a decode step is bound by streaming the model's weights from HBM, which is what
// makes a larger batch nearly free and offloading the KV cache pay. The end-to-end benchmark needs
// that cost without the model, so each layer runs one bf16 GEMM Y[B, n] = X[B, k] W^T whose weight
// W [n, k] (k = kProxyHiddenDim, the DeepSeek-V3 hidden size) has about `bytes_per_layer` bytes.
// This is a proxy: it reproduces the weight traffic and the GEMM shape of a step, not the model.
//
// Layer l uses weight buffer l % num_buffers. With num_buffers * bytes_per_layer above about twice
// the GPU's L2 cache (50 MB on an H200) consecutive layers read their weights from HBM, as real
// layers do; Create does not enforce that.
#pragma once

#include <cstdint>
#include <memory>

#include "sparsekv/backend.h"
#include "sparsekv/status.h"

namespace sparsekv {

inline constexpr int32_t kProxyHiddenDim = 7168;  // k: DeepSeek-V3's hidden size

class WeightStreamProxy {
 public:
  // Allocates num_buffers weight matrices of n x 7168 bf16, with n = bytes_per_layer / (2 * 7168)
  // rounded to a multiple of 64 (at least 64), and fills them, and the input, with pseudo-random
  // values (never zeros, which can run faster than real data). Synchronises once, before returning.
  // Unavailable without CUDA or without `device`; InvalidArgument for max_batch < 1,
  // bytes_per_layer < 1 or num_buffers < 1; Internal for a failing CUDA or cuBLAS call.
  static StatusOr<std::unique_ptr<WeightStreamProxy>> Create(int32_t max_batch,
                                                             int64_t bytes_per_layer,
                                                             int32_t num_buffers = 2,
                                                             int device = 0);
  virtual ~WeightStreamProxy() = default;

  // Enqueues output[0:batch] = input[0:batch] * W(layer % num_buffers)^T on `stream`. Never
  // allocates or synchronises (graph-capturable). InvalidArgument for batch outside
  // [0, max_batch] or layer < 0; batch 0 enqueues nothing.
  // Thread safety: runs share the output buffer; runs on different streams must not overlap.
  virtual Status Run(int32_t batch, int32_t layer, StreamHandle stream) = 0;

  // As SparseMLAAttention::SetSmCountTarget: the SMs cuBLAS plans the GEMM for; 0: all.
  virtual Status SetSmCountTarget(int32_t sms) = 0;

  // Weight bytes one Run streams: out_features() * in_features() * 2.
  virtual int64_t bytes_per_layer() const = 0;
  // Device bytes held: all weight buffers plus input and output.
  virtual int64_t device_bytes() const = 0;
  int32_t in_features() const { return kProxyHiddenDim; }
  virtual int32_t out_features() const = 0;
  // [max_batch, in_features()] bf16, device memory. Random at creation; callers may overwrite it.
  virtual void* input() const = 0;
  // [max_batch, out_features()] bf16, device memory: the last Run's result.
  virtual const void* output() const = 0;
};

}  // namespace sparsekv
