// How a KV row is stored: the one row-format enum, each format's byte layout, and its exact
// decoding. The presets (options.h), the attention kernels (attention.h), the CPU oracle and the
// tools' --precision flag all name it. Plain C++17, for nvcc as for the host compiler.
//
// A row is a token's KV in one layer (DSA models: DeepSeek-V3.2, GLM-5) or a compressed entry
// that summarises several tokens (DeepSeek-V4); both are "rows" here.
#pragma once

#include <cstddef>
#include <cstdint>

namespace sparsekv {

enum class KVRowFormat {
  // 1152 B: the 576 key dims as bf16.
  kBf16Row1152,
  // 656 B: 512 float8 e4m3 values, then 4 fp32 scales (one per group of 128 of those dims), then
  // the 64 rope dims as bf16. Dim d < 512 is e4m3[d] * scale[d / 128]; dim 512 + r is rope[r].
  kFp8Row656,
  // 584 B, one DeepSeek-V4 entry (FlashMLA's MODEL1_FP8Sparse, per entry): bytes [0, 448) float8
  // e4m3 latent values, [448, 576) the 64 rope dims as bf16, [576, 583) seven UE8M0 scales (one
  // per 64 latent dims), byte 583 zero. Dim d < 448 is e4m3[d] * 2^(scale[d / 64] - 127); dim
  // 448 + j is rope[j]. The 512 dims are both the key and the value. (FlashMLA's paged cache
  // stores a page's data bytes first and their scales after them; this is the per-entry form.)
  kFp8Entry584,
  // 368 B, one DeepSeek-V4 entry in MXFP4: bytes [0, 224) the 448 latent dims as e2m1, two per
  // byte (dim 2i in the low nibble of byte i, dim 2i + 1 in its high nibble), [224, 238) fourteen
  // UE8M0 scales (one per 32 latent dims), [238, 240) zero, [240, 368) the 64 rope dims as bf16.
  // Dim d < 448 is e2m1(nibble d) * 2^(scale[d / 32] - 127); dim 448 + j is rope[j]. The 512 dims
  // are both the key and the value. (The layout of SGLang's DeepSeek-V4 MXFP4 KV codec; see
  // docs/workload-shapes.md, "Sources".)
  kMxfp4Entry368,
};

// What a format holds: a key of key_dims dims, of which the first latent_dims are stored
// quantised (or as bf16 for kBf16Row1152) and the next rope_dims as bf16; the value is the key's
// first value_dims dims.
struct KVFormatShape {
  int32_t row_bytes;    // meaningful bytes of a row
  int32_t latent_dims;  // 512 (DSA) or 448 (V4)
  int32_t rope_dims;    // 64
  int32_t key_dims;     // latent_dims + rope_dims: 576 or 512
  int32_t value_dims;   // 512
};

constexpr KVFormatShape FormatShape(KVRowFormat format) {
  switch (format) {
    case KVRowFormat::kBf16Row1152:
      return {1152, 512, 64, 576, 512};
    case KVRowFormat::kFp8Row656:
      return {656, 512, 64, 576, 512};
    case KVRowFormat::kFp8Entry584:
      return {584, 448, 64, 512, 512};
    case KVRowFormat::kMxfp4Entry368:
      return {368, 448, 64, 512, 512};
  }
  return {0, 0, 0, 0, 0};
}

// Meaningful bytes of a row: 1152, 656, 584 or 368.
constexpr int32_t KVRowBytes(KVRowFormat format) { return FormatShape(format).row_bytes; }

// True for the formats named above (a value cast from an integer may be none of them).
constexpr bool IsKVRowFormat(KVRowFormat format) { return FormatShape(format).row_bytes > 0; }

// kFp8Entry584's byte offsets.
struct Fp8Entry584Layout {
  static constexpr int32_t kLatentDims = 448;
  static constexpr int32_t kRopeDims = 64;
  static constexpr int32_t kScaleGroupDims = 64;                         // latent dims per scale
  static constexpr int32_t kScales = kLatentDims / kScaleGroupDims;      // 7
  static constexpr int32_t kRopeOffset = kLatentDims;                    // 448
  static constexpr int32_t kScalesOffset = kRopeOffset + 2 * kRopeDims;  // 576
  static constexpr int32_t kPadOffset = kScalesOffset + kScales;         // 583, always zero
  static constexpr int32_t kBytes = kPadOffset + 1;                      // 584
};
static_assert(Fp8Entry584Layout::kBytes == 584, "the V4 entry is 584 B");

// kMxfp4Entry368's byte offsets.
struct Mxfp4Entry368Layout {
  static constexpr int32_t kLatentDims = 448;
  static constexpr int32_t kRopeDims = 64;
  static constexpr int32_t kScaleGroupDims = 32;                     // latent dims per scale
  static constexpr int32_t kScales = kLatentDims / kScaleGroupDims;  // 14
  static constexpr int32_t kScalesOffset = kLatentDims / 2;          // 224: two dims per byte
  static constexpr int32_t kPadOffset = kScalesOffset + kScales;     // 238, two zero bytes
  static constexpr int32_t kRopeOffset = kPadOffset + 2;             // 240
  static constexpr int32_t kBytes = kRopeOffset + 2 * kRopeDims;     // 368
};
static_assert(Mxfp4Entry368Layout::kBytes == 368, "the V4 MXFP4 entry is 368 B");

// ---- Exact decoding (host code; the CPU oracle and the tests use it) ----

// bf16: the top half of an IEEE float.
double DecodeBf16(uint16_t bits);
// float8 e4m3 (OCP "E4M3FN"): sign, 4-bit exponent with bias 7, 3-bit mantissa; exponent 0 is
// subnormal (mantissa * 2^-9); 0x7F and 0xFF are NaN; there is no infinity (max 448).
double DecodeFp8E4M3(uint8_t bits);
// UE8M0 (the OCP microscaling scale): 2^(e - 127); e = 255 is NaN.
double DecodeUe8m0(uint8_t bits);
// float4 e2m1 (OCP MXFP4's element), the low 4 bits of `bits`: bit 3 the sign, bits 0-2 index
// the magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6. There is no NaN and no infinity.
double DecodeFp4E2M1(uint8_t bits);

// Decodes the FormatShape(format).key_dims dims of one stored row into key[0, key_dims), exactly.
// REQUIRES: IsKVRowFormat(format); `row` holds KVRowBytes(format) bytes; `key` has key_dims
// doubles.
void DecodeKVRow(KVRowFormat format, const std::byte* row, double* key);

// ---- Encoding (for tests and tools that need rows of known content) ----

// Round to nearest, ties to even; NaN stays NaN. bf16 keeps the float range; e4m3 saturates to
// +-448 (it has no infinity).
uint16_t EncodeBf16(double value);
uint8_t EncodeFp8E4M3(double value);
// To the nearest e2m1 value (ties to the even code: 0.25 -> 0, 0.75 -> 1, 1.25 -> 1, 1.75 -> 2,
// 2.5 -> 2, 3.5 -> 4, 5 -> 4), saturating to +-6; the result is in the low 4 bits.
// REQUIRES: value is not NaN (e2m1 has none).
uint8_t EncodeFp4E2M1(double value);

// Writes KVRowBytes(format) bytes of `row` from key[0, key_dims): the rope dims (and every dim of
// kBf16Row1152) rounded to bf16, the quantised dims with per-group scales chosen so that the
// group's largest magnitude fits e4m3 (kFp8Row656: fp32 scale amax / 448; kFp8Entry584: the
// smallest power of two >= amax / 448, so that DecodeKVRow returns each dim within e4m3's
// rounding, and exactly where a dim is an e4m3 value times that power of two; kMxfp4Entry368: the
// smallest power of two >= amax / 6, the same for e2m1). An all-zero group gets scale 1 (UE8M0
// 127). REQUIRES: IsKVRowFormat(format); the key dims are finite.
void EncodeKVRow(KVRowFormat format, const double* key, std::byte* row);

}  // namespace sparsekv
