// Built when the library is compiled without CUDA: the GPU operators are unavailable (the CPU
// reference, in reference.cc, is always built). Bad arguments are refused first, as the CUDA
// build does, so that a caller sees the same InvalidArgument on every build.
#include <memory>

#include "sparsekv/attention.h"
#include "sparsekv/model_proxy.h"

namespace sparsekv {

StatusOr<std::unique_ptr<SparseMLAAttention>> SparseMLAAttention::Create(
    const SparseMLAOptions& options, int) {
  SPARSEKV_RETURN_IF_ERROR(ValidateSparseMLAOptions(options));
  return Unavailable("sparsekv was built without CUDA: SparseMLAAttention is unavailable");
}

StatusOr<std::unique_ptr<SparseEntryAttention>> SparseEntryAttention::Create(
    const SparseEntryAttentionOptions&, int) {
  return Unavailable("sparsekv was built without CUDA: SparseEntryAttention is unavailable");
}

StatusOr<std::unique_ptr<WeightStreamProxy>> WeightStreamProxy::Create(int32_t max_batch,
                                                                       int64_t bytes_per_layer,
                                                                       int32_t num_buffers, int) {
  if (max_batch < 1 || bytes_per_layer < 1 || num_buffers < 1) {
    return InvalidArgument(
        "WeightStreamProxy: max_batch, bytes_per_layer and num_buffers must be >= 1");
  }
  return Unavailable("sparsekv was built without CUDA: WeightStreamProxy is unavailable");
}

}  // namespace sparsekv
