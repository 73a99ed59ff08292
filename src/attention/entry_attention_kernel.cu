// DeepSeek-V4's decode attention over entries (entry_attention_kernel.h), one kernel:
//
//   grid  (ceil(heads / 16), batch); a block of 16 warps, one warp per query head
//   for each scope, selected then window, per tile of 16 of request b's entries of that scope
//   (its width for an indexed scope, StoreScopeView::Count(b) for a store scope):
//     1. the tile's row addresses (null where masked or past the count) into shared memory
//     2. every thread decodes dims of the tile's entries exactly (entry_decode.h: e4m3 or e2m1
//        times a UE8M0 power of two, bf16 rope) into fp32 keys [16][512] in shared memory;
//        masked ones are 0
//     3. each warp: the 16 scores of its head (a lane holds dims lane + 32 i, a shuffle sum),
//        then the online softmax update of its running max, denominator and 512-dim output
//   at the end: out = acc / l, times the sink's 1 / (1 + exp(sink - lse)); zeros if l is 0.
// A tile never spans the two scopes, and a tile with every entry masked changes nothing: an
// indexed scope whose -1 padding follows its entries gives the bytes of its store form.
//
// Written for correctness first: the entries are decoded once per block of 16 heads (4 times for
// 64 heads, 8 for 128) and the dot products run on CUDA cores; a FlashMLA-style kernel on tensor
// cores is what a tuned version would be (docs/deepseek-v4.md).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "attention/entry_attention_kernel.h"
#include "attention/entry_decode.h"
#include "sparsekv/kv_format.h"

namespace sparsekv::mla_cuda {
namespace {

constexpr int kDims = 512;                     // key = value dims of an entry
constexpr int kHeadsPerBlock = 16;             // one warp each
constexpr int kThreads = 32 * kHeadsPerBlock;  // 512
constexpr int kTile = 16;                      // entries in shared memory at a time
constexpr int kDimsPerLane = kDims / 32;       // 16: lane l holds dims l + 32 i

// Request b's entries of `scope`: as many as the loop over its tiles runs (block-uniform).
__device__ int ScopeCount(const EntryScopeView& scope, int b) {
  return scope.store.source != StoreScopeView::kNone ? scope.store.Count(b) : scope.width;
}

// The row of entry k < ScopeCount(scope, b) of request b, or null where it is masked.
__device__ const std::byte* ScopeRow(const EntryScopeView& scope, int b, int k) {
  if (scope.store.source != StoreScopeView::kNone) return scope.store.Row(b, k);
  const int32_t index = scope.indices[int64_t{b} * scope.width + k];
  return index < 0 ? nullptr : scope.rows + int64_t{index} * scope.row_stride;
}

// One warp's running softmax over the entries seen so far, for its head.
struct HeadState {
  float q[kDimsPerLane];
  float acc[kDimsPerLane];
  float running_max;  // of the scores seen so far
  float denominator;  // sum of exp(score - running_max)
};

// Steps 1-3 of the file's comment over every tile of request b's entries of `scope`. Every thread
// of the block calls it (the tiles' loads and barriers are the block's).
template <KVRowFormat kFormat>
__device__ __forceinline__ void AttendScope(const EntryScopeView& scope, int b, bool active,
                                            int lane, float softmax_scale,
                                            float (&keys)[kTile][kDims],
                                            const std::byte* (&rows)[kTile], HeadState& s) {
  const int count = ScopeCount(scope, b);
  for (int base = 0; base < count; base += kTile) {
    if (threadIdx.x < kTile) {
      const int k = base + threadIdx.x;
      rows[threadIdx.x] = k < count ? ScopeRow(scope, b, k) : nullptr;
    }
    __syncthreads();
    for (int e = threadIdx.x; e < kTile * kDims; e += kThreads) {
      const int k = e / kDims;
      const int d = e % kDims;
      const std::byte* row = rows[k];
      keys[k][d] = row != nullptr ? entry_decode::EntryDim<kFormat>(row, d) : 0.0f;
    }
    __syncthreads();

    if (active) {
      float score[kTile];
      float tile_max = -INFINITY;
#pragma unroll
      for (int k = 0; k < kTile; ++k) {
        score[k] = -INFINITY;
        if (rows[k] == nullptr) continue;  // the same for every lane: no divergence
        float partial = 0;
#pragma unroll
        for (int i = 0; i < kDimsPerLane; ++i) partial += s.q[i] * keys[k][lane + 32 * i];
#pragma unroll
        for (int offset = 16; offset > 0; offset /= 2) {
          partial += __shfl_xor_sync(0xFFFFFFFFu, partial, offset);
        }
        score[k] = softmax_scale * partial;
        tile_max = fmaxf(tile_max, score[k]);
      }
      if (tile_max > -INFINITY) {
        const float new_max = fmaxf(s.running_max, tile_max);
        const float correction = expf(s.running_max - new_max);  // 0 while nothing was seen
        s.denominator *= correction;
#pragma unroll
        for (int i = 0; i < kDimsPerLane; ++i) s.acc[i] *= correction;
#pragma unroll
        for (int k = 0; k < kTile; ++k) {
          if (rows[k] == nullptr) continue;
          const float p = expf(score[k] - new_max);
          s.denominator += p;
#pragma unroll
          for (int i = 0; i < kDimsPerLane; ++i) s.acc[i] += p * keys[k][lane + 32 * i];
        }
        s.running_max = new_max;
      }
    }
    __syncthreads();  // the next tile overwrites rows and keys
  }
}

template <KVRowFormat kSelected, KVRowFormat kWindow>
__global__ void __launch_bounds__(kThreads) EntryAttentionKernel(EntryAttentionView v) {
  __shared__ float keys[kTile][kDims];  // 32 KB
  __shared__ const std::byte* rows[kTile];

  const int b = blockIdx.y;
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int h = blockIdx.x * kHeadsPerBlock + warp;
  const bool active = h < v.heads;  // idle warps still take part in the tiles' decoding

  HeadState s;
  const __nv_bfloat16* q_row = v.q + (int64_t{b} * v.heads + (active ? h : 0)) * kDims;
#pragma unroll
  for (int i = 0; i < kDimsPerLane; ++i) {
    s.q[i] = __bfloat162float(q_row[lane + 32 * i]);
    s.acc[i] = 0;
  }
  s.running_max = -INFINITY;
  s.denominator = 0;
  AttendScope<kSelected>(v.selected, b, active, lane, v.softmax_scale, keys, rows, s);
  AttendScope<kWindow>(v.window, b, active, lane, v.softmax_scale, keys, rows, s);

  if (!active) return;
  __nv_bfloat16* out = v.out + (int64_t{b} * v.heads + h) * kDims;
  float factor = 0;  // every entry masked: zeros, with or without a sink
  if (s.denominator > 0) {
    factor = 1 / s.denominator;
    if (v.sink != nullptr) {
      const float lse = s.running_max + logf(s.denominator);
      factor /= 1 + expf(v.sink[h] - lse);
    }
  }
#pragma unroll
  for (int i = 0; i < kDimsPerLane; ++i) {
    out[lane + 32 * i] = __float2bfloat16_rn(s.acc[i] * factor);
  }
}

template <KVRowFormat kSelected, KVRowFormat kWindow>
cudaError_t Launch(const EntryAttentionView& view, cudaStream_t stream) {
  const dim3 grid((view.heads + kHeadsPerBlock - 1) / kHeadsPerBlock, view.batch);
  EntryAttentionKernel<kSelected, kWindow><<<grid, kThreads, 0, stream>>>(view);
  return cudaGetLastError();
}

bool IsEntryFormat(KVRowFormat format) {
  return format == KVRowFormat::kFp8Entry584 || format == KVRowFormat::kMxfp4Entry368;
}

}  // namespace

cudaError_t LaunchEntryAttention(KVRowFormat selected_format, KVRowFormat window_format,
                                 const EntryAttentionView& view, cudaStream_t stream) {
  if (view.batch < 0 || view.batch > 65535 || view.heads < 1 || view.selected.width < 0 ||
      view.window.width < 0) {
    return cudaErrorInvalidValue;
  }
  if (view.batch == 0) return cudaSuccess;
  // An empty scope's format is never read: take the other's, so that one instantiation serves.
  if (view.selected.empty()) selected_format = window_format;
  if (view.window.empty()) window_format = selected_format;
  if (!IsEntryFormat(selected_format) || !IsEntryFormat(window_format)) {
    return cudaErrorInvalidValue;  // unsupported: not a DeepSeek-V4 entry
  }
  constexpr KVRowFormat kFp8 = KVRowFormat::kFp8Entry584;
  constexpr KVRowFormat kFp4 = KVRowFormat::kMxfp4Entry368;
  if (selected_format == kFp8) {
    return window_format == kFp8 ? Launch<kFp8, kFp8>(view, stream)
                                 : Launch<kFp8, kFp4>(view, stream);
  }
  return window_format == kFp8 ? Launch<kFp4, kFp8>(view, stream)
                               : Launch<kFp4, kFp4>(view, stream);
}

}  // namespace sparsekv::mla_cuda
