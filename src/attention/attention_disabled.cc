// Built when the library is compiled without CUDA: the GPU operators are unavailable (the CPU
// reference, in reference.cc, is always built).
#include <memory>

#include "sparsekv/attention.h"
#include "sparsekv/model_proxy.h"

namespace sparsekv {

StatusOr<std::unique_ptr<SparseMLAAttention>> SparseMLAAttention::Create(const SparseMLAOptions&,
                                                                         int) {
  return Unavailable("sparsekv was built without CUDA: SparseMLAAttention is unavailable");
}

StatusOr<std::unique_ptr<SparseEntryAttention>> SparseEntryAttention::Create(
    const SparseEntryAttentionOptions&, int) {
  return Unavailable("sparsekv was built without CUDA: SparseEntryAttention is unavailable");
}

StatusOr<std::unique_ptr<WeightStreamProxy>> WeightStreamProxy::Create(int32_t, int64_t, int32_t,
                                                                       int) {
  return Unavailable("sparsekv was built without CUDA: WeightStreamProxy is unavailable");
}

}  // namespace sparsekv
