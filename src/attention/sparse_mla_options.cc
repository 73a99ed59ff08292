// SparseMLAOptions: defaults and validation, shared by the CUDA operator and the CPU reference.
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "sparsekv/attention.h"

namespace sparsekv {

float SparseMLAOptions::effective_softmax_scale() const {
  return softmax_scale > 0 ? softmax_scale : 1.0f / std::sqrt(static_cast<float>(kMLAQKDim));
}

Status ValidateSparseMLAOptions(const SparseMLAOptions& options) {
  if (options.max_batch < 1) {
    return InvalidArgument("SparseMLAOptions.max_batch must be >= 1, got " +
                           std::to_string(options.max_batch));
  }
  if (options.heads < 1) {
    return InvalidArgument("SparseMLAOptions.heads must be >= 1, got " +
                           std::to_string(options.heads));
  }
  if (options.top_k < 1) {
    return InvalidArgument("SparseMLAOptions.top_k must be >= 1, got " +
                           std::to_string(options.top_k));
  }
  if (options.format != KVRowFormat::kBf16Row1152 && options.format != KVRowFormat::kFp8Row656) {
    return InvalidArgument("SparseMLAOptions.format is not a KVRowFormat");
  }
  if (!(options.softmax_scale >= 0) || !std::isfinite(options.softmax_scale)) {
    return InvalidArgument("SparseMLAOptions.softmax_scale must be finite and >= 0");
  }
  // The gather kernel numbers (row, 16-B chunk) pairs in 32 bits: up to 72 chunks per row.
  constexpr int64_t kMaxIndex = std::numeric_limits<int32_t>::max();
  if (int64_t{options.max_batch} * options.top_k * 72 >= kMaxIndex ||
      int64_t{options.max_batch} * options.heads >= kMaxIndex) {
    return InvalidArgument("SparseMLAOptions: max_batch * top_k or max_batch * heads too large");
  }
  return Status::Ok();
}

}  // namespace sparsekv
