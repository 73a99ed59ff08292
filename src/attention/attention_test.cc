// Tests of sparse MLA attention (against the float64 CPU reference) and of the weight-streaming
// proxy.
//
// Compiled by the host compiler against public headers only; data moves through the Backend
// interface. The reference's own tests run everywhere; every GPU test skips where no device is
// present. GPU inputs are random (never zeros) with fixed seeds, cover masked (-1) and duplicate
// indices and padded row strides, and the output is poisoned with NaN before each run, one request
// past the batch included, so that an unwritten element or a write past the batch shows.
#include "sparsekv/attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "attention/entry_attention_args.h"
#include "attention/entry_decode.h"
#include "attention/row_layout.h"
#include "sparsekv/backend.h"
#include "sparsekv/model_proxy.h"
#include "testing/cuda_test_util.h"
#include "testing/harness.h"

namespace sparsekv {
namespace {

constexpr int kNaNPoison = 0xFF;  // every bf16 of the poisoned output reads 0xFFFF, a NaN

void ExpectOk(const Status& status) { EXPECT_TRUE(status.ok()) << status.ToString(); }

// Round to nearest even; the inputs here are finite.
uint16_t ToBf16(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  bits += 0x7FFF + ((bits >> 16) & 1);
  return static_cast<uint16_t>(bits >> 16);
}

template <typename T>
void Store(std::vector<std::byte>& bytes, size_t offset, T value) {
  std::memcpy(bytes.data() + offset, &value, sizeof(T));
}

// ‖a − b‖ / ‖b‖ over n elements (a in bf16); NaN in `a` makes it NaN, which fails any bound.
double RelativeError(const uint16_t* a, const double* b, size_t n) {
  double diff = 0;
  double norm = 0;
  for (size_t i = 0; i < n; ++i) {
    const double d = DecodeBf16(a[i]) - b[i];
    diff += d * d;
    norm += b[i] * b[i];
  }
  return std::sqrt(diff / norm);
}

using testing::DeviceBuffer;

// ---------------------------------------------------------------------------------------------
// The CPU reference on inputs whose result is known in closed form.

// Rows of the bf16 format from per-row key vectors.
std::vector<std::byte> Bf16Rows(const std::vector<std::vector<float>>& keys) {
  std::vector<std::byte> rows(keys.size() * KVRowBytes(KVRowFormat::kBf16Row1152));
  for (size_t r = 0; r < keys.size(); ++r) {
    for (int d = 0; d < kMLAQKDim; ++d) {
      Store(rows, (r * kMLAQKDim + d) * 2, ToBf16(keys[r][d]));
    }
  }
  return rows;
}

std::vector<float> RandomKey(std::mt19937_64& rng) {
  std::normal_distribution<float> normal;
  std::vector<float> key(kMLAQKDim);
  for (float& x : key) x = normal(rng);
  return key;
}

TEST(ReferenceSparseMLATest, EqualScoresAverageTheValuesCountingDuplicates) {
  std::mt19937_64 rng(1);
  const std::vector<std::vector<float>> keys = {RandomKey(rng), RandomKey(rng), RandomKey(rng)};
  const SparseMLAOptions options{
      .max_batch = 1, .heads = 2, .top_k = 4, .format = KVRowFormat::kBf16Row1152};
  const std::vector<uint16_t> q(2 * kMLAQKDim, 0);  // every score 0
  const std::vector<int32_t> indices = {2, -1, 0, 2};
  std::vector<double> out(2 * kMLAValueDim);
  ExpectOk(ReferenceSparseMLA(options, 1, q.data(), Bf16Rows(keys).data(), 2 * kMLAQKDim,
                              indices.data(), out.data()));
  for (int h = 0; h < 2; ++h) {
    for (int d = 0; d < kMLAValueDim; ++d) {
      const double v0 = DecodeBf16(ToBf16(keys[0][d]));
      const double v2 = DecodeBf16(ToBf16(keys[2][d]));
      EXPECT_NEAR(out[h * kMLAValueDim + d], (v0 + 2 * v2) / 3, 1e-12);
    }
  }
}

TEST(ReferenceSparseMLATest, WeightsAreTheScaledSoftmax) {
  // Key 0 has dim 0 = 2, key 1 is zero, q = e_0: raw scores 2 and 0, scaled by 0.5 to 1 and 0.
  std::vector<std::vector<float>> keys(2, std::vector<float>(kMLAQKDim, 0.0f));
  keys[0][0] = 2.0f;
  keys[0][1] = 3.0f;
  keys[1][1] = 5.0f;
  const SparseMLAOptions options{.max_batch = 1,
                                 .heads = 1,
                                 .top_k = 2,
                                 .format = KVRowFormat::kBf16Row1152,
                                 .softmax_scale = 0.5f};
  std::vector<uint16_t> q(kMLAQKDim, 0);
  q[0] = ToBf16(1.0f);
  const std::vector<int32_t> indices = {0, 1};
  std::vector<double> out(kMLAValueDim);
  ExpectOk(ReferenceSparseMLA(options, 1, q.data(), Bf16Rows(keys).data(), 2 * kMLAQKDim,
                              indices.data(), out.data()));
  const double w0 = std::exp(1.0) / (std::exp(1.0) + 1.0);
  EXPECT_NEAR(out[0], w0 * 2.0, 1e-12);
  EXPECT_NEAR(out[1], w0 * 3.0 + (1 - w0) * 5.0, 1e-12);
  EXPECT_EQ(out[2], 0.0);
}

TEST(ReferenceSparseMLATest, Fp8ValuesAreScaledPerGroupOf128) {
  std::vector<std::byte> row(KVRowBytes(KVRowFormat::kFp8Row656));
  for (int d = 0; d < kMLAValueDim; ++d) row[d] = std::byte{0x3C};  // 1.5
  const float scales[4] = {0.5f, 1.0f, 2.0f, -4.0f};
  std::memcpy(row.data() + mla_layout::kFp8ScalesOffset, scales, sizeof(scales));
  for (int r = 0; r < mla_layout::kRopeDims; ++r) {
    Store(row, mla_layout::kFp8RopeOffset + 2 * r, ToBf16(7.0f));
  }
  const SparseMLAOptions options{
      .max_batch = 1, .heads = 1, .top_k = 1, .format = KVRowFormat::kFp8Row656};
  const std::vector<uint16_t> q(kMLAQKDim, ToBf16(0.25f));
  const int32_t index = 0;
  std::vector<double> out(kMLAValueDim);
  ExpectOk(ReferenceSparseMLA(options, 1, q.data(), row.data(), row.size(), &index, out.data()));
  for (int d = 0; d < kMLAValueDim; ++d) {
    EXPECT_EQ(out[d], 1.5 * scales[d / mla_layout::kFp8GroupDims]) << d;
  }
}

TEST(ReferenceSparseMLATest, FullyMaskedRequestIsZero) {
  std::mt19937_64 rng(2);
  const SparseMLAOptions options{
      .max_batch = 1, .heads = 1, .top_k = 3, .format = KVRowFormat::kBf16Row1152};
  std::vector<uint16_t> q(kMLAQKDim, ToBf16(1.0f));
  const std::vector<int32_t> indices = {-1, -1, -1};
  std::vector<double> out(kMLAValueDim, 1.0);
  ExpectOk(ReferenceSparseMLA(options, 1, q.data(), Bf16Rows({RandomKey(rng)}).data(),
                              2 * kMLAQKDim, indices.data(), out.data()));
  for (double x : out) EXPECT_EQ(x, 0.0);
}

TEST(ReferenceSparseMLATest, RejectsBadArguments) {
  const SparseMLAOptions options{
      .max_batch = 1, .heads = 1, .top_k = 1, .format = KVRowFormat::kFp8Row656};
  std::vector<std::byte> row(656);
  const std::vector<uint16_t> q(kMLAQKDim);
  const int32_t index = 0;
  std::vector<double> out(kMLAValueDim);
  EXPECT_EQ(ReferenceSparseMLA(options, 2, q.data(), row.data(), 656, &index, out.data()).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(ReferenceSparseMLA(options, 1, q.data(), row.data(), 640, &index, out.data()).code(),
            StatusCode::kInvalidArgument);
  SparseMLAOptions no_batch = options;
  no_batch.max_batch = 0;
  EXPECT_EQ(ReferenceSparseMLA(no_batch, 0, q.data(), row.data(), 656, &index, out.data()).code(),
            StatusCode::kInvalidArgument);
}

// ---------------------------------------------------------------------------------------------
// The two-scope reference with a sink (ReferenceSparseAttention), on DeepSeek-V4's 584-B entries.

constexpr int32_t kV4Dims = 512;  // key = value
constexpr int32_t kEntryBytes = 584;

// `n` random entries encoded in `format` (a DeepSeek-V4 entry), `stride` bytes apart, and their
// decoded keys.
struct Entries {
  std::vector<std::byte> rows;
  std::vector<std::vector<double>> keys;  // as decoded: what attention must see
};
Entries RandomEntries(std::mt19937_64& rng, int32_t n, int32_t stride,
                      KVRowFormat format = KVRowFormat::kFp8Entry584) {
  std::normal_distribution<double> normal(0, 0.5);
  Entries e;
  e.rows.assign(static_cast<size_t>(n) * stride, std::byte{0x5A});
  for (int32_t r = 0; r < n; ++r) {
    std::vector<double> key(kV4Dims);
    for (double& x : key) x = normal(rng);
    EncodeKVRow(format, key.data(), e.rows.data() + int64_t{r} * stride);
    DecodeKVRow(format, e.rows.data() + int64_t{r} * stride, key.data());
    e.keys.push_back(key);
  }
  return e;
}

std::vector<uint16_t> RandomQueries(std::mt19937_64& rng, size_t n) {
  std::normal_distribution<float> normal(0, 1);
  std::vector<uint16_t> q(n);
  for (uint16_t& x : q) x = ToBf16(normal(rng));
  return q;
}

// The formula of attention.h written out plainly: both scopes' unmasked entries, lse, the
// softmax as exp(s - lse), then the sink's factor.
std::vector<double> DenseTwoScope(const ReferenceAttentionInputs& in, const Entries& selected,
                                  const Entries& window, double scale) {
  std::vector<double> out(static_cast<size_t>(in.batch) * in.heads * kV4Dims, 0.0);
  for (int32_t b = 0; b < in.batch; ++b) {
    std::vector<const std::vector<double>*> keys;
    for (int32_t k = 0; k < in.selected.width; ++k) {
      const int32_t i = in.selected.indices[b * in.selected.width + k];
      if (i >= 0) keys.push_back(&selected.keys[i]);
    }
    for (int32_t k = 0; k < in.window.width; ++k) {
      const int32_t i = in.window.indices[b * in.window.width + k];
      if (i >= 0) keys.push_back(&window.keys[i]);
    }
    if (keys.empty()) continue;
    for (int32_t h = 0; h < in.heads; ++h) {
      const uint16_t* q = in.q + (int64_t{b} * in.heads + h) * kV4Dims;
      std::vector<double> s;
      for (const std::vector<double>* key : keys) {
        double dot = 0;
        for (int32_t d = 0; d < kV4Dims; ++d) dot += DecodeBf16(q[d]) * (*key)[d];
        s.push_back(scale * dot);
      }
      double sum = 0;
      for (double x : s) sum += std::exp(x);
      const double lse = std::log(sum);
      const double sink = in.sink != nullptr ? 1 / (1 + std::exp(double{in.sink[h]} - lse)) : 1.0;
      double* o = &out[(int64_t{b} * in.heads + h) * kV4Dims];
      for (size_t k = 0; k < keys.size(); ++k) {
        for (int32_t d = 0; d < kV4Dims; ++d) o[d] += std::exp(s[k] - lse) * (*keys[k])[d] * sink;
      }
    }
  }
  return out;
}

TEST(ReferenceSparseAttentionTest, TwoScopesWithSinkMatchTheDenseFormula) {
  std::mt19937_64 rng(11);
  const int32_t batch = 3, heads = 4, top_k = 6, window = 3, stride = 592;  // padded rows
  const Entries selected = RandomEntries(rng, 20, stride);
  const Entries ring = RandomEntries(rng, 8, kEntryBytes);
  // Masked entries, a duplicate, and a request whose window alone is unmasked.
  const std::vector<int32_t> top = {0,  5,  5,  -1, 19, 7,  3,  -1, 2,
                                    11, 12, 13, -1, -1, -1, -1, -1, -1};
  const std::vector<int32_t> ring_rows = {0, 1, 2, 7, -1, 6, 4, 5, -1};
  const std::vector<uint16_t> q = RandomQueries(rng, size_t{batch} * heads * kV4Dims);
  const std::vector<float> sink = {-1.0f, 0.0f, 0.5f, 3.0f};
  ReferenceAttentionInputs in;
  in.batch = batch;
  in.heads = heads;
  in.q = q.data();
  in.selected = {selected.rows.data(), stride, KVRowFormat::kFp8Entry584, top.data(), top_k};
  in.window = {ring.rows.data(), kEntryBytes, KVRowFormat::kFp8Entry584, ring_rows.data(), window};
  in.sink = sink.data();
  std::vector<double> out(static_cast<size_t>(batch) * heads * kV4Dims);
  ExpectOk(ReferenceSparseAttention(in, out.data()));
  const std::vector<double> expected = DenseTwoScope(in, selected, ring, 1 / std::sqrt(512.0));
  for (size_t i = 0; i < out.size(); ++i) {
    EXPECT_NEAR(out[i], expected[i], 1e-12 * (1 + std::abs(expected[i]))) << i;
  }
}

// MXFP4 entries selected, fp8 entries in the window: both are 512-dim keys, decoded exactly.
TEST(ReferenceSparseAttentionTest, Mxfp4EntriesBesideFp8WindowMatchTheDenseFormula) {
  std::mt19937_64 rng(15);
  const int32_t batch = 2, heads = 3, top_k = 4, window = 2;
  const Entries selected = RandomEntries(rng, 9, 368, KVRowFormat::kMxfp4Entry368);
  const Entries ring = RandomEntries(rng, 4, kEntryBytes);
  const std::vector<int32_t> top = {8, 0, -1, 3, 1, 1, 6, -1};
  const std::vector<int32_t> ring_rows = {0, 1, 3, -1};
  const std::vector<uint16_t> q = RandomQueries(rng, size_t{batch} * heads * kV4Dims);
  const std::vector<float> sink = {0.25f, -2.0f, 1.0f};
  ReferenceAttentionInputs in;
  in.batch = batch;
  in.heads = heads;
  in.q = q.data();
  in.selected = {selected.rows.data(), 368, KVRowFormat::kMxfp4Entry368, top.data(), top_k};
  in.window = {ring.rows.data(), kEntryBytes, KVRowFormat::kFp8Entry584, ring_rows.data(), window};
  in.sink = sink.data();
  std::vector<double> out(static_cast<size_t>(batch) * heads * kV4Dims);
  ExpectOk(ReferenceSparseAttention(in, out.data()));
  const std::vector<double> expected = DenseTwoScope(in, selected, ring, 1 / std::sqrt(512.0));
  for (size_t i = 0; i < out.size(); ++i) {
    EXPECT_NEAR(out[i], expected[i], 1e-12 * (1 + std::abs(expected[i]))) << i;
  }
}

TEST(ReferenceSparseAttentionTest, TwoScopesAreOneSoftmax) {
  std::mt19937_64 rng(12);
  const Entries entries = RandomEntries(rng, 6, kEntryBytes);
  const std::vector<uint16_t> q = RandomQueries(rng, 2 * kV4Dims);
  const std::vector<int32_t> all = {0, 1, 2, 3, 4, 5}, first = {0, 1, 2, 3}, last = {4, 5};
  ReferenceAttentionInputs one;
  one.batch = 1;
  one.heads = 2;
  one.q = q.data();
  one.selected = {entries.rows.data(), kEntryBytes, KVRowFormat::kFp8Entry584, all.data(), 6};
  ReferenceAttentionInputs two = one;
  two.selected.indices = first.data();
  two.selected.width = 4;
  two.window = {entries.rows.data(), kEntryBytes, KVRowFormat::kFp8Entry584, last.data(), 2};
  std::vector<double> a(2 * kV4Dims), b(2 * kV4Dims);
  ExpectOk(ReferenceSparseAttention(one, a.data()));
  ExpectOk(ReferenceSparseAttention(two, b.data()));
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-14) << i;
}

// Two entries of score 0 (q = 0): lse = log 2; a sink of log 2 halves the output.
TEST(ReferenceSparseAttentionTest, SinkScalesByOneOverOnePlusExpOfSinkMinusLse) {
  std::mt19937_64 rng(13);
  const Entries entries = RandomEntries(rng, 2, kEntryBytes);
  const std::vector<uint16_t> q(kV4Dims, 0);
  const std::vector<int32_t> indices = {0, 1};
  const float sink = static_cast<float>(std::log(2.0));
  ReferenceAttentionInputs in;
  in.batch = 1;
  in.heads = 1;
  in.q = q.data();
  in.selected = {entries.rows.data(), kEntryBytes, KVRowFormat::kFp8Entry584, indices.data(), 2};
  in.sink = &sink;
  std::vector<double> out(kV4Dims);
  ExpectOk(ReferenceSparseAttention(in, out.data()));
  const double factor = 1 / (1 + std::exp(double{sink} - std::log(2.0)));  // 0.5 up to float
  for (int32_t d = 0; d < kV4Dims; ++d) {
    const double mean = (entries.keys[0][d] + entries.keys[1][d]) / 2;
    EXPECT_NEAR(out[d], mean * factor, 1e-15) << d;
  }
}

TEST(ReferenceSparseAttentionTest, AllMaskedRequestIsZeroWithOrWithoutSink) {
  std::mt19937_64 rng(14);
  const Entries entries = RandomEntries(rng, 2, kEntryBytes);
  const std::vector<uint16_t> q = RandomQueries(rng, 2 * kV4Dims);
  const std::vector<int32_t> top = {-1, -1, 0, 1}, ring = {-1, 1};  // request 0 all masked
  const float sink = 2.0f;
  ReferenceAttentionInputs in;
  in.batch = 2;
  in.heads = 1;
  in.q = q.data();
  in.selected = {entries.rows.data(), kEntryBytes, KVRowFormat::kFp8Entry584, top.data(), 2};
  in.window = {entries.rows.data(), kEntryBytes, KVRowFormat::kFp8Entry584, ring.data(), 1};
  for (const float* s : {static_cast<const float*>(nullptr), &sink}) {
    in.sink = s;
    std::vector<double> out(2 * kV4Dims, 7.0);
    ExpectOk(ReferenceSparseAttention(in, out.data()));
    for (int32_t d = 0; d < kV4Dims; ++d) EXPECT_EQ(out[d], 0.0) << d;
    EXPECT_NE(out[kV4Dims], 0.0);  // request 1 attends
  }
}

TEST(ReferenceSparseAttentionTest, RejectsBadArguments) {
  std::vector<std::byte> rows(1152);
  const std::vector<uint16_t> q(576);
  const int32_t index = 0;
  std::vector<double> out(512);
  ReferenceAttentionInputs in;
  in.batch = 1;
  in.heads = 1;
  in.q = q.data();
  in.selected = {rows.data(), 584, KVRowFormat::kFp8Entry584, &index, 1};
  ExpectOk(ReferenceSparseAttention(in, out.data()));
  ReferenceAttentionInputs bad = in;
  bad.window = {rows.data(), 656, KVRowFormat::kFp8Row656, &index, 1};  // 576-dim keys
  EXPECT_EQ(ReferenceSparseAttention(bad, out.data()).code(), StatusCode::kInvalidArgument);
  bad = in;
  bad.selected.width = 0;  // both scopes empty
  EXPECT_EQ(ReferenceSparseAttention(bad, out.data()).code(), StatusCode::kInvalidArgument);
  bad = in;
  bad.selected.row_stride = 580;
  EXPECT_EQ(ReferenceSparseAttention(bad, out.data()).code(), StatusCode::kInvalidArgument);
  bad = in;
  bad.window.width = -1;
  EXPECT_EQ(ReferenceSparseAttention(bad, out.data()).code(), StatusCode::kInvalidArgument);
  bad = in;
  bad.softmax_scale = -1;
  EXPECT_EQ(ReferenceSparseAttention(bad, out.data()).code(), StatusCode::kInvalidArgument);
}

// ---------------------------------------------------------------------------------------------
// Store scopes: the oracle reading a DenseLayerStore's views in place equals the indexed form over
// the same rows gathered (the addressing written out here independently of the views').

// One layer of a DenseLayerStore over `batch` requests, in one arena: each request's pages of
// page_rows entries (null past its entries) and its ring of raw_window rows, at offsets into the
// arena, so that the same inputs serve host memory and, uploaded, device memory.
struct StoreLayer {
  KVRowFormat format = KVRowFormat::kFp8Entry584;
  int32_t batch = 0;
  int32_t stride = 0;
  int32_t entry_tokens = 4;
  int32_t page_rows = 8;
  int32_t pages_per_row = 0;
  int32_t raw_window = 0;
  std::vector<std::byte> arena;
  // batch_size, table_row[batch], seq_len[batch]: one buffer, as the manager's step tables.
  std::vector<int32_t> tables;
  std::vector<int64_t> page_offset;  // [table rows, pages_per_row]; -1 = no page
  std::vector<int64_t> ring_offset;  // [table rows]

  int32_t table_row(int32_t b) const { return tables[1 + b]; }
  int32_t seq_len(int32_t b) const { return tables[1 + batch + b]; }
  bool used(int32_t b) const { return b < tables[0] && table_row(b) >= 0; }

  std::vector<std::byte*> Addresses(const std::vector<int64_t>& offsets, std::byte* base) const {
    std::vector<std::byte*> out;
    for (int64_t o : offsets) out.push_back(o < 0 ? nullptr : base + o);
    return out;
  }
  DenseEntriesView Entries(const int32_t* t, std::byte* const* pages) const {
    return {t, t + 1, t + 1 + batch, pages, pages_per_row, page_rows, stride, entry_tokens};
  }
  RawWindowView Window(const int32_t* t, std::byte* const* rings) const {
    return {t, t + 1, t + 1 + batch, rings, raw_window, stride};
  }

  // Request b's entries and window rows, in attention order, as arena offsets.
  std::vector<int64_t> EntryOffsets(int32_t b) const {
    std::vector<int64_t> out;
    if (!used(b)) return out;
    for (int32_t e = 0; e < seq_len(b) / entry_tokens; ++e) {
      out.push_back(page_offset[int64_t{table_row(b)} * pages_per_row + e / page_rows] +
                    int64_t{e % page_rows} * stride);
    }
    return out;
  }
  std::vector<int64_t> WindowOffsets(int32_t b) const {
    std::vector<int64_t> out;
    if (!used(b)) return out;
    const int32_t n = seq_len(b);
    for (int32_t t = std::max(0, n - raw_window); t < n; ++t) {
      out.push_back(ring_offset[table_row(b)] + int64_t{t % raw_window} * stride);
    }
    return out;
  }
};

// Random requests: token counts from 0 up to three windows (young requests, requests with fewer
// tokens than the cadence, rings that wrapped), table rows shuffled with one spare, the batch's
// second row unused (table row -1) and, with batch >= 4, the last row past *batch_size. Every
// byte of the arena is random: rows no view names (stale ring slots, page tails) are garbage.
StoreLayer RandomStoreLayer(KVRowFormat format, int32_t batch, std::mt19937_64& rng) {
  StoreLayer s;
  s.format = format;
  s.batch = batch;
  s.stride = KVRowBytes(format) + 8;
  s.raw_window = 16;
  const int32_t max_tokens = 3 * s.raw_window + 5;
  s.pages_per_row = (max_tokens / s.entry_tokens + s.page_rows - 1) / s.page_rows;
  const int32_t table_rows = batch + 1;
  std::vector<int32_t> rows(table_rows);
  for (int32_t t = 0; t < table_rows; ++t) rows[t] = t;
  std::shuffle(rows.begin(), rows.end(), rng);
  std::uniform_int_distribution<int32_t> tokens(0, max_tokens);
  s.tables.assign(1 + 2 * batch, 0);
  s.tables[0] = batch >= 4 ? batch - 1 : batch;
  for (int32_t b = 0; b < batch; ++b) {
    s.tables[1 + b] = b == 1 ? -1 : rows[b];
    s.tables[1 + batch + b] = b == 0 ? s.entry_tokens - 1 : tokens(rng);
  }
  s.page_offset.assign(size_t{1} * table_rows * s.pages_per_row, -1);
  s.ring_offset.assign(table_rows, -1);
  int64_t end = 0;
  for (int32_t t = table_rows - 1; t >= 0; --t) {  // the arena's order is not the table's
    s.ring_offset[t] = end;
    end += int64_t{s.raw_window} * s.stride;
    const int32_t n = tokens(rng);
    const int32_t pages = (n / s.entry_tokens + s.page_rows - 1) / s.page_rows;
    for (int32_t p = 0; p < pages; ++p) {
      s.page_offset[int64_t{t} * s.pages_per_row + p] = end;
      end += int64_t{s.page_rows} * s.stride;
    }
  }
  // Every used request's table row holds the pages its entries need.
  for (int32_t b = 0; b < batch; ++b) {
    if (!s.used(b)) continue;
    const int32_t pages = (s.seq_len(b) / s.entry_tokens + s.page_rows - 1) / s.page_rows;
    for (int32_t p = 0; p < pages; ++p) {
      int64_t& o = s.page_offset[int64_t{s.table_row(b)} * s.pages_per_row + p];
      if (o < 0) {
        o = end;
        end += int64_t{s.page_rows} * s.stride;
      }
    }
  }
  s.arena.resize(end);
  for (std::byte& x : s.arena) x = static_cast<std::byte>(rng());
  std::normal_distribution<double> normal(0, 0.5);
  std::vector<double> key(kV4Dims);
  for (int64_t row = 0; row + s.stride <= end; row += s.stride) {
    for (double& x : key) x = normal(rng);
    EncodeKVRow(format, key.data(), s.arena.data() + row);
  }
  return s;
}

// The indexed form of per-request rows: rows gathered into one buffer, request b's at
// [b * width, b * width + count), -1 past them: width is the largest count plus `padding`, and at
// least 1 (an indexed scope of width 0 would be empty, where a store scope is not).
struct GatheredScope {
  std::vector<std::byte> rows;
  std::vector<int32_t> indices;
  int32_t width = 0;
};
GatheredScope Gather(const StoreLayer& s, bool entries, int32_t first, int32_t batch,
                     int32_t padding) {
  GatheredScope g;
  for (int32_t b = 0; b < batch; ++b) {
    const auto offsets = entries ? s.EntryOffsets(first + b) : s.WindowOffsets(first + b);
    g.width = std::max(g.width, static_cast<int32_t>(offsets.size()));
  }
  g.width = std::max(g.width + padding, 1);
  g.rows.resize(size_t{1} * batch * g.width * s.stride);
  g.indices.assign(size_t{1} * batch * g.width, -1);
  for (int32_t b = 0; b < batch; ++b) {
    const auto offsets = entries ? s.EntryOffsets(first + b) : s.WindowOffsets(first + b);
    for (size_t k = 0; k < offsets.size(); ++k) {
      const int32_t row = b * g.width + static_cast<int32_t>(k);
      std::memcpy(&g.rows[int64_t{row} * s.stride], &s.arena[offsets[k]], s.stride);
      g.indices[row] = row;
    }
  }
  return g;
}

AttentionScope Indexed(const GatheredScope& g, const StoreLayer& s) {
  return {g.rows.data(), s.stride, s.format, g.indices.data(), g.width};
}

class StoreScopeReferenceTest : public ::testing::TestWithParam<KVRowFormat> {};

// For entries with the window, entries alone and the window alone, from batch row 0 and from
// row 2 (a run over part of the step's batch): the store form's output equals, exactly, the
// indexed form's over the gathered rows; requests without rows get zeros.
TEST_P(StoreScopeReferenceTest, EqualsTheIndexedFormOverGatheredRows) {
  const KVRowFormat format = GetParam();
  std::mt19937_64 rng(format == KVRowFormat::kFp8Entry584 ? 31 : 37);
  const int32_t heads = 2;
  for (int trial = 0; trial < 4; ++trial) {
    const int32_t batch = 6;
    const StoreLayer s = RandomStoreLayer(format, batch, rng);
    std::vector<std::byte> arena = s.arena;
    const std::vector<std::byte*> pages = s.Addresses(s.page_offset, arena.data());
    const std::vector<std::byte*> rings = s.Addresses(s.ring_offset, arena.data());
    const std::vector<uint16_t> q = RandomQueries(rng, size_t{1} * batch * heads * kV4Dims);
    const std::vector<float> sink = {0.5f, -1.0f};
    for (int32_t first : {0, 2}) {
      const int32_t n = batch - first;
      for (int scopes = 0; scopes < 3; ++scopes) {  // both, entries only, window only
        const bool with_entries = scopes != 2, with_window = scopes != 1;
        ReferenceAttentionInputs view_in;
        view_in.batch = n;
        view_in.heads = heads;
        view_in.q = q.data() + int64_t{first} * heads * kV4Dims;
        view_in.sink = sink.data();
        ReferenceAttentionInputs indexed_in = view_in;
        const GatheredScope entries = Gather(s, true, first, n, trial);
        const GatheredScope window = Gather(s, false, first, n, trial);
        if (with_entries) {
          view_in.selected =
              DenseEntriesScope(s.Entries(s.tables.data(), pages.data()), format, first);
          indexed_in.selected = Indexed(entries, s);
        }
        if (with_window) {
          view_in.window = RawWindowScope(s.Window(s.tables.data(), rings.data()), format, first);
          indexed_in.window = Indexed(window, s);
        }
        const size_t per_request = size_t{1} * heads * kV4Dims;
        std::vector<double> got(n * per_request, -1), want(n * per_request, -2);
        ExpectOk(ReferenceSparseAttention(view_in, got.data()));
        ExpectOk(ReferenceSparseAttention(indexed_in, want.data()));
        EXPECT_EQ(got, want) << "trial " << trial << " first " << first << " scopes " << scopes;
        for (int32_t b = 0; b < n; ++b) {
          const size_t rows = (with_entries ? s.EntryOffsets(first + b).size() : 0) +
                              (with_window ? s.WindowOffsets(first + b).size() : 0);
          if (rows > 0) continue;
          EXPECT_TRUE(std::all_of(got.begin() + b * per_request,
                                  got.begin() + (b + 1) * per_request,
                                  [](double x) { return x == 0; }))
              << "request " << first + b << " has no rows";
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(EntryFormats, StoreScopeReferenceTest,
                         ::testing::Values(KVRowFormat::kFp8Entry584, KVRowFormat::kMxfp4Entry368),
                         [](const ::testing::TestParamInfo<KVRowFormat>& info) {
                           return std::string(info.param == KVRowFormat::kFp8Entry584 ? "Fp8"
                                                                                      : "Mxfp4");
                         });

// The layout the test above relies on: the views count what the store holds (table row -1 and
// rows past *batch_size hold nothing, a ring that wrapped starts at its oldest token).
TEST(StoreScopeViewTest, CountsAndRowsFollowTheViews) {
  std::mt19937_64 rng(41);
  const StoreLayer s = RandomStoreLayer(KVRowFormat::kFp8Entry584, 5, rng);
  std::vector<std::byte> arena = s.arena;
  const std::vector<std::byte*> pages = s.Addresses(s.page_offset, arena.data());
  const std::vector<std::byte*> rings = s.Addresses(s.ring_offset, arena.data());
  const StoreScopeView entries =
      DenseEntriesScope(s.Entries(s.tables.data(), pages.data()), s.format, 1).store;
  const StoreScopeView window =
      RawWindowScope(s.Window(s.tables.data(), rings.data()), s.format, 1).store;
  EXPECT_EQ(entries.Count(0), 0);  // table row -1
  EXPECT_EQ(window.Count(0), 0);
  EXPECT_EQ(entries.Count(3), 0);  // past *batch_size
  EXPECT_EQ(window.Count(3), 0);
  for (int32_t b = 1; b < 3; ++b) {
    const std::vector<int64_t> e = s.EntryOffsets(1 + b), w = s.WindowOffsets(1 + b);
    ASSERT_EQ(entries.Count(b), static_cast<int32_t>(e.size()));
    ASSERT_EQ(window.Count(b), static_cast<int32_t>(w.size()));
    for (size_t k = 0; k < e.size(); ++k) EXPECT_EQ(entries.Row(b, k), arena.data() + e[k]);
    for (size_t k = 0; k < w.size(); ++k) EXPECT_EQ(window.Row(b, k), arena.data() + w[k]);
  }
}

TEST(StoreScopeViewTest, RejectsBadStoreScopes) {
  std::mt19937_64 rng(43);
  const StoreLayer s = RandomStoreLayer(KVRowFormat::kFp8Entry584, 2, rng);
  std::vector<std::byte> arena = s.arena;
  const std::vector<std::byte*> pages = s.Addresses(s.page_offset, arena.data());
  const std::vector<std::byte*> rings = s.Addresses(s.ring_offset, arena.data());
  const std::vector<uint16_t> q(size_t{2} * kV4Dims);
  std::vector<double> out(size_t{2} * kV4Dims);
  ReferenceAttentionInputs in;
  in.batch = 2;
  in.heads = 1;
  in.q = q.data();
  in.selected = DenseEntriesScope(s.Entries(s.tables.data(), pages.data()), s.format);
  in.window = RawWindowScope(s.Window(s.tables.data(), rings.data()), s.format);
  ExpectOk(ReferenceSparseAttention(in, out.data()));
  const auto rejected = [&](const ReferenceAttentionInputs& bad) {
    return ReferenceSparseAttention(bad, out.data()).code() == StatusCode::kInvalidArgument;
  };
  ReferenceAttentionInputs bad = in;
  bad.selected.store.first_row = -1;
  EXPECT_TRUE(rejected(bad));
  bad = in;
  bad.selected.store.entries.pages = nullptr;
  EXPECT_TRUE(rejected(bad));
  bad = in;
  bad.selected.store.entries.entry_tokens = 0;
  EXPECT_TRUE(rejected(bad));
  bad = in;
  bad.selected.store.entries.row_stride = 500;  // shorter than a 584-B entry
  EXPECT_TRUE(rejected(bad));
  bad = in;
  bad.window.store.window.raw_window = 0;
  EXPECT_TRUE(rejected(bad));
  bad = in;
  bad.window.store.window.batch_size = nullptr;
  EXPECT_TRUE(rejected(bad));
  bad = in;
  bad.window.store.source = 7;
  EXPECT_TRUE(rejected(bad));
  bad = in;
  bad.window.format = KVRowFormat::kFp8Row656;  // 576-dim keys beside 512-dim entries
  bad.window.store.window.row_stride = 656;
  EXPECT_TRUE(rejected(bad));
  // SparseEntryAttention::Run's checks take the same scopes (and only the two entry formats).
  const SparseEntryAttentionOptions options{.max_batch = 2, .heads = 1};
  ExpectOk(CheckSparseEntryAttentionArgs(options, 2, q.data(), in.selected, in.window, &out));
  bad = in;
  bad.selected.store.entries.page_rows = 0;
  EXPECT_EQ(
      CheckSparseEntryAttentionArgs(options, 2, q.data(), bad.selected, bad.window, &out).code(),
      StatusCode::kInvalidArgument);
  bad = in;
  bad.window.format = KVRowFormat::kFp8Row656;
  bad.window.store.window.row_stride = 656;
  EXPECT_EQ(
      CheckSparseEntryAttentionArgs(options, 2, q.data(), bad.selected, bad.window, &out).code(),
      StatusCode::kInvalidArgument);
}

// ---------------------------------------------------------------------------------------------
// The CUDA operator against the reference.

// Random inputs of one run.
struct AttentionInputs {
  std::vector<uint16_t> q;       // [batch, heads, 576] bf16
  std::vector<std::byte> rows;   // [kRows, row_stride]
  std::vector<int32_t> indices;  // [batch, top_k]
};

constexpr int kRows = 4096;

// One stored row of random data. Keys have an rms near 1, so that scores spread over a few units
// and the softmax is neither uniform nor one-hot. fp8 values use exponents 4..8 (magnitudes
// 2^-3 .. 3.75, no NaN codes); scales lie in [0.25, 1).
void RandomRow(KVRowFormat format, std::mt19937_64& rng, std::byte* row) {
  std::normal_distribution<float> normal;
  if (format == KVRowFormat::kBf16Row1152) {
    for (int d = 0; d < kMLAQKDim; ++d) {
      const uint16_t bits = ToBf16(normal(rng));
      std::memcpy(row + 2 * d, &bits, 2);
    }
    return;
  }
  std::uniform_int_distribution<int> exponent(4, 8);
  for (int d = 0; d < kMLAValueDim; ++d) {
    const int bits = static_cast<int>(rng() & 0x87) | exponent(rng) << 3;  // sign, mantissa
    row[d] = static_cast<std::byte>(bits);
  }
  std::uniform_real_distribution<float> scale(0.25f, 1.0f);
  for (int g = 0; g < mla_layout::kFp8Groups; ++g) {
    const float s = scale(rng);
    std::memcpy(row + mla_layout::kFp8ScalesOffset + 4 * g, &s, 4);
  }
  for (int r = 0; r < mla_layout::kRopeDims; ++r) {
    const uint16_t bits = ToBf16(normal(rng));
    std::memcpy(row + mla_layout::kFp8RopeOffset + 2 * r, &bits, 2);
  }
}

// Rows (random garbage in the stride padding, which must be ignored), queries, and indices with
// ~10% masked entries and ~5% explicit repeats of the previous entry (besides chance duplicates).
AttentionInputs RandomInputs(const SparseMLAOptions& options, int batch, int64_t row_stride,
                             std::mt19937_64& rng) {
  AttentionInputs in;
  in.rows.resize(kRows * row_stride);
  for (auto& b : in.rows) b = static_cast<std::byte>(rng());
  for (int r = 0; r < kRows; ++r) RandomRow(options.format, rng, &in.rows[r * row_stride]);
  std::normal_distribution<float> normal;
  in.q.resize(size_t{1} * batch * options.heads * kMLAQKDim);
  for (auto& x : in.q) x = ToBf16(normal(rng));
  std::uniform_int_distribution<int32_t> row(0, kRows - 1);
  std::uniform_real_distribution<double> coin(0, 1);
  in.indices.resize(size_t{1} * batch * options.top_k);
  for (size_t i = 0; i < in.indices.size(); ++i) {
    const double c = coin(rng);
    const bool repeat = c < 0.05 && i % options.top_k != 0;
    in.indices[i] = c > 0.9 ? -1 : repeat ? in.indices[i - 1] : row(rng);
  }
  return in;
}

// Runs the operator on `in` and returns the bf16 output of requests [0, batch + 1): the last one
// must still hold the poison.
std::vector<uint16_t> RunOnGpu(Backend& gpu, SparseMLAAttention& attention,
                               const AttentionInputs& in, int batch, int64_t row_stride) {
  const SparseMLAOptions& options = attention.options();
  DeviceBuffer q(gpu, in.q.size() * 2);
  DeviceBuffer rows(gpu, in.rows.size());
  DeviceBuffer indices(gpu, in.indices.size() * 4);
  DeviceBuffer out(gpu, size_t{2} * (batch + 1) * options.heads * kMLAValueDim);
  q.Upload(in.q);
  rows.Upload(in.rows);
  indices.Upload(in.indices);
  out.Fill(kNaNPoison);
  ExpectOk(attention.Run(batch, q.get(), rows.get(), row_stride, indices.get<int32_t>(), out.get(),
                         nullptr));
  ExpectOk(gpu.Synchronize(nullptr));
  return out.Download<uint16_t>();
}

using AttentionCase = std::tuple<KVRowFormat, int /*heads*/, int /*top_k*/, int /*batch*/>;

std::string AttentionCaseName(const ::testing::TestParamInfo<AttentionCase>& info) {
  const auto [format, heads, top_k, batch] = info.param;
  return std::string(format == KVRowFormat::kFp8Row656 ? "Fp8" : "Bf16") + "_H" +
         std::to_string(heads) + "_K" + std::to_string(top_k) + "_B" + std::to_string(batch);
}

class SparseMLAAttentionTest : public ::testing::TestWithParam<AttentionCase> {};

// Batch 3 also pads the row stride (1152 -> 1184, 656 -> 704), as a hot cache may.
TEST_P(SparseMLAAttentionTest, MatchesReferenceOnRandomInputs) {
  SPARSEKV_REQUIRE_GPU(gpu);
  const auto [format, heads, top_k, batch] = GetParam();
  const SparseMLAOptions options{
      .max_batch = batch + 1, .heads = heads, .top_k = top_k, .format = format};
  const int64_t row_stride =
      KVRowBytes(format) + (batch > 1 ? (format == KVRowFormat::kFp8Row656 ? 48 : 32) : 0);
  StatusOr<std::unique_ptr<SparseMLAAttention>> attention = SparseMLAAttention::Create(options);
  ASSERT_TRUE(attention.ok()) << attention.status().ToString();
  EXPECT_GT((*attention)->workspace_bytes(), 0);

  std::mt19937_64 rng(heads * 7919 + top_k * 31 + batch);
  // Two runs on the same object with fresh inputs: no result may depend on an earlier run.
  for (int trial = 0; trial < 2; ++trial) {
    const AttentionInputs in = RandomInputs(options, batch, row_stride, rng);
    const std::vector<uint16_t> out = RunOnGpu(*gpu, **attention, in, batch, row_stride);
    std::vector<double> ref(size_t{1} * batch * heads * kMLAValueDim);
    ExpectOk(ReferenceSparseMLA(options, batch, in.q.data(), in.rows.data(), row_stride,
                                in.indices.data(), ref.data()));
    const size_t per_request = size_t{1} * heads * kMLAValueDim;
    for (int b = 0; b < batch; ++b) {
      EXPECT_LT(RelativeError(&out[b * per_request], &ref[b * per_request], per_request), 1e-2)
          << "trial " << trial << " request " << b;
    }
    size_t poisoned = 0;
    for (size_t i = batch * per_request; i < out.size(); ++i) poisoned += out[i] == 0xFFFF;
    EXPECT_EQ(poisoned, per_request) << "a request past the batch was written";
  }
}

// Split attention as a transfer-hiding engine runs it: the rows of the "fill" entries hold NaN
// poison while RunHits runs (the miss copy is in flight), the real rows arrive, then
// RunFillsAndMerge. The merged output must match the reference like Run's does. Fill rows are
// chosen per stored row (a repeat of a missed row is a fill too); request 0 has no fills and
// request 1 only fills, when the batch has them.
TEST_P(SparseMLAAttentionTest, SplitRunMatchesReference) {
  SPARSEKV_REQUIRE_GPU(gpu);
  const auto [format, heads, top_k, batch] = GetParam();
  const int64_t row_stride = KVRowBytes(format);
  std::mt19937_64 rng(heads * 131 + top_k * 7 + batch);
  SparseMLAOptions options{
      .max_batch = batch + 1, .heads = heads, .top_k = top_k, .format = format};
  AttentionInputs in = RandomInputs(options, batch, row_stride, rng);
  // A stored row is either resident or being filled (a hit and a miss never share a slot);
  // request 0 reads only resident rows, request 1 only filled ones.
  std::vector<uint8_t> fill_row(kRows);
  for (int32_t r = 0; r < kRows; ++r) fill_row[r] = r % 5 == 0;
  std::vector<uint8_t> fill(in.indices.size(), 0);
  for (size_t i = 0; i < fill.size(); ++i) {
    const int b = static_cast<int>(i / top_k);
    int32_t& index = in.indices[i];
    if (index < 0) continue;
    if (b == 0 && fill_row[index]) index = (index + 1) % kRows;
    if (b == 1 && !fill_row[index]) index -= index % 5;
    fill[i] = fill_row[index];
  }
  std::vector<std::byte> poisoned_rows = in.rows;
  for (size_t i = 0; i < fill.size(); ++i) {
    if (fill[i]) std::memset(&poisoned_rows[in.indices[i] * row_stride], 0xFF, row_stride);
  }
  std::vector<double> ref(size_t{1} * batch * heads * kMLAValueDim);
  ExpectOk(ReferenceSparseMLA(options, batch, in.q.data(), in.rows.data(), row_stride,
                              in.indices.data(), ref.data()));
  const size_t per_request = size_t{1} * heads * kMLAValueDim;

  for (const auto split :
       {SparseMLAOptions::Split::kGatherFirst, SparseMLAOptions::Split::kMergeHalves}) {
    const bool merge = split == SparseMLAOptions::Split::kMergeHalves;
    SCOPED_TRACE(merge ? "kMergeHalves" : "kGatherFirst");
    options.split = split;
    StatusOr<std::unique_ptr<SparseMLAAttention>> attention = SparseMLAAttention::Create(options);
    ASSERT_TRUE(attention.ok()) << attention.status().ToString();
    DeviceBuffer q(*gpu, in.q.size() * 2);
    DeviceBuffer rows(*gpu, in.rows.size());
    DeviceBuffer indices(*gpu, in.indices.size() * 4);
    DeviceBuffer fill_mask(*gpu, fill.size());
    DeviceBuffer out(*gpu, size_t{2} * (batch + 1) * heads * kMLAValueDim);
    q.Upload(in.q);
    rows.Upload(poisoned_rows);
    indices.Upload(in.indices);
    fill_mask.Upload(fill);
    out.Fill(kNaNPoison);
    ExpectOk((*attention)
                 ->RunHits(batch, q.get(), rows.get(), row_stride, indices.get<int32_t>(),
                           fill_mask.get<uint8_t>(), nullptr));
    ExpectOk(gpu->Synchronize(nullptr));
    rows.Upload(in.rows);  // the miss copy lands
    ExpectOk((*attention)
                 ->RunFillsAndMerge(batch, q.get(), rows.get(), row_stride, indices.get<int32_t>(),
                                    fill_mask.get<uint8_t>(), out.get(), nullptr));
    ExpectOk(gpu->Synchronize(nullptr));
    const std::vector<uint16_t> got = out.Download<uint16_t>();
    for (int b = 0; b < batch; ++b) {
      EXPECT_LT(RelativeError(&got[b * per_request], &ref[b * per_request], per_request), 1e-2)
          << "request " << b;
    }
    size_t poisoned = 0;
    for (size_t i = batch * per_request; i < got.size(); ++i) poisoned += got[i] == 0xFFFF;
    EXPECT_EQ(poisoned, per_request) << "a request past the batch was written";
    if (!merge) {
      // Gathering first changes only when rows are read: the output is Run's, bit for bit.
      EXPECT_EQ(got, RunOnGpu(*gpu, **attention, in, batch, row_stride));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, SparseMLAAttentionTest,
                         ::testing::Combine(::testing::Values(KVRowFormat::kBf16Row1152,
                                                              KVRowFormat::kFp8Row656),
                                            ::testing::Values(16, 128), ::testing::Values(64, 2048),
                                            ::testing::Values(1, 3)),
                         AttentionCaseName);

TEST(SparseMLAAttentionCudaTest, FullyMaskedRequestGivesZeros) {
  SPARSEKV_REQUIRE_GPU(gpu);
  const SparseMLAOptions options{
      .max_batch = 4, .heads = 16, .top_k = 64, .format = KVRowFormat::kFp8Row656};
  StatusOr<std::unique_ptr<SparseMLAAttention>> attention = SparseMLAAttention::Create(options);
  ASSERT_TRUE(attention.ok()) << attention.status().ToString();
  std::mt19937_64 rng(3);
  const int64_t row_stride = KVRowBytes(options.format);
  AttentionInputs in = RandomInputs(options, 3, row_stride, rng);
  std::fill(in.indices.begin() + options.top_k, in.indices.begin() + 2 * options.top_k, -1);
  const std::vector<uint16_t> out = RunOnGpu(*gpu, **attention, in, 3, row_stride);
  std::vector<double> ref(size_t{3} * options.heads * kMLAValueDim);
  ExpectOk(ReferenceSparseMLA(options, 3, in.q.data(), in.rows.data(), row_stride,
                              in.indices.data(), ref.data()));
  const size_t per_request = size_t{1} * options.heads * kMLAValueDim;
  for (size_t i = per_request; i < 2 * per_request; ++i) {
    ASSERT_EQ(DecodeBf16(out[i]), 0.0) << "element " << i - per_request << " of request 1";
  }
  for (int b : {0, 2}) {
    EXPECT_LT(RelativeError(&out[b * per_request], &ref[b * per_request], per_request), 1e-2);
  }
}

TEST(SparseMLAAttentionCudaTest, RejectsBadArguments) {
  SPARSEKV_REQUIRE_GPU(gpu);
  SparseMLAOptions options{
      .max_batch = 2, .heads = 16, .top_k = 64, .format = KVRowFormat::kBf16Row1152};
  StatusOr<std::unique_ptr<SparseMLAAttention>> attention = SparseMLAAttention::Create(options);
  ASSERT_TRUE(attention.ok()) << attention.status().ToString();
  DeviceBuffer buffer(*gpu, 1 << 20);
  std::byte* p = buffer.get();
  const auto* indices = buffer.get<int32_t>();
  EXPECT_EQ((*attention)->Run(3, p, p, 1152, indices, p, nullptr).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ((*attention)->Run(1, p, p, 1160, indices, p, nullptr).code(),
            StatusCode::kInvalidArgument);  // stride not a multiple of 16
  EXPECT_EQ((*attention)->Run(1, p, p + 8, 1152, indices, p, nullptr).code(),
            StatusCode::kInvalidArgument);  // misaligned rows
  EXPECT_EQ((*attention)->Run(1, p, p, 1152, nullptr, p, nullptr).code(),
            StatusCode::kInvalidArgument);
  ExpectOk((*attention)->Run(0, nullptr, nullptr, 0, nullptr, nullptr, nullptr));
  options.top_k = 0;
  EXPECT_EQ(SparseMLAAttention::Create(options).status().code(), StatusCode::kInvalidArgument);
}

// ---------------------------------------------------------------------------------------------
// SparseEntryAttention: DeepSeek-V4's attention over entries on the GPU, against the float64
// oracle (ReferenceSparseAttention) at V4's shapes.

// The kernel's fp32 decoding (entry_decode.h) is kv_format.h's exact one, bit pattern for bit
// pattern: every e4m3, e2m1 and UE8M0 code, and whole entries of random bytes (NaN codes, scales
// 0 and 255 included; none above 246, where fp32 overflows) in both formats.
bool SameValue(float a, double b) { return std::isnan(a) ? std::isnan(b) : double{a} == b; }

TEST(EntryDecodeTest, EveryCodeDecodesAsTheExactDecoder) {
  for (int bits = 0; bits < 256; ++bits) {
    const auto b = static_cast<uint8_t>(bits);
    EXPECT_TRUE(SameValue(entry_decode::Fp8E4M3(b), DecodeFp8E4M3(b))) << bits;
    EXPECT_TRUE(SameValue(entry_decode::Ue8m0(b), DecodeUe8m0(b))) << bits;
    EXPECT_TRUE(SameValue(entry_decode::Fp4E2M1(b & 0xF), DecodeFp4E2M1(b))) << bits;
  }
}

template <KVRowFormat kFormat>
void ExpectEntriesDecodeExactly(uint64_t seed) {
  std::mt19937_64 rng(seed);
  const int32_t bytes = KVRowBytes(kFormat);
  std::vector<std::byte> row(bytes);
  std::vector<double> key(kV4Dims);
  for (int trial = 0; trial < 200; ++trial) {
    for (std::byte& x : row) x = std::byte{static_cast<uint8_t>(rng())};
    using L584 = Fp8Entry584Layout;
    using L368 = Mxfp4Entry368Layout;
    const bool fp8 = kFormat == KVRowFormat::kFp8Entry584;
    const int32_t first_scale = fp8 ? L584::kScalesOffset : L368::kScalesOffset;
    for (int32_t g = 0; g < (fp8 ? L584::kScales : L368::kScales); ++g) {
      auto& scale = reinterpret_cast<uint8_t&>(row[first_scale + g]);
      if (scale > 246 && scale != 255) scale -= 128;
    }
    DecodeKVRow(kFormat, row.data(), key.data());
    for (int d = 0; d < kV4Dims; ++d) {
      ASSERT_TRUE(SameValue(entry_decode::EntryDim<kFormat>(row.data(), d), key[d]))
          << "trial " << trial << " dim " << d;
    }
  }
}

TEST(EntryDecodeTest, EntriesOfRandomBytesDecodeAsDecodeKVRow) {
  ExpectEntriesDecodeExactly<KVRowFormat::kFp8Entry584>(31);
  ExpectEntriesDecodeExactly<KVRowFormat::kMxfp4Entry368>(32);
}

// Options and arguments are checked on the host, with or without a GPU.
TEST(SparseEntryAttentionTest, RejectsBadOptionsAndArguments) {
  EXPECT_TRUE(ValidateSparseEntryAttentionOptions({.max_batch = 4, .heads = 128}).ok());
  for (const SparseEntryAttentionOptions bad :
       {SparseEntryAttentionOptions{.max_batch = 0},
        SparseEntryAttentionOptions{.max_batch = 70000},
        SparseEntryAttentionOptions{.max_batch = 1, .heads = 0},
        SparseEntryAttentionOptions{.max_batch = 1, .softmax_scale = -1}}) {
    const Status s = ValidateSparseEntryAttentionOptions(bad);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("SparseEntryAttentionOptions."), std::string::npos) << s.message();
  }
  EXPECT_FLOAT_EQ(SparseEntryAttentionOptions{}.effective_softmax_scale(), 1 / std::sqrt(512.0f));

  const SparseEntryAttentionOptions options{.max_batch = 2, .heads = 8};
  std::byte rows[584] = {};
  const int32_t index = 0;
  const uint16_t q = 0;
  uint16_t out = 0;
  const AttentionScope selected{rows, 584, KVRowFormat::kFp8Entry584, &index, 1};
  const AttentionScope none;
  ExpectOk(CheckSparseEntryAttentionArgs(options, 1, &q, selected, none, &out));
  ExpectOk(CheckSparseEntryAttentionArgs(options, 0, nullptr, selected, none, nullptr));
  auto refused = [&](int32_t batch, const AttentionScope& sel, const AttentionScope& win,
                     const void* out_ptr, const std::string& what) {
    const Status s = CheckSparseEntryAttentionArgs(options, batch, &q, sel, win, out_ptr);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << what;
    EXPECT_NE(s.message().find(what), std::string::npos) << s.message();
  };
  refused(3, selected, none, &out, "batch 3");
  refused(1, none, none, &out, "both scopes are empty");
  refused(1, selected, none, nullptr, "null q or out");
  AttentionScope bad = selected;
  bad.format = KVRowFormat::kFp8Row656;  // 576-dim keys: not an entry
  refused(1, bad, none, &out, "selected.format");
  bad = selected;
  bad.format = KVRowFormat::kMxfp4Entry368;
  bad.row_stride = 360;
  refused(1, selected, bad, &out, "window.row_stride 360");
  bad = selected;
  bad.indices = nullptr;
  refused(1, bad, none, &out, "selected: null rows or indices");
  bad = selected;
  bad.width = -1;
  refused(1, bad, none, &out, "selected.width");
}

// Create needs a GPU: Unavailable without one (a build without CUDA, or no device), an operator
// with one.
TEST(SparseEntryAttentionTest, CreateIsUnavailableWithoutAGpu) {
  const StatusOr<std::unique_ptr<SparseEntryAttention>> attention =
      SparseEntryAttention::Create({.max_batch = 1, .heads = 64});
  if (CreateCudaBackend(0).ok()) {
    EXPECT_TRUE(attention.ok()) << attention.status().ToString();
  } else {
    EXPECT_EQ(attention.status().code(), StatusCode::kUnavailable) << attention.status().ToString();
  }
}

// One case: the selected entries' format, heads, top-k (entries of the selected scope), batch,
// and whether the heads have a sink. The window is 128 rows of 584-B entries.
using EntryCase = std::tuple<KVRowFormat, int /*heads*/, int /*top_k*/, int /*batch*/, bool>;

std::string EntryCaseName(const ::testing::TestParamInfo<EntryCase>& info) {
  const auto [format, heads, top_k, batch, sink] = info.param;
  return std::string(format == KVRowFormat::kFp8Entry584 ? "Fp8" : "Mxfp4") + "_H" +
         std::to_string(heads) + "_K" + std::to_string(top_k) + "_B" + std::to_string(batch) +
         (sink ? "_Sink" : "");
}

// Random inputs of a case, in host memory, with the oracle's view of them.
struct EntryCaseInputs {
  int32_t selected_stride = 0;
  Entries pool;                    // the selected scope's rows
  Entries ring;                    // the window's rows: request b's are rows [128 b, 128 b + 128)
  std::vector<int32_t> top;        // [batch, top_k]
  std::vector<int32_t> ring_rows;  // [batch, 128]
  std::vector<uint16_t> q;         // [batch, heads, 512]
  std::vector<float> sink;         // [heads] or empty
  std::vector<bool> all_masked;    // per request
};

constexpr int32_t kWindowRows = 128;

// Masked (10 %) and repeated (5 %) entries; request 1 is young (37 window rows), and the last of
// three or more requests has every entry of both scopes masked.
EntryCaseInputs RandomEntryInputs(const EntryCase& c, std::mt19937_64& rng) {
  const auto [format, heads, top_k, batch, with_sink] = c;
  EntryCaseInputs in;
  in.selected_stride = KVRowBytes(format) + (batch > 1 ? 8 : 0);  // padded rows too
  const int32_t pool_rows = std::min(2 * top_k, 4096);
  in.pool = RandomEntries(rng, pool_rows, in.selected_stride, format);
  in.ring = RandomEntries(rng, batch * kWindowRows, kEntryBytes);
  std::uniform_int_distribution<int32_t> row(0, pool_rows - 1);
  std::uniform_real_distribution<double> coin(0, 1);
  in.top.resize(size_t{1} * batch * top_k);
  for (size_t i = 0; i < in.top.size(); ++i) {
    const double x = coin(rng);
    in.top[i] = x > 0.9 ? -1 : x < 0.05 && i % top_k != 0 ? in.top[i - 1] : row(rng);
  }
  in.ring_rows.resize(size_t{1} * batch * kWindowRows);
  for (int32_t b = 0; b < batch; ++b) {
    for (int32_t i = 0; i < kWindowRows; ++i) {
      in.ring_rows[b * kWindowRows + i] = b == 1 && i >= 37 ? -1 : b * kWindowRows + i;
    }
  }
  in.all_masked.assign(batch, false);
  if (batch >= 3) {
    const int32_t last = batch - 1;
    std::fill_n(in.top.begin() + int64_t{last} * top_k, top_k, -1);
    std::fill_n(in.ring_rows.begin() + int64_t{last} * kWindowRows, kWindowRows, -1);
    in.all_masked[last] = true;
  }
  in.q = RandomQueries(rng, size_t{1} * batch * heads * kV4Dims);
  if (with_sink) {
    std::uniform_real_distribution<float> sigma(-2, 3);
    for (int32_t h = 0; h < heads; ++h) in.sink.push_back(sigma(rng));
  }
  return in;
}

class SparseEntryAttentionCudaTest : public ::testing::TestWithParam<EntryCase> {};

// The operator's output is within bf16 and fp32 rounding of the float64 oracle on every request;
// the output is poisoned before the run, one request past the batch included, which must keep
// its poison. Two runs with fresh inputs on one object.
TEST_P(SparseEntryAttentionCudaTest, MatchesTheOracle) {
  SPARSEKV_REQUIRE_GPU(gpu);
  const auto [format, heads, top_k, batch, with_sink] = GetParam();
  StatusOr<std::unique_ptr<SparseEntryAttention>> attention =
      SparseEntryAttention::Create({.max_batch = batch + 1, .heads = heads});
  ASSERT_TRUE(attention.ok()) << attention.status().ToString();
  std::mt19937_64 rng(heads * 7 + top_k * 13 + batch);
  for (int trial = 0; trial < 2; ++trial) {
    const EntryCaseInputs in = RandomEntryInputs(GetParam(), rng);
    DeviceBuffer q(*gpu, in.q.size() * 2);
    DeviceBuffer pool(*gpu, in.pool.rows.size());
    DeviceBuffer ring(*gpu, in.ring.rows.size());
    DeviceBuffer top(*gpu, in.top.size() * 4);
    DeviceBuffer ring_rows(*gpu, in.ring_rows.size() * 4);
    DeviceBuffer sink(*gpu, std::max<size_t>(in.sink.size(), 1) * 4);
    const size_t per_request = size_t{1} * heads * kV4Dims;
    DeviceBuffer out(*gpu, (batch + 1) * per_request * 2);
    q.Upload(in.q);
    pool.Upload(in.pool.rows);
    ring.Upload(in.ring.rows);
    top.Upload(in.top);
    ring_rows.Upload(in.ring_rows);
    if (with_sink) sink.Upload(in.sink);
    out.Fill(kNaNPoison);
    const AttentionScope selected{pool.get(), in.selected_stride, format, top.get<int32_t>(),
                                  top_k};
    const AttentionScope window{ring.get(), kEntryBytes, KVRowFormat::kFp8Entry584,
                                ring_rows.get<int32_t>(), kWindowRows};
    ExpectOk((*attention)
                 ->Run(batch, q.get(), selected, window, with_sink ? sink.get<float>() : nullptr,
                       out.get(), nullptr));
    ExpectOk(gpu->Synchronize(nullptr));
    const std::vector<uint16_t> got = out.Download<uint16_t>();

    ReferenceAttentionInputs ref_in;
    ref_in.batch = batch;
    ref_in.heads = heads;
    ref_in.q = in.q.data();
    ref_in.selected = {in.pool.rows.data(), in.selected_stride, format, in.top.data(), top_k};
    ref_in.window = {in.ring.rows.data(), kEntryBytes, KVRowFormat::kFp8Entry584,
                     in.ring_rows.data(), kWindowRows};
    ref_in.sink = with_sink ? in.sink.data() : nullptr;
    std::vector<double> ref(batch * per_request);
    ExpectOk(ReferenceSparseAttention(ref_in, ref.data()));
    for (int32_t b = 0; b < batch; ++b) {
      if (in.all_masked[b]) {
        for (size_t i = 0; i < per_request; ++i) {
          ASSERT_EQ(DecodeBf16(got[b * per_request + i]), 0.0) << "request " << b << " dim " << i;
        }
        continue;
      }
      EXPECT_LT(RelativeError(&got[b * per_request], &ref[b * per_request], per_request), 1e-2)
          << "trial " << trial << " request " << b;
    }
    size_t poisoned = 0;
    for (size_t i = batch * per_request; i < got.size(); ++i) poisoned += got[i] == 0xFFFF;
    EXPECT_EQ(poisoned, per_request) << "a request past the batch was written";
  }
}

// V4-Flash (64 heads, top-k 512) and V4-Pro (128 heads, top-k 1024), their per-GPU shares under
// tensor parallelism 8 (8 and 16 heads), an HCA layer's 8,192 entries at 1M tokens, both entry
// formats, with and without a sink.
INSTANTIATE_TEST_SUITE_P(V4Shapes, SparseEntryAttentionCudaTest,
                         ::testing::Values(EntryCase{KVRowFormat::kFp8Entry584, 64, 512, 3, true},
                                           EntryCase{KVRowFormat::kFp8Entry584, 128, 1024, 2, true},
                                           EntryCase{KVRowFormat::kFp8Entry584, 16, 1024, 3, false},
                                           EntryCase{KVRowFormat::kFp8Entry584, 8, 512, 1, true},
                                           EntryCase{KVRowFormat::kFp8Entry584, 128, 8192, 1, true},
                                           EntryCase{KVRowFormat::kFp8Entry584, 64, 512, 4, false},
                                           EntryCase{KVRowFormat::kMxfp4Entry368, 64, 512, 3, true},
                                           EntryCase{KVRowFormat::kMxfp4Entry368, 128, 1024, 2,
                                                     false}),
                         EntryCaseName);

#if defined(SPARSEKV_WITH_CUDA)
// Run captured into a CUDA graph on a stream of its own: the graph's launch writes the bytes the
// direct run wrote, and a replay after new queries are uploaded reads them (the graph holds the
// pointers, not the contents), matching the oracle.
TEST(SparseEntryAttentionCudaTest, CapturedGraphReplaysTheRun) {
  SPARSEKV_REQUIRE_GPU(gpu);
  const EntryCase c{KVRowFormat::kFp8Entry584, 64, 512, 2, true};
  const auto [format, heads, top_k, batch, with_sink] = c;
  StatusOr<std::unique_ptr<SparseEntryAttention>> attention =
      SparseEntryAttention::Create({.max_batch = batch, .heads = heads});
  ASSERT_TRUE(attention.ok()) << attention.status().ToString();
  StatusOr<StreamHandle> stream = gpu->CreateStream();
  ASSERT_TRUE(stream.ok()) << stream.status().ToString();
  std::mt19937_64 rng(23);
  const EntryCaseInputs in = RandomEntryInputs(c, rng);
  const size_t per_request = size_t{1} * heads * kV4Dims;
  DeviceBuffer q(*gpu, in.q.size() * 2), pool(*gpu, in.pool.rows.size()),
      ring(*gpu, in.ring.rows.size()), top(*gpu, in.top.size() * 4),
      ring_rows(*gpu, in.ring_rows.size() * 4), sink(*gpu, in.sink.size() * 4),
      out(*gpu, batch * per_request * 2);
  q.Upload(in.q);
  pool.Upload(in.pool.rows);
  ring.Upload(in.ring.rows);
  top.Upload(in.top);
  ring_rows.Upload(in.ring_rows);
  sink.Upload(in.sink);
  const AttentionScope selected{pool.get(), in.selected_stride, format, top.get<int32_t>(), top_k};
  const AttentionScope window{ring.get(), kEntryBytes, KVRowFormat::kFp8Entry584,
                              ring_rows.get<int32_t>(), kWindowRows};
  const auto run = [&] {
    return (*attention)
        ->Run(batch, q.get(), selected, window, sink.get<float>(), out.get(), *stream);
  };
  ExpectOk(run());
  ExpectOk(gpu->Synchronize(*stream));
  const std::vector<uint16_t> direct = out.Download<uint16_t>();

  out.Fill(kNaNPoison);
  testing::CapturedGraph graph;
  ExpectOk(graph.CaptureAndLaunch(static_cast<cudaStream_t>(*stream), run));
  ExpectOk(gpu->Synchronize(*stream));
  EXPECT_EQ(out.Download<uint16_t>(), direct);

  const std::vector<uint16_t> new_q = RandomQueries(rng, in.q.size());
  q.Upload(new_q);
  out.Fill(kNaNPoison);
  ExpectOk(graph.Launch(static_cast<cudaStream_t>(*stream)));
  ExpectOk(gpu->Synchronize(*stream));
  const std::vector<uint16_t> replayed = out.Download<uint16_t>();
  ReferenceAttentionInputs ref_in;
  ref_in.batch = batch;
  ref_in.heads = heads;
  ref_in.q = new_q.data();
  ref_in.selected = {in.pool.rows.data(), in.selected_stride, format, in.top.data(), top_k};
  ref_in.window = {in.ring.rows.data(), kEntryBytes, KVRowFormat::kFp8Entry584, in.ring_rows.data(),
                   kWindowRows};
  ref_in.sink = in.sink.data();
  std::vector<double> ref(batch * per_request);
  ExpectOk(ReferenceSparseAttention(ref_in, ref.data()));
  for (int32_t b = 0; b < batch; ++b) {
    EXPECT_LT(RelativeError(&replayed[b * per_request], &ref[b * per_request], per_request), 1e-2)
        << b;
  }
  gpu->DestroyStream(*stream);
}
#endif

// A window-only layer: no selected scope, the window alone, with a sink.
TEST(SparseEntryAttentionCudaTest, WindowOnlyLayer) {
  SPARSEKV_REQUIRE_GPU(gpu);
  const int32_t heads = 64, batch = 2;
  StatusOr<std::unique_ptr<SparseEntryAttention>> attention =
      SparseEntryAttention::Create({.max_batch = batch, .heads = heads});
  ASSERT_TRUE(attention.ok()) << attention.status().ToString();
  std::mt19937_64 rng(21);
  const Entries ring = RandomEntries(rng, batch * kWindowRows, kEntryBytes);
  std::vector<int32_t> ring_rows(batch * kWindowRows);
  for (size_t i = 0; i < ring_rows.size(); ++i) ring_rows[i] = static_cast<int32_t>(i);
  const std::vector<uint16_t> q = RandomQueries(rng, size_t{1} * batch * heads * kV4Dims);
  std::vector<float> sink(heads, 1.5f);
  DeviceBuffer q_d(*gpu, q.size() * 2), ring_d(*gpu, ring.rows.size()),
      rows_d(*gpu, ring_rows.size() * 4), sink_d(*gpu, sink.size() * 4),
      out_d(*gpu, size_t{2} * batch * heads * kV4Dims);
  q_d.Upload(q);
  ring_d.Upload(ring.rows);
  rows_d.Upload(ring_rows);
  sink_d.Upload(sink);
  out_d.Fill(kNaNPoison);
  const AttentionScope window{ring_d.get(), kEntryBytes, KVRowFormat::kFp8Entry584,
                              rows_d.get<int32_t>(), kWindowRows};
  ExpectOk((*attention)
               ->Run(batch, q_d.get(), AttentionScope{}, window, sink_d.get<float>(), out_d.get(),
                     nullptr));
  ExpectOk(gpu->Synchronize(nullptr));
  const std::vector<uint16_t> got = out_d.Download<uint16_t>();
  ReferenceAttentionInputs in;
  in.batch = batch;
  in.heads = heads;
  in.q = q.data();
  in.window = {ring.rows.data(), kEntryBytes, KVRowFormat::kFp8Entry584, ring_rows.data(),
               kWindowRows};
  in.sink = sink.data();
  std::vector<double> ref(got.size());
  ExpectOk(ReferenceSparseAttention(in, ref.data()));
  const size_t per_request = size_t{1} * heads * kV4Dims;
  for (int32_t b = 0; b < batch; ++b) {
    EXPECT_LT(RelativeError(&got[b * per_request], &ref[b * per_request], per_request), 1e-2) << b;
  }
}

// Store scopes on the GPU: the views' tables, page and ring addresses and the arena in device
// memory. For both entry formats, for the whole batch and from batch row 2: the output is within
// 1e-2 relative error of the oracle's (the same layer in host memory), requests without rows
// get zeros, the request past the batch keeps its poison, and the bytes equal those of the
// indexed form over the gathered rows with -1 padding (the end-to-end benchmark's full-hbm
// variant against its sparsekv variant).
TEST(SparseEntryAttentionCudaTest, StoreScopesMatchTheOracleAndTheIndexedFormsBytes) {
  SPARSEKV_REQUIRE_GPU(gpu);
  const int32_t heads = 16, batch = 6;
  StatusOr<std::unique_ptr<SparseEntryAttention>> attention =
      SparseEntryAttention::Create({.max_batch = batch, .heads = heads});
  ASSERT_TRUE(attention.ok()) << attention.status().ToString();
  std::mt19937_64 rng(47);
  for (const KVRowFormat format : {KVRowFormat::kFp8Entry584, KVRowFormat::kMxfp4Entry368}) {
    const StoreLayer s = RandomStoreLayer(format, batch, rng);
    DeviceBuffer arena(*gpu, s.arena.size()), tables(*gpu, s.tables.size() * 4);
    arena.Upload(s.arena);
    tables.Upload(s.tables);
    const std::vector<std::byte*> pages_h = s.Addresses(s.page_offset, arena.get());
    const std::vector<std::byte*> rings_h = s.Addresses(s.ring_offset, arena.get());
    DeviceBuffer pages(*gpu, pages_h.size() * sizeof(std::byte*)),
        rings(*gpu, rings_h.size() * sizeof(std::byte*));
    pages.Upload(pages_h);
    rings.Upload(rings_h);
    std::vector<std::byte> arena_h = s.arena;  // the oracle's copy, at host addresses
    const std::vector<std::byte*> host_pages = s.Addresses(s.page_offset, arena_h.data());
    const std::vector<std::byte*> host_rings = s.Addresses(s.ring_offset, arena_h.data());
    const std::vector<uint16_t> q = RandomQueries(rng, size_t{1} * batch * heads * kV4Dims);
    const std::vector<float> sink(heads, 0.75f);
    DeviceBuffer q_d(*gpu, q.size() * 2), sink_d(*gpu, sink.size() * 4);
    q_d.Upload(q);
    sink_d.Upload(sink);
    const size_t per_request = size_t{1} * heads * kV4Dims;
    for (const int32_t first : {0, 2}) {
      const int32_t n = batch - first;
      const auto run = [&](const AttentionScope& selected, const AttentionScope& window) {
        DeviceBuffer out(*gpu, (n + 1) * per_request * 2);
        out.Fill(kNaNPoison);
        ExpectOk((*attention)
                     ->Run(n, q_d.get<uint16_t>() + int64_t{first} * heads * kV4Dims, selected,
                           window, sink_d.get<float>(), out.get(), nullptr));
        ExpectOk(gpu->Synchronize(nullptr));
        return out.Download<uint16_t>();
      };
      const std::vector<uint16_t> got = run(
          DenseEntriesScope(s.Entries(tables.get<int32_t>(), pages.get<std::byte*>()), format,
                            first),
          RawWindowScope(s.Window(tables.get<int32_t>(), rings.get<std::byte*>()), format, first));

      const GatheredScope entries = Gather(s, true, first, n, 5);
      const GatheredScope window = Gather(s, false, first, n, 3);
      DeviceBuffer entry_rows(*gpu, entries.rows.size()),
          entry_index(*gpu, entries.indices.size() * 4), window_rows(*gpu, window.rows.size()),
          window_index(*gpu, window.indices.size() * 4);
      entry_rows.Upload(entries.rows);
      entry_index.Upload(entries.indices);
      window_rows.Upload(window.rows);
      window_index.Upload(window.indices);
      const std::vector<uint16_t> indexed =
          run({entry_rows.get(), s.stride, format, entry_index.get<int32_t>(), entries.width},
              {window_rows.get(), s.stride, format, window_index.get<int32_t>(), window.width});
      EXPECT_EQ(got, indexed) << "first " << first;

      ReferenceAttentionInputs ref_in;
      ref_in.batch = n;
      ref_in.heads = heads;
      ref_in.q = q.data() + int64_t{first} * heads * kV4Dims;
      ref_in.selected =
          DenseEntriesScope(s.Entries(s.tables.data(), host_pages.data()), format, first);
      ref_in.window = RawWindowScope(s.Window(s.tables.data(), host_rings.data()), format, first);
      ref_in.sink = sink.data();
      std::vector<double> ref(n * per_request);
      ExpectOk(ReferenceSparseAttention(ref_in, ref.data()));
      for (int32_t b = 0; b < n; ++b) {
        if (s.EntryOffsets(first + b).empty() && s.WindowOffsets(first + b).empty()) {
          for (size_t i = 0; i < per_request; ++i) {
            ASSERT_EQ(DecodeBf16(got[b * per_request + i]), 0.0) << "request " << first + b;
          }
          continue;
        }
        EXPECT_LT(RelativeError(&got[b * per_request], &ref[b * per_request], per_request), 1e-2)
            << "first " << first << " request " << b;
      }
      size_t poisoned = 0;
      for (size_t i = n * per_request; i < got.size(); ++i) poisoned += got[i] == 0xFFFF;
      EXPECT_EQ(poisoned, per_request) << "a request past the batch was written";
    }
  }
}

// ---------------------------------------------------------------------------------------------
// The weight-streaming proxy: sanity only (it computes nothing anyone reads).

TEST(WeightStreamProxyTest, SizesFollowTheRequest) {
  SPARSEKV_REQUIRE_GPU(gpu);
  constexpr int64_t kBytes = 8 << 20;
  StatusOr<std::unique_ptr<WeightStreamProxy>> proxy = WeightStreamProxy::Create(4, kBytes, 3);
  ASSERT_TRUE(proxy.ok()) << proxy.status().ToString();
  EXPECT_EQ((*proxy)->in_features(), kProxyHiddenDim);
  EXPECT_EQ((*proxy)->out_features() % 64, 0);
  EXPECT_EQ((*proxy)->bytes_per_layer(), int64_t{2} * kProxyHiddenDim * (*proxy)->out_features());
  EXPECT_LE(std::abs((*proxy)->bytes_per_layer() - kBytes), int64_t{kProxyHiddenDim} * 64);
  EXPECT_GE((*proxy)->device_bytes(), 3 * (*proxy)->bytes_per_layer());
  EXPECT_EQ(WeightStreamProxy::Create(4, kBytes, 0).status().code(), StatusCode::kInvalidArgument);
}

TEST(WeightStreamProxyTest, OutputIsLinearInTheInputAndWeightsRotate) {
  SPARSEKV_REQUIRE_GPU(gpu);
  constexpr int kMaxBatch = 4;
  constexpr int kBatch = 3;
  StatusOr<std::unique_ptr<WeightStreamProxy>> proxy =
      WeightStreamProxy::Create(kMaxBatch, 4 << 20, /*num_buffers=*/2);
  ASSERT_TRUE(proxy.ok()) << proxy.status().ToString();
  WeightStreamProxy& p = **proxy;
  const size_t inputs = size_t{kMaxBatch} * p.in_features();
  const size_t outputs = size_t{kBatch} * p.out_features();

  std::mt19937_64 rng(4);
  std::uniform_real_distribution<float> uniform(-1, 1);
  std::vector<uint16_t> x(inputs);
  std::vector<uint16_t> twice_x(inputs);
  for (size_t i = 0; i < inputs; ++i) {
    x[i] = ToBf16(uniform(rng));
    twice_x[i] = ToBf16(2 * static_cast<float>(DecodeBf16(x[i])));  // exact
  }
  // Runs layer `layer` on input `in`; returns the batch's output as float64.
  auto run = [&](const std::vector<uint16_t>& in, int layer) {
    ExpectOk(gpu->CopyAsync(p.input(), in.data(), inputs * 2, nullptr));
    ExpectOk(p.Run(kBatch, layer, nullptr));
    std::vector<uint16_t> y(outputs);
    ExpectOk(gpu->CopyAsync(y.data(), p.output(), outputs * 2, nullptr));
    ExpectOk(gpu->Synchronize(nullptr));
    std::vector<double> out(outputs);
    for (size_t i = 0; i < outputs; ++i) out[i] = DecodeBf16(y[i]);
    return out;
  };
  auto relative = [](const std::vector<double>& a, const std::vector<double>& b, double k) {
    double diff = 0;
    double norm = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      diff += (a[i] - k * b[i]) * (a[i] - k * b[i]);
      norm += k * b[i] * k * b[i];
    }
    return std::sqrt(diff / norm);
  };
  const std::vector<double> y0 = run(x, 0);
  double norm = 0;
  for (double v : y0) norm += v * v;
  EXPECT_GT(norm, 0.0);
  EXPECT_TRUE(std::isfinite(norm));
  EXPECT_LT(relative(run(twice_x, 0), y0, 2.0), 1e-3);  // linear in the input
  EXPECT_GT(relative(run(x, 1), y0, 1.0), 0.5);         // layer 1: the other weights
  EXPECT_LT(relative(run(x, 2), y0, 1.0), 1e-3);        // layer 2: layer 0's weights again
  EXPECT_EQ(p.Run(kMaxBatch + 1, 0, nullptr).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(p.Run(1, -1, nullptr).code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace sparsekv
