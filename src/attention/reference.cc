// The CPU references of sparse attention: float64 throughout, inputs decoded exactly
// (kv_format.h).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "attention/entry_attention_args.h"
#include "sparsekv/attention.h"
#include "sparsekv/kv_format.h"

namespace sparsekv {
namespace {

Status CheckScope(const AttentionScope& scope, const char* name) {
  const std::string at = std::string("ReferenceSparseAttention: ") + name;
  if (scope.in_store()) {
    if (!IsKVRowFormat(scope.format)) return InvalidArgument(at + ".format is not a KVRowFormat");
    return CheckStoreScope(scope, at);
  }
  if (scope.width < 0) return InvalidArgument(at + ".width must be >= 0");
  if (scope.width == 0) return Status::Ok();
  if (!IsKVRowFormat(scope.format)) return InvalidArgument(at + ".format is not a KVRowFormat");
  if (scope.rows == nullptr || scope.indices == nullptr) {
    return InvalidArgument(at + ": null rows or indices");
  }
  if (scope.row_stride < KVRowBytes(scope.format)) {
    return InvalidArgument(at + ".row_stride is shorter than a row");
  }
  return Status::Ok();
}

// Decodes request b's unmasked entries of `scope`, appending their keys (key_dims each).
void DecodeScope(const AttentionScope& scope, int32_t b, int32_t key_dims,
                 std::vector<double>* keys) {
  if (scope.in_store()) {
    const int32_t count = scope.store.Count(b);
    for (int32_t k = 0; k < count; ++k) {
      keys->resize(keys->size() + key_dims);
      DecodeKVRow(scope.format, scope.store.Row(b, k), keys->data() + keys->size() - key_dims);
    }
    return;
  }
  const int32_t* index = scope.indices + int64_t{b} * scope.width;
  for (int32_t k = 0; k < scope.width; ++k) {
    if (index[k] < 0) continue;
    keys->resize(keys->size() + key_dims);
    DecodeKVRow(scope.format, scope.rows + index[k] * scope.row_stride,
                keys->data() + keys->size() - key_dims);
  }
}

}  // namespace

Status ReferenceSparseAttention(const ReferenceAttentionInputs& in, double* out) {
  if (in.batch < 0) return InvalidArgument("ReferenceSparseAttention: batch must be >= 0");
  if (in.heads < 1) return InvalidArgument("ReferenceSparseAttention: heads must be >= 1");
  if (!(in.softmax_scale >= 0) || !std::isfinite(in.softmax_scale)) {
    return InvalidArgument("ReferenceSparseAttention: softmax_scale must be finite and >= 0");
  }
  SPARSEKV_RETURN_IF_ERROR(CheckScope(in.selected, "selected"));
  SPARSEKV_RETURN_IF_ERROR(CheckScope(in.window, "window"));
  if (in.selected.empty() && in.window.empty()) {
    return InvalidArgument("ReferenceSparseAttention: both scopes are empty");
  }
  const KVFormatShape shape =
      FormatShape(!in.selected.empty() ? in.selected.format : in.window.format);
  if (!in.selected.empty() && !in.window.empty() &&
      FormatShape(in.window.format).key_dims != shape.key_dims) {
    return InvalidArgument("ReferenceSparseAttention: the scopes' keys differ in dims");
  }
  if (in.batch == 0) return Status::Ok();
  if (in.q == nullptr || out == nullptr) {
    return InvalidArgument("ReferenceSparseAttention: null q or out");
  }
  const int32_t key_dims = shape.key_dims;
  const int32_t value_dims = shape.value_dims;
  const double scale =
      in.softmax_scale > 0 ? in.softmax_scale : 1.0 / std::sqrt(static_cast<double>(key_dims));

  std::vector<double> keys;  // [entries, key_dims]: request b's unmasked entries, both scopes
  std::vector<double> query(key_dims);
  std::vector<double> scores;
  for (int32_t b = 0; b < in.batch; ++b) {
    keys.clear();
    DecodeScope(in.selected, b, key_dims, &keys);
    DecodeScope(in.window, b, key_dims, &keys);
    const size_t entries = keys.size() / key_dims;
    scores.resize(entries);
    for (int32_t h = 0; h < in.heads; ++h) {
      const int64_t bh = int64_t{b} * in.heads + h;
      for (int32_t d = 0; d < key_dims; ++d) query[d] = DecodeBf16(in.q[bh * key_dims + d]);
      double max_score = -std::numeric_limits<double>::infinity();
      for (size_t k = 0; k < entries; ++k) {
        const double* key = &keys[k * key_dims];
        double dot = 0;
        for (int32_t d = 0; d < key_dims; ++d) dot += query[d] * key[d];
        scores[k] = scale * dot;
        max_score = std::max(max_score, scores[k]);
      }
      double* o = out + bh * value_dims;
      std::fill(o, o + value_dims, 0.0);
      if (entries == 0) continue;  // all masked: zeros
      double sum = 0;
      for (size_t k = 0; k < entries; ++k) {
        const double weight = std::exp(scores[k] - max_score);
        sum += weight;
        const double* key = &keys[k * key_dims];
        for (int32_t d = 0; d < value_dims; ++d) o[d] += weight * key[d];
      }
      // exp(s - lse) = weight / sum, and 1 / (1 + exp(sink - lse)) = sum / (sum + exp(sink - max)).
      const double denominator =
          in.sink != nullptr ? sum + std::exp(double{in.sink[h]} - max_score) : sum;
      for (int32_t d = 0; d < value_dims; ++d) o[d] /= denominator;
    }
  }
  return Status::Ok();
}

Status ReferenceSparseMLA(const SparseMLAOptions& options, int32_t batch, const uint16_t* q,
                          const std::byte* kv_rows, int64_t row_stride, const int32_t* indices,
                          double* out) {
  SPARSEKV_RETURN_IF_ERROR(ValidateSparseMLAOptions(options));
  if (batch < 0 || batch > options.max_batch) {
    return InvalidArgument("ReferenceSparseMLA: batch outside [0, max_batch]");
  }
  if (batch == 0) return Status::Ok();
  if (q == nullptr || kv_rows == nullptr || indices == nullptr || out == nullptr) {
    return InvalidArgument("ReferenceSparseMLA: null pointer");
  }
  if (row_stride < KVRowBytes(options.format)) {
    return InvalidArgument("ReferenceSparseMLA: row_stride is shorter than a row");
  }
  ReferenceAttentionInputs in;
  in.batch = batch;
  in.heads = options.heads;
  in.softmax_scale = options.effective_softmax_scale();
  in.q = q;
  in.selected = {kv_rows, row_stride, options.format, indices, options.top_k};
  return ReferenceSparseAttention(in, out);
}

}  // namespace sparsekv
