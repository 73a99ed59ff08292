// Gather + dequantise: the selected KV rows of a batch into a compact bf16 buffer [batch, top_k,
// 576], the dense operand of the attention GEMMs.
//
// Work decomposition: every row is cut into 16-B source pieces and each thread moves one piece, so
// loads and stores are 16 B wide and a warp's accesses are contiguous runs within one or two rows.
//   * kBf16Row1152: 72 pieces; piece c is output bytes [16c, 16c + 16), copied as is.
//   * kFp8Row656: 40 pieces. Pieces 0..31 hold 16 e4m3 values each (dims 16c .. 16c + 15), which
//     become 32 output bytes scaled by the group's fp32 scale (8 pieces share one); pieces 32..39
//     are the bf16 rope dims, copied as is. The 16 scale bytes are read by the value pieces.
// A masked entry (index < 0) writes zeros in place of its piece, so the GEMMs never see stale data;
// so does an entry outside the hits half of a split run, until the fills half writes it.
// One thread per piece (up to 9.4 M at batch 64, top_k 2048) keeps enough loads in flight to cover
// HBM latency without a persistent loop; the flat piece number fits in 32 bits by option
// validation.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "attention/mla_kernels.h"
#include "attention/row_layout.h"

namespace sparsekv::mla_cuda {
namespace {

constexpr int kThreads = 256;

// Output row: 576 bf16 = 72 uint4.
constexpr int kOutChunks = kMLAQKDim * 2 / 16;

template <KVRowFormat kFormat>
struct RowPieces;

template <>
struct RowPieces<KVRowFormat::kBf16Row1152> {
  static constexpr uint32_t kCount = mla_layout::kBf16RowBytes / 16;  // 72

  static __device__ __forceinline__ void Move(const std::byte* row, uint32_t c, uint4* out) {
    out[c] = __ldg(reinterpret_cast<const uint4*>(row) + c);
  }
  static __device__ __forceinline__ void Zero(uint32_t c, uint4* out) { out[c] = uint4{}; }
};

template <>
struct RowPieces<KVRowFormat::kFp8Row656> {
  static constexpr uint32_t kValuePieces = kMLAValueDim / 16;                  // 32
  static constexpr uint32_t kRopePieces = mla_layout::kRopeDims * 2 / 16;      // 8
  static constexpr uint32_t kCount = kValuePieces + kRopePieces;               // 40
  static constexpr uint32_t kPiecesPerGroup = mla_layout::kFp8GroupDims / 16;  // 8

  // Four e4m3 values (one 32-bit word, lowest byte first) times `scale`, as four bf16.
  static __device__ __forceinline__ uint2 Dequant4(uint32_t word, float scale) {
    const __half2 lo(
        __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(word & 0xFFFF), __NV_E4M3));
    const __half2 hi(
        __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(word >> 16), __NV_E4M3));
    const float2 flo = __half22float2(lo);
    const float2 fhi = __half22float2(hi);
    const __nv_bfloat162 blo = __floats2bfloat162_rn(flo.x * scale, flo.y * scale);
    const __nv_bfloat162 bhi = __floats2bfloat162_rn(fhi.x * scale, fhi.y * scale);
    uint2 out;
    out.x = *reinterpret_cast<const uint32_t*>(&blo);
    out.y = *reinterpret_cast<const uint32_t*>(&bhi);
    return out;
  }

  static __device__ __forceinline__ void Move(const std::byte* row, uint32_t c, uint4* out) {
    if (c < kValuePieces) {
      const uint4 packed = __ldg(reinterpret_cast<const uint4*>(row) + c);
      const float scale = __ldg(reinterpret_cast<const float*>(row + mla_layout::kFp8ScalesOffset) +
                                c / kPiecesPerGroup);
      const uint2 dims0 = Dequant4(packed.x, scale);  // dims 16c .. 16c + 3
      const uint2 dims4 = Dequant4(packed.y, scale);
      const uint2 dims8 = Dequant4(packed.z, scale);
      const uint2 dims12 = Dequant4(packed.w, scale);
      out[2 * c] = uint4{dims0.x, dims0.y, dims4.x, dims4.y};
      out[2 * c + 1] = uint4{dims8.x, dims8.y, dims12.x, dims12.y};
    } else {
      const uint32_t r = c - kValuePieces;
      out[2 * kValuePieces + r] =
          __ldg(reinterpret_cast<const uint4*>(row + mla_layout::kFp8RopeOffset) + r);
    }
  }
  static __device__ __forceinline__ void Zero(uint32_t c, uint4* out) {
    if (c < kValuePieces) {
      out[2 * c] = uint4{};
      out[2 * c + 1] = uint4{};
    } else {
      out[2 * kValuePieces + (c - kValuePieces)] = uint4{};
    }
  }
};

template <KVRowFormat kFormat>
__global__ void __launch_bounds__(kThreads) GatherDequantKernel(const GatherDequantView view) {
  using Pieces = RowPieces<kFormat>;
  const uint32_t piece_id = blockIdx.x * kThreads + threadIdx.x;
  const uint32_t entry = piece_id / Pieces::kCount;  // b * top_k + k
  const uint32_t c = piece_id % Pieces::kCount;
  if (entry >= static_cast<uint32_t>(view.batch) * static_cast<uint32_t>(view.top_k)) return;
  const int32_t index = __ldg(view.indices + entry);
  uint4* out = reinterpret_cast<uint4*>(view.keys) + static_cast<int64_t>(entry) * kOutChunks;
  const bool fill = view.part != FillPart::kAll && __ldg(view.fill + entry) != 0;
  if (view.part == FillPart::kFills && !fill) return;
  if (index < 0 || (view.part == FillPart::kHits && fill)) {
    Pieces::Zero(c, out);
  } else {
    Pieces::Move(view.kv_rows + index * view.row_stride, c, out);
  }
}

template <KVRowFormat kFormat>
cudaError_t Launch(const GatherDequantView& view, cudaStream_t stream) {
  const uint32_t pieces =
      static_cast<uint32_t>(view.batch) * view.top_k * RowPieces<kFormat>::kCount;
  const uint32_t blocks = (pieces + kThreads - 1) / kThreads;
  GatherDequantKernel<kFormat><<<blocks, kThreads, 0, stream>>>(view);
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchGatherDequant(KVRowFormat format, const GatherDequantView& view,
                                cudaStream_t stream) {
  if (reinterpret_cast<uintptr_t>(view.kv_rows) % 16 != 0 || view.row_stride % 16 != 0 ||
      view.batch < 0 || view.top_k < 0) {
    return cudaErrorInvalidValue;
  }
  if (view.batch == 0 || view.top_k == 0) return cudaSuccess;
  switch (format) {
    case KVRowFormat::kBf16Row1152:
      return Launch<KVRowFormat::kBf16Row1152>(view, stream);
    case KVRowFormat::kFp8Row656:
      return Launch<KVRowFormat::kFp8Row656>(view, stream);
    case KVRowFormat::kFp8Entry584:  // DeepSeek-V4 entries: not read by this operator
    case KVRowFormat::kMxfp4Entry368:
      break;
  }
  return cudaErrorInvalidValue;
}

}  // namespace sparsekv::mla_cuda
