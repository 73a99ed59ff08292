#include "sparsekv/kv_format.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

namespace sparsekv {
namespace {

using L = Fp8Entry584Layout;

void StoreBf16(std::vector<std::byte>& row, int32_t offset, uint16_t bits) {
  std::memcpy(row.data() + offset, &bits, sizeof(bits));
}

TEST(KVFormatTest, ShapesOfTheThreeFormats) {
  EXPECT_EQ(KVRowBytes(KVRowFormat::kBf16Row1152), 1152);
  EXPECT_EQ(KVRowBytes(KVRowFormat::kFp8Row656), 656);
  EXPECT_EQ(KVRowBytes(KVRowFormat::kFp8Entry584), 584);
  const KVFormatShape v4 = FormatShape(KVRowFormat::kFp8Entry584);
  EXPECT_EQ(v4.latent_dims + v4.rope_dims, v4.key_dims);
  EXPECT_EQ(v4.key_dims, 512);
  EXPECT_EQ(v4.value_dims, 512);  // key and value are one vector
  EXPECT_EQ(FormatShape(KVRowFormat::kFp8Row656).key_dims, 576);
  EXPECT_FALSE(IsKVRowFormat(static_cast<KVRowFormat>(7)));
  EXPECT_EQ(KVRowBytes(KVRowFormat::kMxfp4Entry368), 368);
  const KVFormatShape fp4 = FormatShape(KVRowFormat::kMxfp4Entry368);
  EXPECT_EQ(fp4.latent_dims, 448);
  EXPECT_EQ(fp4.key_dims, 512);
  EXPECT_EQ(fp4.value_dims, 512);
  EXPECT_EQ(Mxfp4Entry368Layout::kScalesOffset, 224);
  EXPECT_EQ(Mxfp4Entry368Layout::kRopeOffset, 240);
}

TEST(KVFormatTest, Fp8E4M3Decoding) {
  EXPECT_EQ(DecodeFp8E4M3(0x00), 0.0);
  EXPECT_TRUE(std::signbit(DecodeFp8E4M3(0x80)));
  EXPECT_EQ(DecodeFp8E4M3(0x38), 1.0);  // exponent 7 = bias
  EXPECT_EQ(DecodeFp8E4M3(0xB8), -1.0);
  EXPECT_EQ(DecodeFp8E4M3(0x3C), 1.5);           // mantissa 4/8
  EXPECT_EQ(DecodeFp8E4M3(0x7E), 448.0);         // largest finite: 1.75 * 2^8
  EXPECT_EQ(DecodeFp8E4M3(0x08), 0x1.0p-6);      // smallest normal
  EXPECT_EQ(DecodeFp8E4M3(0x01), 0x1.0p-9);      // smallest subnormal
  EXPECT_EQ(DecodeFp8E4M3(0x07), 7 * 0x1.0p-9);  // largest subnormal
  EXPECT_TRUE(std::isnan(DecodeFp8E4M3(0x7F)));
  EXPECT_TRUE(std::isnan(DecodeFp8E4M3(0xFF)));
}

TEST(KVFormatTest, Bf16Decoding) {
  EXPECT_EQ(DecodeBf16(0x3F80), 1.0);
  EXPECT_EQ(DecodeBf16(0xC040), -3.0);
  EXPECT_EQ(DecodeBf16(EncodeBf16(0.1)), 0.10009765625);  // nearest bf16 of 0.1
}

TEST(KVFormatTest, Ue8m0IsAPowerOfTwoAnd255IsNaN) {
  EXPECT_EQ(DecodeUe8m0(127), 1.0);
  EXPECT_EQ(DecodeUe8m0(130), 8.0);
  EXPECT_EQ(DecodeUe8m0(0), std::ldexp(1.0, -127));
  EXPECT_EQ(DecodeUe8m0(254), std::ldexp(1.0, 127));
  EXPECT_TRUE(std::isnan(DecodeUe8m0(255)));
}

TEST(KVFormatTest, Fp8EncodingInvertsDecodingOnEveryFiniteValue) {
  for (int bits = 0; bits < 256; ++bits) {
    if ((bits & 0x7F) == 0x7F) continue;  // NaN
    EXPECT_EQ(EncodeFp8E4M3(DecodeFp8E4M3(static_cast<uint8_t>(bits))), bits) << bits;
  }
}

TEST(KVFormatTest, Fp8EncodingRoundsToNearestEvenAndSaturates) {
  EXPECT_EQ(DecodeFp8E4M3(EncodeFp8E4M3(1.0625)), 1.0);   // halfway 1 and 1.125: even mantissa
  EXPECT_EQ(DecodeFp8E4M3(EncodeFp8E4M3(1.1875)), 1.25);  // halfway 1.125 and 1.25: even
  EXPECT_EQ(DecodeFp8E4M3(EncodeFp8E4M3(1e6)), 448.0);
  EXPECT_EQ(DecodeFp8E4M3(EncodeFp8E4M3(-500)), -448.0);
  EXPECT_EQ(DecodeFp8E4M3(EncodeFp8E4M3(std::ldexp(3.0, -10))), std::ldexp(2.0, -9));  // tie
  EXPECT_TRUE(std::isnan(DecodeFp8E4M3(EncodeFp8E4M3(std::nan("")))));
}

TEST(KVFormatTest, Bf16EncodingInvertsDecodingAndRoundsToNearestEven) {
  for (uint32_t bits = 0; bits < 0x10000; bits += 7) {
    const uint16_t b = static_cast<uint16_t>(bits);
    if ((b & 0x7F80) == 0x7F80) continue;  // infinities and NaN
    EXPECT_EQ(EncodeBf16(DecodeBf16(b)), b) << bits;
  }
  EXPECT_EQ(DecodeBf16(EncodeBf16(1.0 + std::ldexp(1.0, -8))), 1.0);  // tie: even
  EXPECT_EQ(DecodeBf16(EncodeBf16(1.0 + 3 * std::ldexp(1.0, -8))), 1.0 + std::ldexp(1.0, -6));
}

// Bytes written by hand, decoded value for value.
TEST(KVFormatTest, Entry584DecodesEachDimFromItsBytes) {
  std::vector<std::byte> row(L::kBytes, std::byte{0});
  for (int d = 0; d < L::kLatentDims; ++d) {
    row[d] = std::byte{static_cast<uint8_t>(d % 2 == 0 ? 0x38 : 0xC4)};  // 1.0, -3.0
  }
  for (int g = 0; g < L::kScales; ++g) {
    row[L::kScalesOffset + g] = std::byte{static_cast<uint8_t>(124 + g)};  // 2^(g - 3)
  }
  for (int j = 0; j < L::kRopeDims; ++j) StoreBf16(row, L::kRopeOffset + 2 * j, 0x3FC0);  // 1.5
  std::vector<double> key(512);
  DecodeKVRow(KVRowFormat::kFp8Entry584, row.data(), key.data());
  for (int d = 0; d < L::kLatentDims; ++d) {
    EXPECT_EQ(key[d], (d % 2 == 0 ? 1.0 : -3.0) * std::ldexp(1.0, d / 64 - 3)) << d;
  }
  for (int j = 0; j < L::kRopeDims; ++j) EXPECT_EQ(key[448 + j], 1.5) << j;
}

TEST(KVFormatTest, Entry584NaNScaleSpoilsOnlyItsGroup) {
  std::vector<std::byte> row(L::kBytes, std::byte{0x38});  // every latent 1.0
  for (int g = 0; g < L::kScales; ++g) row[L::kScalesOffset + g] = std::byte{127};
  row[L::kScalesOffset + 2] = std::byte{255};
  for (int j = 0; j < L::kRopeDims; ++j) StoreBf16(row, L::kRopeOffset + 2 * j, 0);
  std::vector<double> key(512);
  DecodeKVRow(KVRowFormat::kFp8Entry584, row.data(), key.data());
  for (int d = 0; d < L::kLatentDims; ++d) {
    if (d / 64 == 2) {
      EXPECT_TRUE(std::isnan(key[d])) << d;
    } else {
      EXPECT_EQ(key[d], 1.0) << d;
    }
  }
}

// Dims that are e4m3 values times their group's power of two survive encoding exactly; the scale
// is the smallest power of two that fits the group's largest magnitude into e4m3.
TEST(KVFormatTest, Entry584EncodingIsExactOnRepresentableDims) {
  std::mt19937 rng(5);
  std::vector<double> key(512);
  for (int d = 0; d < L::kLatentDims; ++d) {
    const int group = d / 64;
    uint8_t bits = static_cast<uint8_t>(rng());
    if ((bits & 0x7F) == 0x7F) bits = 0x38;
    key[d] = DecodeFp8E4M3(bits) * std::ldexp(1.0, group - 4);
  }
  for (int g = 0; g < L::kScales; ++g) key[g * 64] = 448 * std::ldexp(1.0, g - 4);  // the max
  for (int j = 0; j < L::kRopeDims; ++j)
    key[448 + j] = DecodeBf16(static_cast<uint16_t>(rng()) & 0x3FFF);
  std::vector<std::byte> row(L::kBytes, std::byte{0xAB});
  EncodeKVRow(KVRowFormat::kFp8Entry584, key.data(), row.data());
  EXPECT_EQ(row[L::kPadOffset], std::byte{0});
  for (int g = 0; g < L::kScales; ++g) {
    EXPECT_EQ(static_cast<int>(row[L::kScalesOffset + g]), 127 + g - 4) << g;
  }
  std::vector<double> decoded(512);
  DecodeKVRow(KVRowFormat::kFp8Entry584, row.data(), decoded.data());
  for (int d = 0; d < 512; ++d) EXPECT_EQ(decoded[d], key[d]) << d;
}

TEST(KVFormatTest, Entry584EncodingIsWithinE4M3Rounding) {
  std::mt19937 rng(6);
  std::normal_distribution<double> normal(0, 3);
  std::vector<double> key(512);
  for (double& x : key) x = normal(rng);
  std::vector<std::byte> row(L::kBytes);
  EncodeKVRow(KVRowFormat::kFp8Entry584, key.data(), row.data());
  std::vector<double> decoded(512);
  DecodeKVRow(KVRowFormat::kFp8Entry584, row.data(), decoded.data());
  for (int d = 0; d < L::kLatentDims; ++d) {
    // Half a unit in the last place of e4m3 (3 mantissa bits), or of its subnormals.
    const double scale = DecodeUe8m0(static_cast<uint8_t>(row[L::kScalesOffset + d / 64]));
    const double ulp = std::ldexp(1.0, std::max(std::ilogb(std::abs(key[d]) / scale), -6) - 3);
    EXPECT_LE(std::abs(decoded[d] - key[d]), 0.5 * ulp * scale) << d;
  }
  for (int j = 0; j < L::kRopeDims; ++j) {
    EXPECT_LE(std::abs(decoded[448 + j] - key[448 + j]), std::abs(key[448 + j]) * 0x1p-8) << j;
  }
}

TEST(KVFormatTest, Fp4E2M1DecodesItsSixteenCodes) {
  const double magnitudes[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  for (int code = 0; code < 8; ++code) {
    EXPECT_EQ(DecodeFp4E2M1(static_cast<uint8_t>(code)), magnitudes[code]) << code;
    EXPECT_EQ(DecodeFp4E2M1(static_cast<uint8_t>(code | 8)), -magnitudes[code]) << code;
  }
  EXPECT_TRUE(std::signbit(DecodeFp4E2M1(0x8)));
  EXPECT_EQ(DecodeFp4E2M1(0xF3), 1.5);  // only the low 4 bits count
}

TEST(KVFormatTest, Fp4EncodingInvertsDecodingOnEveryCode) {
  for (int code = 0; code < 16; ++code) {
    EXPECT_EQ(EncodeFp4E2M1(DecodeFp4E2M1(static_cast<uint8_t>(code))), code) << code;
  }
}

TEST(KVFormatTest, Fp4EncodingRoundsToNearestEvenAndSaturates) {
  // Each midpoint goes to the neighbour with the even code.
  EXPECT_EQ(EncodeFp4E2M1(0.25), 0);
  EXPECT_EQ(EncodeFp4E2M1(0.75), 2);  // 1.0
  EXPECT_EQ(EncodeFp4E2M1(1.25), 2);  // 1.0
  EXPECT_EQ(EncodeFp4E2M1(1.75), 4);  // 2.0
  EXPECT_EQ(EncodeFp4E2M1(2.5), 4);   // 2.0
  EXPECT_EQ(EncodeFp4E2M1(3.5), 6);   // 4.0
  EXPECT_EQ(EncodeFp4E2M1(5.0), 6);   // 4.0
  EXPECT_EQ(EncodeFp4E2M1(-5.0), 0xE);
  // Off the midpoints: the nearest value.
  EXPECT_EQ(DecodeFp4E2M1(EncodeFp4E2M1(0.26)), 0.5);
  EXPECT_EQ(DecodeFp4E2M1(EncodeFp4E2M1(2.49)), 2.0);
  EXPECT_EQ(DecodeFp4E2M1(EncodeFp4E2M1(5.01)), 6.0);
  EXPECT_EQ(DecodeFp4E2M1(EncodeFp4E2M1(100)), 6.0);
  EXPECT_EQ(DecodeFp4E2M1(EncodeFp4E2M1(-100)), -6.0);
}

// Bytes written by hand, decoded value for value: the low nibble is the even dim.
TEST(KVFormatTest, Entry368DecodesEachDimFromItsNibbles) {
  using M = Mxfp4Entry368Layout;
  std::vector<std::byte> row(M::kBytes, std::byte{0});
  for (int i = 0; i < M::kScalesOffset; ++i) row[i] = std::byte{0xD2};  // dim 2i 1.0, 2i+1 -3.0
  for (int g = 0; g < M::kScales; ++g) {
    row[M::kScalesOffset + g] = std::byte{static_cast<uint8_t>(120 + g)};  // 2^(g - 7)
  }
  for (int j = 0; j < M::kRopeDims; ++j) StoreBf16(row, M::kRopeOffset + 2 * j, 0xBFC0);  // -1.5
  std::vector<double> key(512);
  DecodeKVRow(KVRowFormat::kMxfp4Entry368, row.data(), key.data());
  for (int d = 0; d < M::kLatentDims; ++d) {
    EXPECT_EQ(key[d], (d % 2 == 0 ? 1.0 : -3.0) * std::ldexp(1.0, d / 32 - 7)) << d;
  }
  for (int j = 0; j < M::kRopeDims; ++j) EXPECT_EQ(key[448 + j], -1.5) << j;
}

TEST(KVFormatTest, Entry368NaNScaleSpoilsOnlyItsGroup) {
  using M = Mxfp4Entry368Layout;
  std::vector<std::byte> row(M::kBytes, std::byte{0});
  for (int i = 0; i < M::kScalesOffset; ++i) row[i] = std::byte{0x22};  // every latent 1.0
  for (int g = 0; g < M::kScales; ++g) row[M::kScalesOffset + g] = std::byte{127};
  row[M::kScalesOffset + 13] = std::byte{255};
  std::vector<double> key(512);
  DecodeKVRow(KVRowFormat::kMxfp4Entry368, row.data(), key.data());
  for (int d = 0; d < M::kLatentDims; ++d) {
    if (d / 32 == 13) {
      EXPECT_TRUE(std::isnan(key[d])) << d;
    } else {
      EXPECT_EQ(key[d], 1.0) << d;
    }
  }
}

// Dims that are e2m1 values times their group's power of two survive encoding exactly, nibble
// for nibble; the scale is the smallest power of two that fits the group's largest magnitude.
TEST(KVFormatTest, Entry368EncodingIsExactOnRepresentableDims) {
  using M = Mxfp4Entry368Layout;
  std::mt19937 rng(7);
  std::vector<double> key(512);
  std::vector<uint8_t> codes(M::kLatentDims);
  for (int d = 0; d < M::kLatentDims; ++d) {
    codes[d] = d % 32 == 0 ? 0x7 : static_cast<uint8_t>(rng() & 0xF);  // 6.0: the group's max
    key[d] = DecodeFp4E2M1(codes[d]) * std::ldexp(1.0, d / 32 - 5);
  }
  for (int j = 0; j < M::kRopeDims; ++j)
    key[448 + j] = DecodeBf16(static_cast<uint16_t>(rng()) & 0xBFFF);
  std::vector<std::byte> row(M::kBytes, std::byte{0xAB});
  EncodeKVRow(KVRowFormat::kMxfp4Entry368, key.data(), row.data());
  for (int i = 0; i < M::kScalesOffset; ++i) {
    EXPECT_EQ(static_cast<int>(row[i]), codes[2 * i] | codes[2 * i + 1] << 4) << i;
  }
  for (int g = 0; g < M::kScales; ++g) {
    EXPECT_EQ(static_cast<int>(row[M::kScalesOffset + g]), 127 + g - 5) << g;
  }
  EXPECT_EQ(row[M::kPadOffset], std::byte{0});
  EXPECT_EQ(row[M::kPadOffset + 1], std::byte{0});
  std::vector<double> decoded(512);
  DecodeKVRow(KVRowFormat::kMxfp4Entry368, row.data(), decoded.data());
  for (int d = 0; d < 512; ++d) EXPECT_EQ(decoded[d], key[d]) << d;
}

TEST(KVFormatTest, Entry368EncodingIsWithinE2M1Rounding) {
  using M = Mxfp4Entry368Layout;
  std::mt19937 rng(8);
  std::normal_distribution<double> normal(0, 3);
  std::vector<double> key(512);
  for (double& x : key) x = normal(rng);
  key[40] = 0;                               // a zero among the others
  for (int d = 64; d < 96; ++d) key[d] = 0;  // an all-zero group: scale 1
  std::vector<std::byte> row(M::kBytes);
  EncodeKVRow(KVRowFormat::kMxfp4Entry368, key.data(), row.data());
  EXPECT_EQ(static_cast<int>(row[M::kScalesOffset + 2]), 127);
  std::vector<double> decoded(512);
  DecodeKVRow(KVRowFormat::kMxfp4Entry368, row.data(), decoded.data());
  for (int d = 0; d < M::kLatentDims; ++d) {
    // Half the spacing of e2m1 values around the scaled magnitude: 0.25 below 2, 0.5 below 4,
    // 1 above.
    const double scale = DecodeUe8m0(static_cast<uint8_t>(row[M::kScalesOffset + d / 32]));
    const double m = std::abs(key[d]) / scale;
    EXPECT_LE(m, 6.0) << d;
    const double half_step = m <= 2 ? 0.25 : m <= 4 ? 0.5 : 1.0;
    EXPECT_LE(std::abs(decoded[d] - key[d]), half_step * scale) << d;
  }
  for (int j = 0; j < M::kRopeDims; ++j) {
    EXPECT_LE(std::abs(decoded[448 + j] - key[448 + j]), std::abs(key[448 + j]) * 0x1p-8) << j;
  }
}

TEST(KVFormatTest, Row656EncodingRoundTripsThroughItsScales) {
  std::vector<double> key(576);
  for (int d = 0; d < 576; ++d) key[d] = (d % 7) - 3.0;
  std::vector<std::byte> row(656);
  EncodeKVRow(KVRowFormat::kFp8Row656, key.data(), row.data());
  std::vector<double> decoded(576);
  DecodeKVRow(KVRowFormat::kFp8Row656, row.data(), decoded.data());
  for (int d = 0; d < 576; ++d) EXPECT_NEAR(decoded[d], key[d], 3.0 / 16) << d;
}

}  // namespace
}  // namespace sparsekv
