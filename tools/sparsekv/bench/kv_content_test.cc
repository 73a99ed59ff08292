// The benchmark's synthetic KV content (kv_content.h), decoded on the CPU: every format's rows are
// valid rows of it with finite, bounded dims, their padding zero, and the 656-B and 1152-B rows
// unchanged (the figures measured with them stay comparable).
#include "tools/sparsekv/bench/kv_content.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstring>
#include <vector>

#include "sparsekv/kv_format.h"

namespace sparsekv::tools {
namespace {

std::vector<std::byte> Row(KVRowFormat format, int32_t request, int32_t layer, int32_t position) {
  const int32_t bytes = KVRowBytes(format);
  std::vector<std::byte> row(bytes);
  for (int32_t w = 0; w < bytes / 4; ++w) {
    const uint32_t word = KVContentWord(bytes, w, request, layer, position, 1);
    std::memcpy(row.data() + 4 * w, &word, 4);
  }
  return row;
}

TEST(KVContentTest, EveryFormatsRowsDecodeToFiniteBoundedDims) {
  for (KVRowFormat f : {KVRowFormat::kFp8Row656, KVRowFormat::kBf16Row1152,
                        KVRowFormat::kFp8Entry584, KVRowFormat::kMxfp4Entry368}) {
    ASSERT_TRUE(IsContentRowBytes(KVRowBytes(f)));
    const KVFormatShape shape = FormatShape(f);
    std::vector<double> key(shape.key_dims);
    double largest = 0;
    for (int32_t position = 0; position < 200; ++position) {
      const std::vector<std::byte> row = Row(f, position % 7, position % 3, position);
      DecodeKVRow(f, row.data(), key.data());
      for (int32_t d = 0; d < shape.key_dims; ++d) {
        ASSERT_TRUE(std::isfinite(key[d])) << KVRowBytes(f) << " dim " << d;
        largest = std::max(largest, std::abs(key[d]));
      }
      if (f == KVRowFormat::kFp8Entry584) {
        EXPECT_EQ(row[Fp8Entry584Layout::kPadOffset], std::byte{0});
      }
      if (f == KVRowFormat::kMxfp4Entry368) {
        EXPECT_EQ(row[Mxfp4Entry368Layout::kPadOffset], std::byte{0});
        EXPECT_EQ(row[Mxfp4Entry368Layout::kPadOffset + 1], std::byte{0});
      }
    }
    EXPECT_GT(largest, 0) << KVRowBytes(f);
    EXPECT_LE(largest, 6) << KVRowBytes(f);  // e2m1's largest at scale 1; e4m3 < 2 * 1.5
  }
  EXPECT_FALSE(IsContentRowBytes(576));
}

TEST(KVContentTest, RowsArePureFunctionsOfRequestLayerAndPosition) {
  EXPECT_EQ(Row(KVRowFormat::kFp8Entry584, 3, 5, 77), Row(KVRowFormat::kFp8Entry584, 3, 5, 77));
  EXPECT_NE(Row(KVRowFormat::kFp8Entry584, 3, 5, 77), Row(KVRowFormat::kFp8Entry584, 3, 5, 78));
  EXPECT_NE(Row(KVRowFormat::kFp8Entry584, 3, 5, 77), Row(KVRowFormat::kFp8Entry584, 3, 6, 77));
  EXPECT_NE(Row(KVRowFormat::kFp8Entry584, 3, 5, 77), Row(KVRowFormat::kFp8Entry584, 4, 5, 77));
}

// The first words of a 656-B row as the fill kernel wrote them before the entry formats (the
// content the measured results were taken with).
TEST(KVContentTest, The656ByteRowsAreUnchanged) {
  const uint64_t token = (uint64_t{2} << 40) ^ (uint64_t{1} << 32) ^ 9u;
  const uint64_t h0 = ContentMix(ContentMix(token ^ 1) + 0);
  EXPECT_EQ(KVContentWord(656, 0, 2, 1, 9, 1), static_cast<uint32_t>(h0) & 0xBFBFBFBFu);
  const uint64_t h128 = ContentMix(ContentMix(token ^ 1) + 128);
  const float scale = 0.5f + static_cast<float>(h128 & 0xFFFF) / 65536.0f;
  uint32_t bits;
  std::memcpy(&bits, &scale, 4);
  EXPECT_EQ(KVContentWord(656, 128, 2, 1, 9, 1), bits);
}

}  // namespace
}  // namespace sparsekv::tools
