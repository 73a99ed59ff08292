// The small kernels of the end-to-end benchmark (gpu_bench.h). Each launcher enqueues on `stream`,
// never synchronises and returns the launch's cudaError_t. C++17: compiled by nvcc.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace sparsekv::tools::gpu {

// The content of the synthetic KV (kv_content.h, KVContentWord): row (request, layer, position)
// is a pure function of those and `seed`, a valid row of its format (656 B, 1152 B, and
// DeepSeek-V4's 584-B and 368-B entries, whose `position` is the entry's index), so that every
// variant holds the same bytes for a token and attention never sees NaN. Writes rows
// first_position + i, i < count, of `request` to dst + (dst_row + i) * stride; dst may be device
// memory or mapped host memory. cudaErrorInvalidValue for another row_bytes.
// REQUIRES: stride and dst 4-byte aligned.
cudaError_t FillKVRows(std::byte* dst, int64_t stride, int64_t dst_row, int32_t count,
                       int32_t row_bytes, int32_t request, int32_t layer, int32_t first_position,
                       uint64_t seed, cudaStream_t stream);

// n bf16 values, pseudo-random in (-1, 1) (never zeros: they can run faster than real data).
cudaError_t FillBf16(void* dst, int64_t n, uint64_t seed, cudaStream_t stream);

// For b < batch, k < top_k, with p = topk[b * top_k + k]:
//   rows[b * top_k + k] = p < 0 ? -1 : b * request_rows + p    (request b's rows are contiguous)
//   staging[b * top_k + k] = p < 0 ? -1 : b * top_k + k        (if staging is not null)
cudaError_t PositionsToRows(const int32_t* topk, int32_t batch, int32_t top_k, int64_t request_rows,
                            int32_t* rows, int32_t* staging, cudaStream_t stream);

// For b < batch: row b * request_rows + positions[b] of dst = row b of new_rows (row_bytes each,
// both with `stride`). dst may be device memory or mapped host memory.
// REQUIRES: row_bytes, stride and both bases 16-byte aligned.
cudaError_t AppendRows(const std::byte* new_rows, int32_t batch, int32_t row_bytes, int64_t stride,
                       const int32_t* positions, int64_t request_rows, std::byte* dst,
                       cudaStream_t stream);

// DeepSeek-V4's full-hbm layer (entry_scopes.h: request b's entries at rows b * entry_rows + e,
// its raw window a ring at rows b * raw_window + slot). For b < batch, with n = positions[b] + 1
// tokens (the step's included):
//   every_entry (if not null) [batch, width]: EveryEntryIndex(b, k, n, entry_tokens, entry_rows)
//     (an HCA layer's scope: every entry, -1 past floor(n / r));
//   window (if not null) [batch, raw_window]: WindowIndex(b, i, n, raw_window) (oldest first,
//     -1 past min(n, raw_window)).
// cudaErrorInvalidValue for entry_tokens < 1, or raw_window < 1 with a window.
cudaError_t EntryScopeIndices(const int32_t* positions, int32_t batch, int32_t width,
                              int32_t entry_tokens, int32_t entry_rows, int32_t* every_entry,
                              int32_t raw_window, int32_t* window, cudaStream_t stream);

// The step's append to a full-hbm V4 layer: for b < batch with n = positions[b] + 1, row b of
// new_rows (row_bytes of it, rows `stride` apart, as every buffer's rows) goes to entry row
// AppendedEntryRow(b, n, entry_tokens, entry_rows) of `entries` if that is not -1 and entries
// is not null, and to ring row AppendedWindowRow(b, n, raw_window) of `rings` if rings is not
// null (the entry and the raw row of a token are the same bytes in the benchmark).
// REQUIRES: row_bytes, stride and the bases 4-byte aligned. cudaErrorInvalidValue as above.
cudaError_t AppendEntryRows(const std::byte* new_rows, int32_t batch, int32_t row_bytes,
                            int64_t stride, const int32_t* positions, int32_t entry_tokens,
                            int32_t entry_rows, std::byte* entries, int32_t raw_window,
                            std::byte* rings, cudaStream_t stream);

// The page-offload variant's element-wise steps (page_offload.h, PageOffloadOps: the same
// semantics), over `entries` entries.
cudaError_t PageIds(const int32_t* topk, int32_t entries, int32_t page_tokens, int32_t* page_ids,
                    cudaStream_t stream);
cudaError_t PageOverflow(const int32_t* page_ids, const int32_t* cache_slots, int32_t entries,
                         int32_t* overflow, cudaStream_t stream);
cudaError_t PageRows(const int32_t* topk, const int32_t* cache_slots, const int32_t* staging_slots,
                     int32_t entries, int32_t page_tokens, int64_t first_cache_row,
                     int64_t first_staging_row, int32_t* rows, cudaStream_t stream);

}  // namespace sparsekv::tools::gpu
