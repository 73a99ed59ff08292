// DeepSeek-V4 entries decoded one dim at a time in fp32, for the CUDA kernel and for the host test
// that holds them to kv_format.h's exact decoding (DecodeKVRow). The codes decode exactly; a
// latent dim is an e4m3 or e2m1 value times a UE8M0 power of two, exact in fp32 (down to its
// subnormals) unless it overflows: for scale bytes above 246 (e4m3: 448 * 2^120 > FLT_MAX) or
// 252 (e2m1), fp32 gives infinity where the double is finite. An encoder writes such scales
// only for keys beyond fp32's range.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "sparsekv/kernel_views.h"  // SPARSEKV_HD
#include "sparsekv/kv_format.h"

namespace sparsekv::entry_decode {

SPARSEKV_HD inline float FloatFromBits(uint32_t bits) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(bits);
#else
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
#endif
}

SPARSEKV_HD inline float Nan() { return FloatFromBits(0x7FC00000u); }

// DecodeFp8E4M3.
SPARSEKV_HD inline float Fp8E4M3(uint8_t bits) {
  if ((bits & 0x7F) == 0x7F) return Nan();
  const int exponent = (bits >> 3) & 0xF;
  const int mantissa = bits & 0x7;
  // 0.mmm * 2^-6 for subnormals, 1.mmm * 2^(e - 7) otherwise: an integer times a power of two.
  const float magnitude = exponent == 0
                              ? mantissa * FloatFromBits((127u - 9) << 23)
                              : (8 + mantissa) * FloatFromBits(uint32_t(127 + exponent - 10) << 23);
  return (bits & 0x80) != 0 ? -magnitude : magnitude;
}

// DecodeFp4E2M1: magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6 by the low three bits.
SPARSEKV_HD inline float Fp4E2M1(uint8_t code) {
  const int exponent = (code >> 1) & 0x3;
  const int mantissa = code & 0x1;
  const float magnitude = exponent == 0
                              ? 0.5f * mantissa
                              : (2 + mantissa) * FloatFromBits(uint32_t(127 + exponent - 2) << 23);
  return (code & 0x8) != 0 ? -magnitude : magnitude;
}

// DecodeUe8m0: 2^(e - 127), NaN for 255; 2^-127 is an fp32 subnormal.
SPARSEKV_HD inline float Ue8m0(uint8_t bits) {
  if (bits == 0xFF) return Nan();
  return bits == 0 ? FloatFromBits(0x00400000u) : FloatFromBits(uint32_t{bits} << 23);
}

// A little-endian bf16 at any alignment.
SPARSEKV_HD inline float Bf16At(const std::byte* at) {
  const uint32_t bits =
      uint32_t{static_cast<uint8_t>(at[0])} | uint32_t{static_cast<uint8_t>(at[1])} << 8;
  return FloatFromBits(bits << 16);
}

// Dim d in [0, 512) of an entry of kFormat (kFp8Entry584 or kMxfp4Entry368): DecodeKVRow's
// key[d], in fp32.
template <KVRowFormat kFormat>
SPARSEKV_HD inline float EntryDim(const std::byte* row, int d) {
  static_assert(kFormat == KVRowFormat::kFp8Entry584 || kFormat == KVRowFormat::kMxfp4Entry368,
                "a DeepSeek-V4 entry");
  if constexpr (kFormat == KVRowFormat::kFp8Entry584) {
    using L = Fp8Entry584Layout;
    if (d >= L::kLatentDims) return Bf16At(row + L::kRopeOffset + 2 * (d - L::kLatentDims));
    const uint8_t scale = static_cast<uint8_t>(row[L::kScalesOffset + d / L::kScaleGroupDims]);
    return Fp8E4M3(static_cast<uint8_t>(row[d])) * Ue8m0(scale);
  } else {
    using L = Mxfp4Entry368Layout;
    if (d >= L::kLatentDims) return Bf16At(row + L::kRopeOffset + 2 * (d - L::kLatentDims));
    const uint8_t pair = static_cast<uint8_t>(row[d / 2]);
    const uint8_t nibble = (d & 1) != 0 ? pair >> 4 : pair & 0xF;  // the even dim is the low one
    const uint8_t scale = static_cast<uint8_t>(row[L::kScalesOffset + d / L::kScaleGroupDims]);
    return Fp4E2M1(nibble) * Ue8m0(scale);
  }
}

}  // namespace sparsekv::entry_decode
