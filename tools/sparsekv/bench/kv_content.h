// The synthetic KV content of the end-to-end benchmark, written once for the fill kernel
// (gpu_kernels.cu FillKVRows) and for the CPU tests that decode it (kv_content_test.cc). Row
// (request, layer, position) of a format is a pure function of those and a seed, a valid row of
// its format (kv_format.h) whose decoded dims are finite and small, so that every variant holds
// the same bytes for a token or entry and attention never sees NaN:
//   kFp8Row656:     e4m3 values of magnitude < 2 (exponent field <= 7, never 0x7F / 0xFF),
//                   fp32 scales in [0.5, 1.5), rope bf16 in (-1, 1);
//   kBf16Row1152:   bf16 in (-1, 1);
//   kFp8Entry584:   e4m3 as above, rope bf16 in (-1, 1), UE8M0 scales 2^-7 .. 2^0, pad byte zero;
//   kMxfp4Entry368: any e2m1 nibbles (|x| <= 6), UE8M0 scales 2^-7 .. 2^0, pad bytes zero, rope
//                   bf16 in (-1, 1).
// C++17, host and device (nvcc compiles it into the kernel).
#pragma once

#include <cstdint>
#include <cstring>

#include "sparsekv/kernel_views.h"  // SPARSEKV_HD

namespace sparsekv::tools {

SPARSEKV_HD inline uint64_t ContentMix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// bf16 bits of a value in (-1, 1) taken from 16 random bits: sign, exponent 2^-1 .. 2^-8,
// 7 mantissa bits. Never zero, never NaN.
SPARSEKV_HD inline uint32_t RandomBf16Bits(uint32_t bits) {
  const uint32_t sign = (bits & 0x8000u);
  const uint32_t exponent = 126u - ((bits >> 7) & 7u);  // bias 127: 2^-1 .. 2^-8
  return sign | (exponent << 7) | (bits & 0x7Fu);
}

// Two bf16 values in one word.
SPARSEKV_HD inline uint32_t Bf16PairWord(uint64_t h) {
  return RandomBf16Bits(static_cast<uint32_t>(h)) |
         (RandomBf16Bits(static_cast<uint32_t>(h >> 16)) << 16);
}

// Four UE8M0 scales in 120 .. 127 (2^-7 .. 2^0), the bytes of `zero_mask` (0xFF per byte) zero.
SPARSEKV_HD inline uint32_t Ue8m0Word(uint64_t h, uint32_t zero_mask) {
  const uint32_t scales = 0x78787878u | (static_cast<uint32_t>(h) & 0x07070707u);
  return scales & ~zero_mask;
}

// Whether FillKVRows (and KVContentWord) write rows of `row_bytes`: 656, 1152, 584 or 368.
SPARSEKV_HD inline bool IsContentRowBytes(int32_t row_bytes) {
  return row_bytes == 656 || row_bytes == 1152 || row_bytes == 584 || row_bytes == 368;
}

// The 4-byte word w (little-endian) of row (request, layer, position) of `row_bytes`.
// REQUIRES: IsContentRowBytes(row_bytes), 0 <= w < row_bytes / 4.
SPARSEKV_HD inline uint32_t KVContentWord(int32_t row_bytes, int32_t w, int32_t request,
                                          int32_t layer, int32_t position, uint64_t seed) {
  const uint64_t token =
      (uint64_t(uint32_t(request)) << 40) ^ (uint64_t(uint32_t(layer)) << 32) ^ uint32_t(position);
  const uint64_t h = ContentMix(ContentMix(token ^ seed) + uint64_t(w));
  // Four e4m3 bytes with exponent field 0..7 (magnitude < 2): never the NaN patterns 0x7F/0xFF.
  const uint32_t e4m3 = static_cast<uint32_t>(h) & 0xBFBFBFBFu;
  switch (row_bytes) {
    case 656:
      if (w < 128) return e4m3;
      if (w < 132) {
        const float scale = 0.5f + static_cast<float>(h & 0xFFFF) / 65536.0f;
        uint32_t bits;
        std::memcpy(&bits, &scale, sizeof(bits));
        return bits;
      }
      return Bf16PairWord(h);
    case 584:  // [0, 448) e4m3, [448, 576) rope, [576, 583) scales, byte 583 zero
      if (w < 112) return e4m3;
      if (w < 144) return Bf16PairWord(h);
      return Ue8m0Word(h, w == 145 ? 0xFF000000u : 0u);
    case 368:  // [0, 224) e2m1, [224, 238) scales, [238, 240) zero, [240, 368) rope
      if (w < 56) return static_cast<uint32_t>(h);
      if (w < 60) return Ue8m0Word(h, w == 59 ? 0xFFFF0000u : 0u);
      return Bf16PairWord(h);
    default:  // 1152: bf16
      return Bf16PairWord(h);
  }
}

}  // namespace sparsekv::tools
