// The row formats' exact decoding and their encoders (kv_format.h).
#include "sparsekv/kv_format.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

namespace sparsekv {
namespace {

// kFp8Row656's layout: [512 e4m3][4 fp32 scales][64 bf16 rope].
constexpr int32_t kRow656GroupDims = 128;
constexpr int32_t kRow656Groups = 4;
constexpr int32_t kRow656ScalesOffset = 512;
constexpr int32_t kRow656RopeOffset = kRow656ScalesOffset + 4 * kRow656Groups;  // 528
static_assert(kRow656RopeOffset + 2 * 64 == 656, "the DSA fp8 row is 656 B");

constexpr double kFp8Max = 448;  // the largest finite e4m3 magnitude
constexpr double kFp4Max = 6;    // the largest e2m1 magnitude

// e2m1's magnitudes, by the low three bits of the code.
constexpr double kFp4Magnitudes[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};

uint16_t LoadU16(const std::byte* at) {
  uint16_t bits;
  std::memcpy(&bits, at, sizeof(bits));
  return bits;
}

void StoreU16(std::byte* at, uint16_t bits) { std::memcpy(at, &bits, sizeof(bits)); }

// The largest magnitude of key[begin, begin + n).
double MaxMagnitude(const double* key, int32_t begin, int32_t n) {
  double amax = 0;
  for (int32_t d = begin; d < begin + n; ++d) amax = std::max(amax, std::abs(key[d]));
  return amax;
}

// The UE8M0 exponent byte of the smallest power of two p with amax / p <= element_max (127 for
// 0).
uint8_t Ue8m0ScaleFor(double amax, double element_max) {
  if (amax == 0) return 127;
  int k = static_cast<int>(std::ceil(std::log2(amax / element_max)));
  while (amax / std::ldexp(1.0, k) > element_max) ++k;  // log2's rounding, either way
  while (amax / std::ldexp(1.0, k - 1) <= element_max) --k;
  return static_cast<uint8_t>(std::clamp(k, -127, 127) + 127);
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

double DecodeUe8m0(uint8_t bits) {
  if (bits == 0xFF) return std::numeric_limits<double>::quiet_NaN();
  return std::ldexp(1.0, int{bits} - 127);
}

double DecodeFp4E2M1(uint8_t bits) {
  const double magnitude = kFp4Magnitudes[bits & 0x7];
  return (bits & 0x8) != 0 ? -magnitude : magnitude;
}

void DecodeKVRow(KVRowFormat format, const std::byte* row, double* key) {
  switch (format) {
    case KVRowFormat::kBf16Row1152:
      for (int d = 0; d < 576; ++d) key[d] = DecodeBf16(LoadU16(row + 2 * d));
      return;
    case KVRowFormat::kFp8Row656: {
      float scales[kRow656Groups];
      std::memcpy(scales, row + kRow656ScalesOffset, sizeof(scales));
      for (int d = 0; d < 512; ++d) {
        key[d] = DecodeFp8E4M3(static_cast<uint8_t>(row[d])) * scales[d / kRow656GroupDims];
      }
      for (int r = 0; r < 64; ++r)
        key[512 + r] = DecodeBf16(LoadU16(row + kRow656RopeOffset + 2 * r));
      return;
    }
    case KVRowFormat::kFp8Entry584: {
      using L = Fp8Entry584Layout;
      for (int d = 0; d < L::kLatentDims; ++d) {
        const uint8_t scale = static_cast<uint8_t>(row[L::kScalesOffset + d / L::kScaleGroupDims]);
        key[d] = DecodeFp8E4M3(static_cast<uint8_t>(row[d])) * DecodeUe8m0(scale);
      }
      for (int j = 0; j < L::kRopeDims; ++j) {
        key[L::kLatentDims + j] = DecodeBf16(LoadU16(row + L::kRopeOffset + 2 * j));
      }
      return;
    }
    case KVRowFormat::kMxfp4Entry368: {
      using L = Mxfp4Entry368Layout;
      for (int d = 0; d < L::kLatentDims; ++d) {
        const uint8_t pair = static_cast<uint8_t>(row[d / 2]);
        const uint8_t nibble = d % 2 == 0 ? pair & 0xF : pair >> 4;
        const uint8_t scale = static_cast<uint8_t>(row[L::kScalesOffset + d / L::kScaleGroupDims]);
        key[d] = DecodeFp4E2M1(nibble) * DecodeUe8m0(scale);
      }
      for (int j = 0; j < L::kRopeDims; ++j) {
        key[L::kLatentDims + j] = DecodeBf16(LoadU16(row + L::kRopeOffset + 2 * j));
      }
      return;
    }
  }
}

uint16_t EncodeBf16(double value) {
  if (std::isnan(value)) return 0x7FC0;
  const double magnitude = std::abs(value);
  const uint16_t sign = std::signbit(value) ? 0x8000 : 0;
  if (magnitude == 0) return sign;
  // The spacing of bf16 values around `magnitude`: 8 significant bits, subnormals below 2^-126.
  const int exponent = std::max(std::ilogb(magnitude), -126);
  const double quantum = std::ldexp(1.0, exponent - 7);
  const double rounded = std::nearbyint(magnitude / quantum) * quantum;  // ties to even
  if (rounded >= std::ldexp(1.0, 128)) return sign | 0x7F80;             // infinity
  const float exact = static_cast<float>(rounded);                       // a bf16 value: exact
  uint32_t bits;
  std::memcpy(&bits, &exact, sizeof(bits));
  return static_cast<uint16_t>(sign | (bits >> 16));
}

uint8_t EncodeFp8E4M3(double value) {
  if (std::isnan(value)) return 0x7F;
  const uint8_t sign = std::signbit(value) ? 0x80 : 0;
  const double magnitude = std::abs(value);
  if (magnitude >= kFp8Max) return sign | 0x7E;  // saturate: 0x7F is NaN
  if (magnitude < std::ldexp(1.0, -6)) {
    // Subnormals are multiples of 2^-9; 8 of them is the smallest normal, 0x08.
    return sign | static_cast<uint8_t>(std::nearbyint(std::ldexp(magnitude, 9)));
  }
  // In [2^-6, 448): 1.mmm * 2^e with e in [-6, 8], and rounding stays at or below 448.
  int exponent = std::ilogb(magnitude);
  int mantissa = static_cast<int>(std::nearbyint(std::ldexp(magnitude, 3 - exponent))) - 8;
  if (mantissa == 8) {
    ++exponent;
    mantissa = 0;
  }
  return sign | static_cast<uint8_t>(((exponent + 7) << 3) | mantissa);
}

uint8_t EncodeFp4E2M1(double value) {
  const uint8_t sign = std::signbit(value) ? 0x8 : 0;
  const double magnitude = std::abs(value);
  // The nearest magnitude; a tie is between neighbouring codes, and the even one wins.
  uint8_t code = 0;
  double best = magnitude;
  for (uint8_t c = 1; c < 8; ++c) {
    const double distance = std::abs(kFp4Magnitudes[c] - magnitude);
    if (distance < best || (distance == best && c % 2 == 0)) {
      code = c;
      best = distance;
    }
  }
  return static_cast<uint8_t>(sign | code);
}

void EncodeKVRow(KVRowFormat format, const double* key, std::byte* row) {
  switch (format) {
    case KVRowFormat::kBf16Row1152:
      for (int d = 0; d < 576; ++d) StoreU16(row + 2 * d, EncodeBf16(key[d]));
      return;
    case KVRowFormat::kFp8Row656: {
      float scales[kRow656Groups];
      for (int g = 0; g < kRow656Groups; ++g) {
        const double amax = MaxMagnitude(key, g * kRow656GroupDims, kRow656GroupDims);
        scales[g] = amax == 0 ? 1.0f : static_cast<float>(amax / kFp8Max);
      }
      for (int d = 0; d < 512; ++d) {
        row[d] = std::byte{EncodeFp8E4M3(key[d] / scales[d / kRow656GroupDims])};
      }
      std::memcpy(row + kRow656ScalesOffset, scales, sizeof(scales));
      for (int r = 0; r < 64; ++r)
        StoreU16(row + kRow656RopeOffset + 2 * r, EncodeBf16(key[512 + r]));
      return;
    }
    case KVRowFormat::kFp8Entry584: {
      using L = Fp8Entry584Layout;
      for (int g = 0; g < L::kScales; ++g) {
        const uint8_t scale =
            Ue8m0ScaleFor(MaxMagnitude(key, g * L::kScaleGroupDims, L::kScaleGroupDims), kFp8Max);
        row[L::kScalesOffset + g] = std::byte{scale};
        for (int d = g * L::kScaleGroupDims; d < (g + 1) * L::kScaleGroupDims; ++d) {
          row[d] = std::byte{EncodeFp8E4M3(key[d] / DecodeUe8m0(scale))};
        }
      }
      for (int j = 0; j < L::kRopeDims; ++j) {
        StoreU16(row + L::kRopeOffset + 2 * j, EncodeBf16(key[L::kLatentDims + j]));
      }
      row[L::kPadOffset] = std::byte{0};
      return;
    }
    case KVRowFormat::kMxfp4Entry368: {
      using L = Mxfp4Entry368Layout;
      std::memset(row, 0, L::kScalesOffset);
      for (int g = 0; g < L::kScales; ++g) {
        const uint8_t scale =
            Ue8m0ScaleFor(MaxMagnitude(key, g * L::kScaleGroupDims, L::kScaleGroupDims), kFp4Max);
        row[L::kScalesOffset + g] = std::byte{scale};
        for (int d = g * L::kScaleGroupDims; d < (g + 1) * L::kScaleGroupDims; ++d) {
          const uint8_t code = EncodeFp4E2M1(key[d] / DecodeUe8m0(scale));
          row[d / 2] |= std::byte{static_cast<uint8_t>(d % 2 == 0 ? code : code << 4)};
        }
      }
      row[L::kPadOffset] = std::byte{0};
      row[L::kPadOffset + 1] = std::byte{0};
      for (int j = 0; j < L::kRopeDims; ++j) {
        StoreU16(row + L::kRopeOffset + 2 * j, EncodeBf16(key[L::kLatentDims + j]));
      }
      return;
    }
  }
}

}  // namespace sparsekv
