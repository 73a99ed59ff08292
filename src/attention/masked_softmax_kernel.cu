// Masked softmax over the scores of one (request, head) row per block, written as bf16 weights.
//
// The scores arrive pre-multiplied by softmax_scale * log2(e) (the GEMM's alpha), so the kernel
// works in base 2. Each thread folds its strided share of the row into a running (max, sum) pair,
// the block merges the pairs, and a second pass over the row (now in L1/L2) writes the normalised
// weights. Masked entries take no part and get weight 0; a row with no unmasked entry is all zeros.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "attention/mla_kernels.h"

namespace sparsekv::mla_cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

// Running softmax denominator: sum over the folded entries of exp2(score - max).
struct MaxSum {
  float max = -INFINITY;
  float sum = 0;

  __device__ __forceinline__ void Merge(float other_max, float other_sum) {
    const float m = fmaxf(max, other_max);
    if (m == -INFINITY) return;  // both empty; avoids exp2(-inf - -inf) = NaN
    sum = sum * exp2f(max - m) + other_sum * exp2f(other_max - m);
    max = m;
  }
};

__global__ void __launch_bounds__(kThreads) MaskedSoftmaxKernel(const MaskedSoftmaxView view) {
  const int64_t row = blockIdx.x;  // b * heads + h
  const int64_t b = row / view.heads;
  const float* scores = view.scores + row * view.top_k;
  const int32_t* indices = view.indices + b * view.top_k;
  __nv_bfloat16* probs = view.probs + row * view.top_k;
  const uint8_t* fill = view.fill + b * view.top_k;
  // Whether entry k takes part: a selected row in this run's half.
  const auto in_part = [&](int k) {
    if (__ldg(indices + k) < 0) return false;
    if (view.part == FillPart::kAll) return true;
    return (__ldg(fill + k) != 0) == (view.part == FillPart::kFills);
  };

  MaxSum acc;
  for (int k = threadIdx.x; k < view.top_k; k += kThreads) {
    if (in_part(k)) acc.Merge(scores[k], 1.0f);
  }
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) {
    const float other_max = __shfl_xor_sync(0xFFFFFFFF, acc.max, offset);
    const float other_sum = __shfl_xor_sync(0xFFFFFFFF, acc.sum, offset);
    acc.Merge(other_max, other_sum);
  }
  __shared__ float warp_max[kWarps];
  __shared__ float warp_sum[kWarps];
  if (threadIdx.x % 32 == 0) {
    warp_max[threadIdx.x / 32] = acc.max;
    warp_sum[threadIdx.x / 32] = acc.sum;
  }
  __syncthreads();
  MaxSum total;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) total.Merge(warp_max[w], warp_sum[w]);

  const float inv_sum = total.sum > 0 ? 1.0f / total.sum : 0.0f;
  for (int k = threadIdx.x; k < view.top_k; k += kThreads) {
    const float p = in_part(k) ? exp2f(scores[k] - total.max) * inv_sum : 0.0f;
    probs[k] = __float2bfloat16_rn(p);
  }
  if (view.lse != nullptr && threadIdx.x == 0) {
    view.lse[row] = total.sum > 0 ? total.max + log2f(total.sum) : -INFINITY;
  }
}

__global__ void __launch_bounds__(kThreads) MergeKernel(const MergeView view) {
  const int64_t row = blockIdx.x;  // b * heads + h
  const float lse_a = view.lse_a[row];
  const float lse_b = view.lse_b[row];
  const float m = fmaxf(lse_a, lse_b);
  // Both halves empty: zeros, as the unsplit attention gives a request with no selected row.
  const float w_a = m == -INFINITY ? 0.0f : exp2f(lse_a - m);
  const float w_b = m == -INFINITY ? 0.0f : exp2f(lse_b - m);
  const float inv = w_a + w_b > 0 ? 1.0f / (w_a + w_b) : 0.0f;
  const float* a = view.out_a + row * kMLAValueDim;
  const float* b = view.out_b + row * kMLAValueDim;
  __nv_bfloat16* out = view.out + row * kMLAValueDim;
  for (int d = threadIdx.x; d < kMLAValueDim; d += kThreads) {
    // A half with weight 0 may hold anything finite or not; it must not reach the sum.
    const float va = w_a > 0 ? w_a * a[d] : 0.0f;
    const float vb = w_b > 0 ? w_b * b[d] : 0.0f;
    out[d] = __float2bfloat16_rn((va + vb) * inv);
  }
}

}  // namespace

cudaError_t LaunchMaskedSoftmax(const MaskedSoftmaxView& view, cudaStream_t stream) {
  if (view.batch < 0 || view.heads < 0 || view.top_k < 0) return cudaErrorInvalidValue;
  const int64_t rows = int64_t{view.batch} * view.heads;
  if (rows == 0) return cudaSuccess;
  MaskedSoftmaxKernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(view);
  return cudaGetLastError();
}

cudaError_t LaunchMerge(const MergeView& view, cudaStream_t stream) {
  if (view.batch < 0 || view.heads < 0) return cudaErrorInvalidValue;
  const int64_t rows = int64_t{view.batch} * view.heads;
  if (rows == 0) return cudaSuccess;
  MergeKernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(view);
  return cudaGetLastError();
}

}  // namespace sparsekv::mla_cuda
