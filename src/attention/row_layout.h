// Byte layout of the KV row formats of sparsekv/attention.h, shared by the CUDA kernels and the CPU
// reference.
#pragma once

#include <cstdint>

#include "sparsekv/attention.h"

namespace sparsekv::mla_layout {

inline constexpr int32_t kRopeDims = kMLAQKDim - kMLAValueDim;  // 64

// kBf16Row1152: the 576 dims as bf16.
inline constexpr int32_t kBf16RowBytes = 2 * kMLAQKDim;  // 1152

// kFp8Row656: [512 e4m3][4 fp32 scales][64 bf16 rope].
inline constexpr int32_t kFp8GroupDims = 128;                        // dims sharing one scale
inline constexpr int32_t kFp8Groups = kMLAValueDim / kFp8GroupDims;  // 4
inline constexpr int32_t kFp8ScalesOffset = kMLAValueDim;            // 512
inline constexpr int32_t kFp8RopeOffset = kFp8ScalesOffset + 4 * kFp8Groups;  // 528
inline constexpr int32_t kFp8RowBytes = kFp8RopeOffset + 2 * kRopeDims;       // 656

static_assert(kBf16RowBytes == KVRowBytes(KVRowFormat::kBf16Row1152) &&
                  kFp8RowBytes == KVRowBytes(KVRowFormat::kFp8Row656),
              "kv_format.h and this layout name the same rows");

}  // namespace sparsekv::mla_layout
