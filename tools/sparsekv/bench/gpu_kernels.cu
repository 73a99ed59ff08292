#include "tools/sparsekv/bench/entry_scopes.h"
#include "tools/sparsekv/bench/gpu_kernels.h"
#include "tools/sparsekv/bench/kv_content.h"

namespace sparsekv::tools::gpu {
namespace {

constexpr int kThreads = 256;

// One thread per 4-byte word of a row.
__global__ void FillKVRowsKernel(std::byte* dst, int64_t stride, int64_t dst_row, int32_t count,
                                 int32_t row_bytes, int32_t request, int32_t layer,
                                 int32_t first_position, uint64_t seed) {
  const int32_t words = row_bytes / 4;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= int64_t{count} * words) return;
  const int32_t r = static_cast<int32_t>(i / words);
  const int32_t w = static_cast<int32_t>(i % words);
  reinterpret_cast<uint32_t*>(dst + (dst_row + r) * stride)[w] =
      KVContentWord(row_bytes, w, request, layer, first_position + r, seed);
}

__global__ void FillBf16Kernel(uint16_t* dst, int64_t n, uint64_t seed) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n)
    dst[i] = static_cast<uint16_t>(RandomBf16Bits(static_cast<uint32_t>(ContentMix(seed + i))));
}

__global__ void PositionsToRowsKernel(const int32_t* topk, int32_t entries, int32_t top_k,
                                      int64_t request_rows, int32_t* rows, int32_t* staging) {
  const int32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= entries) return;
  const int32_t p = topk[i];
  const int32_t b = i / top_k;
  rows[i] = p < 0 ? -1 : static_cast<int32_t>(b * request_rows + p);
  if (staging != nullptr) staging[i] = p < 0 ? -1 : i;
}

// One warp per row, 16-byte words.
__global__ void AppendRowsKernel(const std::byte* new_rows, int32_t batch, int32_t row_bytes,
                                 int64_t stride, const int32_t* positions, int64_t request_rows,
                                 std::byte* dst) {
  const int32_t b = (blockIdx.x * blockDim.x + threadIdx.x) / 32;
  const int32_t lane = threadIdx.x % 32;
  if (b >= batch) return;
  const auto* s = reinterpret_cast<const uint4*>(new_rows + b * stride);
  auto* d = reinterpret_cast<uint4*>(dst + (b * request_rows + positions[b]) * stride);
  for (int32_t v = lane; v < row_bytes / 16; v += 32) d[v] = s[v];
}

// One thread per index of both scopes: [batch, width] every-entry, then [batch, raw_window].
__global__ void EntryScopeIndicesKernel(const int32_t* positions, int32_t batch, int32_t width,
                                        int32_t entry_tokens, int32_t entry_rows,
                                        int32_t* every_entry, int32_t raw_window, int32_t* window) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t entries = every_entry != nullptr ? int64_t{batch} * width : 0;
  if (i < entries) {
    const int32_t b = static_cast<int32_t>(i / width);
    every_entry[i] = EveryEntryIndex(b, static_cast<int32_t>(i % width), positions[b] + 1,
                                     entry_tokens, entry_rows);
    return;
  }
  const int64_t j = i - entries;
  if (window == nullptr || j >= int64_t{batch} * raw_window) return;
  const int32_t b = static_cast<int32_t>(j / raw_window);
  window[j] = WindowIndex(b, static_cast<int32_t>(j % raw_window), positions[b] + 1, raw_window);
}

// One warp per batch row, 4-byte words (entries of 584 and 368 B are not 16-byte multiples).
__global__ void AppendEntryRowsKernel(const std::byte* new_rows, int32_t batch, int32_t row_bytes,
                                      int64_t stride, const int32_t* positions,
                                      int32_t entry_tokens, int32_t entry_rows, std::byte* entries,
                                      int32_t raw_window, std::byte* rings) {
  const int32_t b = (blockIdx.x * blockDim.x + threadIdx.x) / 32;
  const int32_t lane = threadIdx.x % 32;
  if (b >= batch) return;
  const int32_t tokens = positions[b] + 1;
  const auto* s = reinterpret_cast<const uint32_t*>(new_rows + b * stride);
  const int32_t entry =
      entries != nullptr ? AppendedEntryRow(b, tokens, entry_tokens, entry_rows) : -1;
  if (entry >= 0) {
    auto* d = reinterpret_cast<uint32_t*>(entries + entry * stride);
    for (int32_t v = lane; v < row_bytes / 4; v += 32) d[v] = s[v];
  }
  if (rings != nullptr) {
    auto* d =
        reinterpret_cast<uint32_t*>(rings + AppendedWindowRow(b, tokens, raw_window) * stride);
    for (int32_t v = lane; v < row_bytes / 4; v += 32) d[v] = s[v];
  }
}

__global__ void PageIdsKernel(const int32_t* topk, int32_t entries, int32_t page_tokens,
                              int32_t* page_ids) {
  const int32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= entries) return;
  const int32_t p = topk[i];
  page_ids[i] = p < 0 ? -1 : p / page_tokens;
}

__global__ void PageOverflowKernel(const int32_t* page_ids, const int32_t* cache_slots,
                                   int32_t entries, int32_t* overflow) {
  const int32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= entries) return;
  const int32_t page = page_ids[i];
  overflow[i] = page >= 0 && cache_slots[i] < 0 ? page : -1;
}

__global__ void PageRowsKernel(const int32_t* topk, const int32_t* cache_slots,
                               const int32_t* staging_slots, int32_t entries, int32_t page_tokens,
                               int64_t first_cache_row, int64_t first_staging_row, int32_t* rows) {
  const int32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= entries) return;
  const int32_t p = topk[i];
  const int32_t cache = cache_slots[i];
  const int32_t staging = staging_slots[i];
  int64_t row = -1;
  if (p >= 0 && cache >= 0) {
    row = first_cache_row + int64_t{cache} * page_tokens + p % page_tokens;
  } else if (p >= 0 && staging >= 0) {
    row = first_staging_row + int64_t{staging} * page_tokens + p % page_tokens;
  }
  rows[i] = static_cast<int32_t>(row);
}

unsigned Blocks(int64_t threads) {
  return static_cast<unsigned>((threads + kThreads - 1) / kThreads);
}

}  // namespace

cudaError_t FillKVRows(std::byte* dst, int64_t stride, int64_t dst_row, int32_t count,
                       int32_t row_bytes, int32_t request, int32_t layer, int32_t first_position,
                       uint64_t seed, cudaStream_t stream) {
  if (!IsContentRowBytes(row_bytes)) return cudaErrorInvalidValue;  // no such format
  if (count <= 0) return cudaSuccess;
  FillKVRowsKernel<<<Blocks(int64_t{count} * (row_bytes / 4)), kThreads, 0, stream>>>(
      dst, stride, dst_row, count, row_bytes, request, layer, first_position, seed);
  return cudaGetLastError();
}

cudaError_t FillBf16(void* dst, int64_t n, uint64_t seed, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  FillBf16Kernel<<<Blocks(n), kThreads, 0, stream>>>(static_cast<uint16_t*>(dst), n, seed);
  return cudaGetLastError();
}

cudaError_t PositionsToRows(const int32_t* topk, int32_t batch, int32_t top_k, int64_t request_rows,
                            int32_t* rows, int32_t* staging, cudaStream_t stream) {
  const int32_t entries = batch * top_k;
  if (entries <= 0) return cudaSuccess;
  PositionsToRowsKernel<<<Blocks(entries), kThreads, 0, stream>>>(topk, entries, top_k,
                                                                  request_rows, rows, staging);
  return cudaGetLastError();
}

cudaError_t AppendRows(const std::byte* new_rows, int32_t batch, int32_t row_bytes, int64_t stride,
                       const int32_t* positions, int64_t request_rows, std::byte* dst,
                       cudaStream_t stream) {
  if (batch <= 0) return cudaSuccess;
  AppendRowsKernel<<<Blocks(int64_t{batch} * 32), kThreads, 0, stream>>>(
      new_rows, batch, row_bytes, stride, positions, request_rows, dst);
  return cudaGetLastError();
}

cudaError_t EntryScopeIndices(const int32_t* positions, int32_t batch, int32_t width,
                              int32_t entry_tokens, int32_t entry_rows, int32_t* every_entry,
                              int32_t raw_window, int32_t* window, cudaStream_t stream) {
  if (entry_tokens < 1 || (window != nullptr && raw_window < 1)) return cudaErrorInvalidValue;
  const int64_t threads = (every_entry != nullptr ? int64_t{batch} * width : 0) +
                          (window != nullptr ? int64_t{batch} * raw_window : 0);
  if (threads <= 0) return cudaSuccess;
  EntryScopeIndicesKernel<<<Blocks(threads), kThreads, 0, stream>>>(
      positions, batch, width, entry_tokens, entry_rows, every_entry, raw_window, window);
  return cudaGetLastError();
}

cudaError_t AppendEntryRows(const std::byte* new_rows, int32_t batch, int32_t row_bytes,
                            int64_t stride, const int32_t* positions, int32_t entry_tokens,
                            int32_t entry_rows, std::byte* entries, int32_t raw_window,
                            std::byte* rings, cudaStream_t stream) {
  if (entry_tokens < 1 || (rings != nullptr && raw_window < 1)) return cudaErrorInvalidValue;
  if (batch <= 0) return cudaSuccess;
  AppendEntryRowsKernel<<<Blocks(int64_t{batch} * 32), kThreads, 0, stream>>>(
      new_rows, batch, row_bytes, stride, positions, entry_tokens, entry_rows, entries, raw_window,
      rings);
  return cudaGetLastError();
}

cudaError_t PageIds(const int32_t* topk, int32_t entries, int32_t page_tokens, int32_t* page_ids,
                    cudaStream_t stream) {
  if (entries <= 0) return cudaSuccess;
  PageIdsKernel<<<Blocks(entries), kThreads, 0, stream>>>(topk, entries, page_tokens, page_ids);
  return cudaGetLastError();
}

cudaError_t PageOverflow(const int32_t* page_ids, const int32_t* cache_slots, int32_t entries,
                         int32_t* overflow, cudaStream_t stream) {
  if (entries <= 0) return cudaSuccess;
  PageOverflowKernel<<<Blocks(entries), kThreads, 0, stream>>>(page_ids, cache_slots, entries,
                                                               overflow);
  return cudaGetLastError();
}

cudaError_t PageRows(const int32_t* topk, const int32_t* cache_slots, const int32_t* staging_slots,
                     int32_t entries, int32_t page_tokens, int64_t first_cache_row,
                     int64_t first_staging_row, int32_t* rows, cudaStream_t stream) {
  if (entries <= 0) return cudaSuccess;
  PageRowsKernel<<<Blocks(entries), kThreads, 0, stream>>>(topk, cache_slots, staging_slots,
                                                           entries, page_tokens, first_cache_row,
                                                           first_staging_row, rows);
  return cudaGetLastError();
}

}  // namespace sparsekv::tools::gpu
