// SparseEntryAttentionOptions and the checks of SparseEntryAttention::Run's arguments, shared by
// the CUDA operator and the tests that run without a GPU.
#include <cmath>
#include <cstdint>
#include <string>

#include "attention/entry_attention_args.h"
#include "sparsekv/attention.h"

namespace sparsekv {
namespace {

constexpr int32_t kEntryDims = 512;  // key = value: the entry's 448 latent and 64 rope dims

bool IsEntryFormat(KVRowFormat format) {
  return format == KVRowFormat::kFp8Entry584 || format == KVRowFormat::kMxfp4Entry368;
}

Status CheckScope(const AttentionScope& scope, const char* name) {
  const std::string at = std::string("SparseEntryAttention::Run: ") + name;
  if (scope.in_store()) {
    if (!IsEntryFormat(scope.format)) {
      return InvalidArgument(at +
                             ".format must be a DeepSeek-V4 entry (kFp8Entry584 or "
                             "kMxfp4Entry368)");
    }
    return CheckStoreScope(scope, at);
  }
  if (scope.width < 0) {
    return InvalidArgument(at + ".width must be >= 0, got " + std::to_string(scope.width));
  }
  if (scope.width == 0) return Status::Ok();
  if (scope.rows == nullptr || scope.indices == nullptr) {
    return InvalidArgument(at + ": null rows or indices");
  }
  if (!IsEntryFormat(scope.format)) {
    return InvalidArgument(at +
                           ".format must be a DeepSeek-V4 entry (kFp8Entry584 or "
                           "kMxfp4Entry368)");
  }
  if (scope.row_stride < KVRowBytes(scope.format)) {
    return InvalidArgument(at + ".row_stride " + std::to_string(scope.row_stride) +
                           " is shorter than its format's row (" +
                           std::to_string(KVRowBytes(scope.format)) + " B)");
  }
  return Status::Ok();
}

}  // namespace

Status CheckStoreScope(const AttentionScope& scope, const std::string& at) {
  const StoreScopeView& v = scope.store;
  if (v.first_row < 0) {
    return InvalidArgument(at + ".store.first_row must be >= 0, got " +
                           std::to_string(v.first_row));
  }
  int32_t row_stride = 0;
  if (v.source == StoreScopeView::kDenseEntries) {
    const DenseEntriesView& e = v.entries;
    if (e.batch_size == nullptr || e.table_row == nullptr || e.seq_len == nullptr ||
        e.pages == nullptr) {
      return InvalidArgument(at + ".store.entries: null batch_size, table_row, seq_len or pages");
    }
    if (e.pages_per_row < 1 || e.page_rows < 1 || e.entry_tokens < 1) {
      return InvalidArgument(at +
                             ".store.entries: pages_per_row, page_rows and entry_tokens must "
                             "be >= 1");
    }
    row_stride = e.row_stride;
  } else if (v.source == StoreScopeView::kRawWindow) {
    const RawWindowView& w = v.window;
    if (w.batch_size == nullptr || w.table_row == nullptr || w.seq_len == nullptr ||
        w.rings == nullptr) {
      return InvalidArgument(at + ".store.window: null batch_size, table_row, seq_len or rings");
    }
    if (w.raw_window < 1) {
      return InvalidArgument(at + ".store.window.raw_window must be >= 1, got " +
                             std::to_string(w.raw_window));
    }
    row_stride = w.row_stride;
  } else {
    return InvalidArgument(at + ".store.source is not a StoreScopeView::Source");
  }
  if (row_stride < KVRowBytes(scope.format)) {
    return InvalidArgument(at + ": the view's row_stride " + std::to_string(row_stride) +
                           " is shorter than its format's row (" +
                           std::to_string(KVRowBytes(scope.format)) + " B)");
  }
  return Status::Ok();
}

float SparseEntryAttentionOptions::effective_softmax_scale() const {
  return softmax_scale > 0 ? softmax_scale : 1.0f / std::sqrt(static_cast<float>(kEntryDims));
}

Status ValidateSparseEntryAttentionOptions(const SparseEntryAttentionOptions& options) {
  // The grid has a block row per request: gridDim.y is at most 65535.
  if (options.max_batch < 1 || options.max_batch > 65535) {
    return InvalidArgument("SparseEntryAttentionOptions.max_batch must be in [1, 65535], got " +
                           std::to_string(options.max_batch));
  }
  if (options.heads < 1 || options.heads > 1024) {
    return InvalidArgument("SparseEntryAttentionOptions.heads must be in [1, 1024], got " +
                           std::to_string(options.heads));
  }
  if (!(options.softmax_scale >= 0) || !std::isfinite(options.softmax_scale)) {
    return InvalidArgument("SparseEntryAttentionOptions.softmax_scale must be finite and >= 0");
  }
  return Status::Ok();
}

Status CheckSparseEntryAttentionArgs(const SparseEntryAttentionOptions& options, int32_t batch,
                                     const void* q, const AttentionScope& selected,
                                     const AttentionScope& window, const void* out) {
  if (batch < 0 || batch > options.max_batch) {
    return InvalidArgument("SparseEntryAttention::Run: batch " + std::to_string(batch) +
                           " outside [0, " + std::to_string(options.max_batch) + "]");
  }
  SPARSEKV_RETURN_IF_ERROR(CheckScope(selected, "selected"));
  SPARSEKV_RETURN_IF_ERROR(CheckScope(window, "window"));
  if (selected.empty() && window.empty()) {
    return InvalidArgument("SparseEntryAttention::Run: both scopes are empty (width 0)");
  }
  if (batch > 0 && (q == nullptr || out == nullptr)) {
    return InvalidArgument("SparseEntryAttention::Run: null q or out");
  }
  return Status::Ok();
}

}  // namespace sparsekv
