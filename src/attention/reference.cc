// The CPU reference of sparse MLA attention: float64 throughout, inputs decoded exactly.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "attention/row_layout.h"
#include "sparsekv/attention.h"

namespace sparsekv {
namespace {

using mla_layout::kFp8GroupDims;
using mla_layout::kFp8Groups;
using mla_layout::kFp8RopeOffset;
using mla_layout::kFp8ScalesOffset;
using mla_layout::kRopeDims;

// Decodes the 576 key dims of one stored row into `key`.
void DecodeRow(KVRowFormat format, const std::byte* row, double* key) {
  if (format == KVRowFormat::kBf16Row1152) {
    for (int d = 0; d < kMLAQKDim; ++d) {
      uint16_t bits;
      std::memcpy(&bits, row + 2 * d, sizeof(bits));
      key[d] = DecodeBf16(bits);
    }
    return;
  }
  float scales[kFp8Groups];
  std::memcpy(scales, row + kFp8ScalesOffset, sizeof(scales));
  for (int d = 0; d < kMLAValueDim; ++d) {
    key[d] = DecodeFp8E4M3(static_cast<uint8_t>(row[d])) * scales[d / kFp8GroupDims];
  }
  for (int r = 0; r < kRopeDims; ++r) {
    uint16_t bits;
    std::memcpy(&bits, row + kFp8RopeOffset + 2 * r, sizeof(bits));
    key[kMLAValueDim + r] = DecodeBf16(bits);
  }
}

}  // namespace

double DecodeBf16(uint16_t bits) {
  const uint32_t widened = uint32_t{bits} << 16;  // bf16 is the top half of a float
  float value;
  std::memcpy(&value, &widened, sizeof(value));
  return value;
}

double DecodeFp8E4M3(uint8_t bits) {
  if ((bits & 0x7F) == 0x7F) return std::numeric_limits<double>::quiet_NaN();
  const double sign = (bits & 0x80) != 0 ? -1.0 : 1.0;
  const int exponent = (bits >> 3) & 0xF;
  const int mantissa = bits & 0x7;
  if (exponent == 0) return sign * std::ldexp(mantissa, -9);  // subnormal: 0.mmm * 2^(1 - 7)
  return sign * std::ldexp(8 + mantissa, exponent - 7 - 3);   // 1.mmm * 2^(e - 7)
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
  const int heads = options.heads;
  const int top_k = options.top_k;
  const double scale = options.effective_softmax_scale();

  std::vector<double> keys(static_cast<size_t>(top_k) * kMLAQKDim);  // [top_k, 576]
  std::vector<double> query(kMLAQKDim);
  std::vector<double> scores(top_k);
  for (int b = 0; b < batch; ++b) {
    const int32_t* row_index = indices + static_cast<int64_t>(b) * top_k;
    for (int k = 0; k < top_k; ++k) {
      if (row_index[k] >= 0) {
        DecodeRow(options.format, kv_rows + row_index[k] * row_stride,
                  &keys[static_cast<size_t>(k) * kMLAQKDim]);
      }
    }
    for (int h = 0; h < heads; ++h) {
      const int64_t bh = int64_t{b} * heads + h;
      for (int d = 0; d < kMLAQKDim; ++d) query[d] = DecodeBf16(q[bh * kMLAQKDim + d]);
      double max_score = -std::numeric_limits<double>::infinity();
      for (int k = 0; k < top_k; ++k) {
        if (row_index[k] < 0) continue;
        const double* key = &keys[static_cast<size_t>(k) * kMLAQKDim];
        double dot = 0;
        for (int d = 0; d < kMLAQKDim; ++d) dot += query[d] * key[d];
        scores[k] = scale * dot;
        max_score = std::max(max_score, scores[k]);
      }
      double* o = out + bh * kMLAValueDim;
      std::fill(o, o + kMLAValueDim, 0.0);
      double sum = 0;
      for (int k = 0; k < top_k; ++k) {
        if (row_index[k] < 0) continue;
        const double weight = std::exp(scores[k] - max_score);
        sum += weight;
        const double* key = &keys[static_cast<size_t>(k) * kMLAQKDim];
        for (int d = 0; d < kMLAValueDim; ++d) o[d] += weight * key[d];
      }
      if (sum > 0) {
        for (int d = 0; d < kMLAValueDim; ++d) o[d] /= sum;
      }
    }
  }
  return Status::Ok();
}

}  // namespace sparsekv
