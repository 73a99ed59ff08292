// The page-offload variant of the end-to-end benchmark (docs/benchmark.md): the same host pool as
// sparsekv, but misses fetched as whole pages of Q tokens (RequestShape::offload_page_tokens), the
// way page-granular hierarchical caches (SGLang HiCache, vLLM's CPU offloading) move KV.
//
// Per request and layer, an HBM page cache of P LRU pages (the bytes of sparsekv's hot_slots rows)
// plus one page that holds the newest tokens (it receives every appended token: the equivalent of
// sparsekv's window). Per step and layer:
//   1. the new token's row is written to the host pool and into the newest page (IndexCopy);
//   2. each top-k position p becomes its page id p / Q (PageOffloadOps::PageIds);
//   3. the page ids are resolved against the cache with the library's Resolve (pages as positions,
//      share_duplicates: every position of a page shares the page's slot, the newest page is the
//      window); the missed pages get LRU victims;
//   4. a top-k row can name more distinct pages than the cache holds (2048 positions spread over
//      32K tokens touch ~500 of its 512 pages), and the attention must find every selected row
//      resident. The pages Resolve left without a slot (PageOffloadOps::Overflow) are resolved a
//      second time against a staging area of S = min(top_k, pages) pages per request, emptied at
//      every layer and shared by all layers (a page-granular system streams such pages through a
//      per-layer buffer; nothing caps how many a step needs);
//   5. both miss lists are copied in whole pages (IndexCopy of Q-row pages, sorted by host page);
//   6. row indices for the attention: slot * Q + p % Q in the cache or the staging area
//      (PageOffloadOps::Rows), all of them rows of one buffer, cache_rows().
// The run phase (RunLayer) only enqueues fixed-shape work on the backend: with the CUDA backend it
// can be captured in a CUDA graph. Plan (host side) writes the batch table between steps.
//
// Thread safety: none; one caller drives a cache. REQUIRES everywhere: the backend's streams are
// the caller's; buffers passed in stay valid until the stream reaches them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "sparsekv/backend.h"
#include "sparsekv/kv_footprint.h"
#include "sparsekv/status.h"

namespace sparsekv::tools {

// The variant's element-wise steps over the backend's memory, each for `entries` = batch * top_k
// entries: CPU loops (CreateCpuPageOffloadOps) or CUDA kernels (page_offload_variant.h). Each only
// enqueues on `stream`.
class PageOffloadOps {
 public:
  virtual ~PageOffloadOps() = default;
  // page_ids[i] = topk[i] < 0 ? -1 : topk[i] / page_tokens.
  virtual Status PageIds(const int32_t* topk, int32_t entries, int32_t page_tokens,
                         int32_t* page_ids, StreamHandle stream) = 0;
  // overflow[i] = page_ids[i] >= 0 && cache_slots[i] < 0 ? page_ids[i] : -1.
  virtual Status Overflow(const int32_t* page_ids, const int32_t* cache_slots, int32_t entries,
                          int32_t* overflow, StreamHandle stream) = 0;
  // With p = topk[i], o = p % page_tokens:
  //   rows[i] = p < 0                  ? -1
  //           : cache_slots[i] >= 0    ? first_cache_row + cache_slots[i] * page_tokens + o
  //           : staging_slots[i] >= 0  ? first_staging_row + staging_slots[i] * page_tokens + o
  //           :                          -1.
  virtual Status Rows(const int32_t* topk, const int32_t* cache_slots, const int32_t* staging_slots,
                      int32_t entries, int32_t page_tokens, int64_t first_cache_row,
                      int64_t first_staging_row, int32_t* rows, StreamHandle stream) = 0;
};

// Plain loops, for the CPU reference backend (whose operations complete before they return).
std::unique_ptr<PageOffloadOps> CreateCpuPageOffloadOps();

class PageOffloadCache {
 public:
  // A cache for `max_batch` requests of `shape` (tokens: the positions each may hold; pages of
  // Q = offload_page_tokens, P and S from OffloadPages). The host pool takes
  // max_batch * Footprint(kPageOffload).host_bytes from backend->AllocateHost. InvalidArgument if a
  // shape cannot be represented (32-bit row numbers), ResourceExhausted if memory is short.
  static StatusOr<std::unique_ptr<PageOffloadCache>> Create(const RequestShape& shape,
                                                            int32_t max_batch,
                                                            std::shared_ptr<Backend> backend,
                                                            std::unique_ptr<PageOffloadOps> ops);
  ~PageOffloadCache();
  PageOffloadCache(const PageOffloadCache&) = delete;
  PageOffloadCache& operator=(const PageOffloadCache&) = delete;

  // The host pool of `layer`: request b's position p is row b * request_rows() + p (row_bytes
  // each, unpadded), so that page g of request b is Q contiguous rows. The caller writes prompts
  // here, then calls LoadPrompt.
  std::byte* host_layer(int32_t layer) const { return host_[layer]; }
  int64_t request_rows() const { return int64_t{pages_.pages} * q_; }

  // Copies the rows of every request's last, partial prompt page (positions
  // [context - context % Q, context)) from the host pool into its newest page, in every layer.
  Status LoadPrompt(int32_t context, StreamHandle stream);

  // Host side, between steps: the next step runs requests [0, positions.size()), request b's new
  // token at positions[b] (its history is then positions[b] + 1 tokens). Reads `positions`
  // before it returns. REQUIRES: size <= max_batch, 0 <= positions[b] < shape.tokens.
  Status Plan(std::span<const int32_t> positions, StreamHandle stream);
  // Run phase of `layer` for the planned batch: topk [max_batch, top_k] positions (-1 = padding),
  // new_rows [max_batch, row_bytes] the new tokens' rows. Afterwards rows Indices()[b * top_k + k]
  // of cache_rows() hold the selected rows (-1 for padding). `batch` must be the planned size.
  Status RunLayer(int32_t layer, int32_t batch, const int32_t* topk, const std::byte* new_rows,
                  StreamHandle stream);

  // Every layer's cache pages, then the staging pages: rows of row_bytes.
  const std::byte* cache_rows() const { return static_cast<const std::byte*>(cache_.get()); }
  const int32_t* Indices() const { return static_cast<const int32_t*>(rows_.get()); }

  // Resolve's counters of the cache pass over all layers since the last reset, in pages: each
  // distinct page of a top-k row is a window hit (the newest page), a hit or a miss; every miss
  // (whether it got a cache slot or went to the staging area) is one page copied.
  Status ResetStats(StreamHandle stream);
  StatusOr<ResolveCounters> ReadStats(StreamHandle stream);

 private:
  // Device memory from the backend, freed there on destruction.
  struct Freer {
    Backend* backend;
    void operator()(void* p) const;
  };
  using Memory = std::unique_ptr<void, Freer>;

  PageOffloadCache(const RequestShape& shape, int32_t max_batch, std::shared_ptr<Backend> backend,
                   std::unique_ptr<PageOffloadOps> ops);
  Status Allocate();
  StatusOr<Memory> Device(size_t bytes);
  int32_t* Int32(const Memory& m) const { return static_cast<int32_t*>(m.get()); }
  ResolveView View(int32_t layer, bool staging) const;
  IndexCopyView PageCopy(int32_t layer, bool staging) const;

  RequestShape shape_;
  int32_t max_batch_;
  int32_t q_;  // tokens per page
  PageOffloadPages pages_;
  int64_t page_bytes_;         // q_ * row_bytes
  int64_t layer_cache_pages_;  // max_batch * (P + 1)
  std::shared_ptr<Backend> backend_;
  std::unique_ptr<PageOffloadOps> ops_;

  std::vector<std::byte*> host_;  // [layers] of [max_batch * request_rows, row]
  Memory cache_;                  // [layers * layer_cache_pages + max_batch * S] pages of q_ rows
  Memory slot_token_;             // [layers][max_batch * P] then the staging area's [max_batch * S]
  Memory lru_order_;              // the same shape
  Memory page_table_;  // [max_batch * pages]: request b's page g is host page b * pages + g
  Memory batch_;       // [max_batch] BatchEntry, seq_len in pages
  Memory scalars_;     // [3]: batch size, cache misses, staging misses
  Memory append_;      // [3, max_batch]: new-row index, host pool row, newest-page row
  Memory page_ids_;    // [max_batch * top_k] and each of the following
  Memory cache_slots_;
  Memory overflow_;
  Memory staging_slots_;
  Memory rows_;
  Memory miss_rows_;   // [2, max_batch * top_k]: cache pass, staging pass
  Memory miss_slots_;  // the same
  Memory counters_;    // [2] ResolveCounters: cache pass (the statistics), staging pass
  // Sources of Plan's uploads, kept until the next Plan (the copies are asynchronous).
  std::vector<BatchEntry> batch_host_;
  std::vector<int32_t> append_host_;
  int32_t batch_size_host_ = 0;
};

}  // namespace sparsekv::tools
