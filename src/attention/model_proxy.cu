// WeightStreamProxy on CUDA: one cuBLAS bf16 GEMM per layer over rotating weight buffers.
//
// Y [B, n] = X [B, k] W^T with W row-major [n, k]; in cuBLAS's column-major terms
// Y^T [n, B] = W [n, k] (col-major [k, n], op T) * X^T [k, B]. At decode batch sizes this is a
// skinny GEMM whose time is the weight read: n * k * 2 bytes over HBM bandwidth.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "attention/cuda_status.h"
#include "sparsekv/model_proxy.h"

namespace sparsekv {
namespace {

using mla_cuda::Cublas;
using mla_cuda::DeviceBuffer;
using mla_cuda::DeviceGuard;

constexpr size_t kCublasWorkspaceBytes = size_t{32} << 20;
constexpr int64_t kOutFeaturesMultiple = 64;  // keeps the GEMM on full tensor-core tiles

// A deterministic pseudo-random value in [-amplitude, amplitude) per (seed, element): the
// splitmix64 finaliser of the element number.
__global__ void FillRandomBf16(__nv_bfloat16* data, int64_t n, uint64_t seed, float amplitude) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    uint64_t z = seed + static_cast<uint64_t>(i) * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    const float unit = static_cast<float>(z >> 40) * 0x1.0p-24f;  // [0, 1)
    data[i] = __float2bfloat16_rn((2.0f * unit - 1.0f) * amplitude);
  }
}

class CudaWeightStreamProxy final : public WeightStreamProxy {
 public:
  CudaWeightStreamProxy(int32_t max_batch, int32_t out_features, int device)
      : max_batch_(max_batch), out_features_(out_features), device_(device) {}

  ~CudaWeightStreamProxy() override {
    DeviceGuard guard(device_);
    if (cublas_ != nullptr) Cublas().destroy(cublas_);
    if (cublas_workspace_ != nullptr) cudaFree(cublas_workspace_);
  }

  // Allocates and fills everything; synchronises once so that the fills are done when Create
  // returns (and cannot leak into the caller's first timed step).
  Status Init(int32_t num_buffers) {
    DeviceGuard guard(device_);
    const int64_t weight_elements = int64_t{out_features_} * kProxyHiddenDim;
    const int64_t input_elements = int64_t{max_batch_} * kProxyHiddenDim;
    for (int32_t i = 0; i < num_buffers; ++i) {
      __nv_bfloat16* weights = nullptr;
      SPARSEKV_RETURN_IF_ERROR(Allocate(&weights, weight_elements));
      weights_.push_back(weights);
      // Roughly the scale of a trained layer's weights: outputs stay O(1) for O(1) inputs.
      SPARSEKV_RETURN_IF_ERROR(Fill(weights, weight_elements, /*seed=*/i + 1, 0.02f));
    }
    SPARSEKV_RETURN_IF_ERROR(Allocate(&input_, input_elements));
    SPARSEKV_RETURN_IF_ERROR(Fill(input_, input_elements, /*seed=*/0, 1.0f));
    SPARSEKV_RETURN_IF_ERROR(Allocate(&output_, int64_t{max_batch_} * out_features_));
    SPARSEKV_CUDA_RETURN_IF_ERROR(cudaMalloc(&cublas_workspace_, kCublasWorkspaceBytes));
    device_bytes_ += kCublasWorkspaceBytes;
    SPARSEKV_RETURN_IF_ERROR(mla_cuda::CreateCublas(&cublas_));
    SPARSEKV_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
    return Status::Ok();
  }

  Status SetSmCountTarget(int32_t sms) override {
    if (sms < 0) return InvalidArgument("SetSmCountTarget: sms must be >= 0");
    DeviceGuard guard(device_);
    SPARSEKV_MLA_CUBLAS_RETURN_IF_ERROR(Cublas().set_sm_count_target(cublas_, sms));
    return Status::Ok();
  }

  Status Run(int32_t batch, int32_t layer, StreamHandle stream_handle) override {
    if (batch < 0 || batch > max_batch_ || layer < 0) {
      return InvalidArgument("WeightStreamProxy::Run: batch " + std::to_string(batch) +
                             " outside [0, " + std::to_string(max_batch_) + "] or layer " +
                             std::to_string(layer) + " < 0");
    }
    if (batch == 0) return Status::Ok();
    DeviceGuard guard(device_);
    const __nv_bfloat16* weights = weights_[layer % weights_.size()];
    // cublasSetStream resets the workspace to cuBLAS's own pool: set ours again after it.
    SPARSEKV_MLA_CUBLAS_RETURN_IF_ERROR(
        Cublas().set_stream(cublas_, static_cast<cudaStream_t>(stream_handle)));
    SPARSEKV_MLA_CUBLAS_RETURN_IF_ERROR(
        Cublas().set_workspace(cublas_, cublas_workspace_, kCublasWorkspaceBytes));
    const float one = 1.0f;
    const float zero = 0.0f;
    SPARSEKV_MLA_CUBLAS_RETURN_IF_ERROR(
        Cublas().gemm_ex(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, /*m=*/out_features_, /*n=*/batch,
                         /*k=*/kProxyHiddenDim, &one, weights, CUDA_R_16BF, /*lda=*/kProxyHiddenDim,
                         input_, CUDA_R_16BF, /*ldb=*/kProxyHiddenDim, &zero, output_, CUDA_R_16BF,
                         /*ldc=*/out_features_, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    return Status::Ok();
  }

  int64_t bytes_per_layer() const override { return int64_t{out_features_} * kProxyHiddenDim * 2; }
  int64_t device_bytes() const override { return device_bytes_; }
  int32_t out_features() const override { return out_features_; }
  void* input() const override { return input_; }
  const void* output() const override { return output_; }

 private:
  // *ptr = `elements` bf16 in a new buffer of buffers_.
  Status Allocate(__nv_bfloat16** ptr, int64_t elements) {
    SPARSEKV_ASSIGN_OR_RETURN(
        DeviceBuffer buffer,
        DeviceBuffer::Allocate(static_cast<size_t>(elements) * sizeof(__nv_bfloat16),
                               "WeightStreamProxy"));
    *ptr = buffer.get<__nv_bfloat16>();
    device_bytes_ += static_cast<int64_t>(buffer.bytes());
    buffers_.push_back(std::move(buffer));
    return Status::Ok();
  }

  static Status Fill(__nv_bfloat16* data, int64_t elements, uint64_t seed, float amplitude) {
    constexpr int kThreads = 256;
    const int64_t blocks = std::min<int64_t>((elements + kThreads - 1) / kThreads, 65536);
    FillRandomBf16<<<static_cast<unsigned>(blocks), kThreads>>>(data, elements, seed, amplitude);
    SPARSEKV_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return Status::Ok();
  }

  const int32_t max_batch_;
  const int32_t out_features_;
  const int device_;
  cublasHandle_t cublas_ = nullptr;
  void* cublas_workspace_ = nullptr;
  std::vector<__nv_bfloat16*> weights_;  // num_buffers x [out_features, 7168]
  __nv_bfloat16* input_ = nullptr;       // [max_batch, 7168]
  __nv_bfloat16* output_ = nullptr;      // [max_batch, out_features]
  int64_t device_bytes_ = 0;
  std::vector<DeviceBuffer> buffers_;  // own the arrays above but cublas_workspace_
};

}  // namespace

StatusOr<std::unique_ptr<WeightStreamProxy>> WeightStreamProxy::Create(int32_t max_batch,
                                                                       int64_t bytes_per_layer,
                                                                       int32_t num_buffers,
                                                                       int device) {
  if (max_batch < 1 || bytes_per_layer < 1 || num_buffers < 1) {
    return InvalidArgument(
        "WeightStreamProxy: max_batch, bytes_per_layer and num_buffers must be "
        ">= 1");
  }
  // n = bytes / (2 k), to the nearest multiple of 64, at least 64 (and within cuBLAS's int).
  const int64_t tile_bytes = int64_t{2} * kProxyHiddenDim * kOutFeaturesMultiple;
  const int64_t out_features =
      std::max<int64_t>(1, (bytes_per_layer + tile_bytes / 2) / tile_bytes) * kOutFeaturesMultiple;
  if (out_features > (int64_t{1} << 30)) {
    return InvalidArgument("WeightStreamProxy: bytes_per_layer too large");
  }
  SPARSEKV_RETURN_IF_ERROR(mla_cuda::CheckDevice(device));
  auto proxy = std::make_unique<CudaWeightStreamProxy>(max_batch,
                                                       static_cast<int32_t>(out_features), device);
  SPARSEKV_RETURN_IF_ERROR(proxy->Init(num_buffers));
  return std::unique_ptr<WeightStreamProxy>(std::move(proxy));
}

}  // namespace sparsekv
