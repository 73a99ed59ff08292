// SparseMLAAttention on CUDA: gather + dequantise, S = Q K^T (cuBLAS), masked softmax, O = P V
// (cuBLAS). Pipeline and buffer shapes:
//
//   indices [B, K] ─┐
//   kv rows ────────┴─► GatherDequant ─► keys [B, K, 576] bf16 (zero rows where masked)
//   q [B, H, 576] ──────────────────────► GEMM 1 (per request: [H, 576] x [576, K], alpha =
//                                         softmax_scale * log2 e) ─► scores [B, H, K] fp32
//   scores, indices ────────────────────► MaskedSoftmax ─► probs [B, H, K] bf16
//   probs, keys[:, :, 0:512] ───────────► GEMM 2 (per request: [H, K] x [K, 512]) ─► out [B, H,
//   512]
//
// cuBLAS is column-major and our buffers are row-major; a row-major [m, n] matrix is the column-
// major [n, m] one, so each GEMM is written for the transposed product:
//   GEMM 1: scores_b^T [K, H] = keys_b [K, 576] (col-major [576, K], op T) * q_b^T [576, H]
//   GEMM 2: out_b^T [512, H] = V_b^T [512, K] (col-major, ld 576) * probs_b^T [K, H]
// Both are strided-batched over the requests, bf16 inputs, fp32 accumulation (tensor cores).
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "attention/cuda_status.h"
#include "attention/mla_kernels.h"
#include "sparsekv/attention.h"

namespace sparsekv {
namespace {

using mla_cuda::Cublas;
using mla_cuda::DeviceBuffer;
using mla_cuda::DeviceGuard;

// cuBLAS workspace: the size NVIDIA recommends for Hopper. Set explicitly so that cuBLAS never
// allocates during graph capture.
constexpr size_t kCublasWorkspaceBytes = size_t{32} << 20;

constexpr float kLog2E = 1.44269504088896340736f;

class CudaSparseMLAAttention final : public SparseMLAAttention {
 public:
  CudaSparseMLAAttention(const SparseMLAOptions& options, int device)
      : options_(options), device_(device) {}

  ~CudaSparseMLAAttention() override {
    DeviceGuard guard(device_);
    if (cublas_ != nullptr) Cublas().destroy(cublas_);
    if (cublas_workspace_ != nullptr) cudaFree(cublas_workspace_);
  }

  Status Init() {
    DeviceGuard guard(device_);
    const int64_t entries = int64_t{options_.max_batch} * options_.top_k;
    const int64_t scores = entries * options_.heads;
    SPARSEKV_RETURN_IF_ERROR(Allocate(&keys_, entries * kMLAQKDim));
    SPARSEKV_RETURN_IF_ERROR(Allocate(&scores_, scores));
    SPARSEKV_RETURN_IF_ERROR(Allocate(&probs_, scores));
    const int64_t rows = int64_t{options_.max_batch} * options_.heads;
    for (int half = 0; half < 2 && options_.split == SparseMLAOptions::Split::kMergeHalves;
         ++half) {
      SPARSEKV_RETURN_IF_ERROR(Allocate(&partial_out_[half], rows * kMLAValueDim));
      SPARSEKV_RETURN_IF_ERROR(Allocate(&partial_lse_[half], rows));
    }
    SPARSEKV_CUDA_RETURN_IF_ERROR(cudaMalloc(&cublas_workspace_, kCublasWorkspaceBytes));
    workspace_bytes_ += kCublasWorkspaceBytes;
    SPARSEKV_RETURN_IF_ERROR(mla_cuda::CreateCublas(&cublas_));
    return Status::Ok();
  }

  Status SetSmCountTarget(int32_t sms) override {
    if (sms < 0) return InvalidArgument("SetSmCountTarget: sms must be >= 0");
    DeviceGuard guard(device_);
    SPARSEKV_MLA_CUBLAS_RETURN_IF_ERROR(Cublas().set_sm_count_target(cublas_, sms));
    return Status::Ok();
  }

  Status Run(int32_t batch, const void* q, const std::byte* kv_rows, int64_t row_stride,
             const int32_t* indices, void* out, StreamHandle stream) override {
    return RunPart(mla_cuda::FillPart::kAll, batch, q, kv_rows, row_stride, indices, nullptr, out,
                   stream);
  }

  Status RunHits(int32_t batch, const void* q, const std::byte* kv_rows, int64_t row_stride,
                 const int32_t* indices, const uint8_t* fill, StreamHandle stream) override {
    if (fill == nullptr) return InvalidArgument("SparseMLAAttention::RunHits: fill is null");
    const bool gather_only = options_.split == SparseMLAOptions::Split::kGatherFirst;
    return RunPart(mla_cuda::FillPart::kHits, batch, q, kv_rows, row_stride, indices, fill, nullptr,
                   stream, gather_only);
  }

  Status RunFillsAndMerge(int32_t batch, const void* q, const std::byte* kv_rows,
                          int64_t row_stride, const int32_t* indices, const uint8_t* fill,
                          void* out, StreamHandle stream) override {
    if (fill == nullptr) {
      return InvalidArgument("SparseMLAAttention::RunFillsAndMerge: fill is null");
    }
    if (options_.split == SparseMLAOptions::Split::kGatherFirst) {
      // The resident rows are in place: gather the others, then one pass over all entries.
      SPARSEKV_RETURN_IF_ERROR(RunPart(mla_cuda::FillPart::kFills, batch, q, kv_rows, row_stride,
                                       indices, fill, out, stream, /*gather_only=*/true));
      return RunPart(mla_cuda::FillPart::kAll, batch, q, kv_rows, row_stride, indices, nullptr, out,
                     stream, /*gather_only=*/false, /*gather=*/false);
    }
    SPARSEKV_RETURN_IF_ERROR(RunPart(mla_cuda::FillPart::kFills, batch, q, kv_rows, row_stride,
                                     indices, fill, out, stream));
    if (batch == 0) return Status::Ok();
    DeviceGuard guard(device_);
    const mla_cuda::MergeView merge{partial_out_[0],
                                    partial_lse_[0],
                                    partial_out_[1],
                                    partial_lse_[1],
                                    static_cast<__nv_bfloat16*>(out),
                                    batch,
                                    options_.heads};
    SPARSEKV_CUDA_RETURN_IF_ERROR(mla_cuda::LaunchMerge(merge, static_cast<cudaStream_t>(stream)));
    return Status::Ok();
  }

  int64_t workspace_bytes() const override { return workspace_bytes_; }
  const SparseMLAOptions& options() const override { return options_; }

 private:
  // One pass of the pipeline over the entries of `part`. kAll writes bf16 `out`; kHits and kFills
  // write their fp32 partial output and log-sum-exp into half 0 and 1 of the partial buffers.
  // gather_only: stop after the gather; gather = false: start after it (keys_ is complete).
  Status RunPart(mla_cuda::FillPart part, int32_t batch, const void* q, const std::byte* kv_rows,
                 int64_t row_stride, const int32_t* indices, const uint8_t* fill, void* out,
                 StreamHandle stream_handle, bool gather_only = false, bool gather = true) {
    if (batch < 0 || batch > options_.max_batch) {
      return InvalidArgument("SparseMLAAttention::Run: batch " + std::to_string(batch) +
                             " outside [0, " + std::to_string(options_.max_batch) + "]");
    }
    if (batch == 0) return Status::Ok();
    if (q == nullptr || kv_rows == nullptr || indices == nullptr ||
        (part != mla_cuda::FillPart::kHits && !gather_only && out == nullptr)) {
      return InvalidArgument("SparseMLAAttention::Run: null pointer");
    }
    if (reinterpret_cast<uintptr_t>(kv_rows) % 16 != 0 || row_stride % 16 != 0 ||
        row_stride < KVRowBytes(options_.format)) {
      return InvalidArgument(
          "SparseMLAAttention::Run: the row buffer must be 16-B aligned and row_stride a multiple "
          "of 16, at least the row size; got stride " +
          std::to_string(row_stride));
    }
    DeviceGuard guard(device_);
    const auto stream = static_cast<cudaStream_t>(stream_handle);
    const int heads = options_.heads;
    const int top_k = options_.top_k;
    const int half = part == mla_cuda::FillPart::kFills ? 1 : 0;

    mla_cuda::GatherDequantView gather_view{kv_rows, row_stride, indices, keys_, batch, top_k};
    gather_view.fill = fill;
    gather_view.part = part;
    if (gather) {
      SPARSEKV_CUDA_RETURN_IF_ERROR(
          mla_cuda::LaunchGatherDequant(options_.format, gather_view, stream));
    }
    if (gather_only) return Status::Ok();

    // cublasSetStream resets the workspace to cuBLAS's own pool: set ours again after it.
    SPARSEKV_MLA_CUBLAS_RETURN_IF_ERROR(Cublas().set_stream(cublas_, stream));
    SPARSEKV_MLA_CUBLAS_RETURN_IF_ERROR(
        Cublas().set_workspace(cublas_, cublas_workspace_, kCublasWorkspaceBytes));

    // scores = (softmax_scale * log2 e) * q . k, for the softmax's exp2.
    const float score_alpha = options_.effective_softmax_scale() * kLog2E;
    const float one = 1.0f;
    const float zero = 0.0f;
    SPARSEKV_MLA_CUBLAS_RETURN_IF_ERROR(Cublas().gemm_strided_batched_ex(
        cublas_, CUBLAS_OP_T, CUBLAS_OP_N, /*m=*/top_k, /*n=*/heads, /*k=*/kMLAQKDim, &score_alpha,
        keys_, CUDA_R_16BF, /*lda=*/kMLAQKDim, /*strideA=*/int64_t{top_k} * kMLAQKDim, q,
        CUDA_R_16BF, /*ldb=*/kMLAQKDim, /*strideB=*/int64_t{heads} * kMLAQKDim, &zero, scores_,
        CUDA_R_32F, /*ldc=*/top_k, /*strideC=*/int64_t{heads} * top_k, batch, CUBLAS_COMPUTE_32F,
        CUBLAS_GEMM_DEFAULT));

    mla_cuda::MaskedSoftmaxView softmax{scores_, indices, probs_, batch, heads, top_k};
    softmax.fill = fill;
    softmax.part = part;
    softmax.lse = part == mla_cuda::FillPart::kAll ? nullptr : partial_lse_[half];
    SPARSEKV_CUDA_RETURN_IF_ERROR(mla_cuda::LaunchMaskedSoftmax(softmax, stream));

    // The whole run writes bf16 `out`; a half writes its fp32 partial output.
    void* gemm_out = part == mla_cuda::FillPart::kAll ? out : partial_out_[half];
    const cudaDataType out_type = part == mla_cuda::FillPart::kAll ? CUDA_R_16BF : CUDA_R_32F;
    SPARSEKV_MLA_CUBLAS_RETURN_IF_ERROR(Cublas().gemm_strided_batched_ex(
        cublas_, CUBLAS_OP_N, CUBLAS_OP_N, /*m=*/kMLAValueDim, /*n=*/heads, /*k=*/top_k, &one,
        keys_, CUDA_R_16BF, /*lda=*/kMLAQKDim, /*strideA=*/int64_t{top_k} * kMLAQKDim, probs_,
        CUDA_R_16BF, /*ldb=*/top_k, /*strideB=*/int64_t{heads} * top_k, &zero, gemm_out, out_type,
        /*ldc=*/kMLAValueDim, /*strideC=*/int64_t{heads} * kMLAValueDim, batch, CUBLAS_COMPUTE_32F,
        CUBLAS_GEMM_DEFAULT));
    return Status::Ok();
  }

  // *ptr = `elements` T in a new buffer of buffers_.
  template <typename T>
  Status Allocate(T** ptr, int64_t elements) {
    SPARSEKV_ASSIGN_OR_RETURN(
        DeviceBuffer buffer,
        DeviceBuffer::Allocate(static_cast<size_t>(elements) * sizeof(T), "SparseMLAAttention"));
    *ptr = buffer.get<T>();
    workspace_bytes_ += static_cast<int64_t>(buffer.bytes());
    buffers_.push_back(std::move(buffer));
    return Status::Ok();
  }

  const SparseMLAOptions options_;
  const int device_;
  cublasHandle_t cublas_ = nullptr;
  void* cublas_workspace_ = nullptr;
  __nv_bfloat16* keys_ = nullptr;   // [max_batch, top_k, 576] gathered, dequantised rows
  float* scores_ = nullptr;         // [max_batch, heads, top_k] scaled logits, base 2
  __nv_bfloat16* probs_ = nullptr;  // [max_batch, heads, top_k] softmax weights
  // Split runs: per half (0: hits, 1: fills), the normalised partial output [max_batch, heads,
  // 512] and log2 of its softmax denominator [max_batch, heads].
  float* partial_out_[2] = {nullptr, nullptr};
  float* partial_lse_[2] = {nullptr, nullptr};
  int64_t workspace_bytes_ = 0;
  std::vector<DeviceBuffer> buffers_;  // own the arrays above but cublas_workspace_
};

}  // namespace

StatusOr<std::unique_ptr<SparseMLAAttention>> SparseMLAAttention::Create(
    const SparseMLAOptions& options, int device) {
  SPARSEKV_RETURN_IF_ERROR(ValidateSparseMLAOptions(options));
  SPARSEKV_RETURN_IF_ERROR(mla_cuda::CheckDevice(device));
  auto attention = std::make_unique<CudaSparseMLAAttention>(options, device);
  SPARSEKV_RETURN_IF_ERROR(attention->Init());
  return std::unique_ptr<SparseMLAAttention>(std::move(attention));
}

}  // namespace sparsekv
