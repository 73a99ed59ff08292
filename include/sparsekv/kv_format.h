// How a KV row is stored: the one row-format enum. The presets (options.h), the attention kernels
// (attention.h) and the tools' --precision flag all name it. Plain C++17, for nvcc as for the host
// compiler.
#pragma once

namespace sparsekv {

enum class KVRowFormat {
  // 1152 B: the 576 key dims as bf16.
  kBf16Row1152,
  // 656 B: 512 float8 e4m3 values, then 4 fp32 scales (one per group of 128 of those dims), then
  // the 64 rope dims as bf16. Dim d < 512 is e4m3[d] * scale[d / 128]; dim 512 + r is rope[r].
  kFp8Row656,
};

}  // namespace sparsekv
