// HostKVPool: the complete KV history of every request, in host memory.
//
// Layout is layer-major: layer l is one region of [rows][row_stride(l)] bytes, so that the rows a
// decode step gathers for one layer are compact in the address space (GPU address translation,
// not PCIe, limits random gathers over large spans: see docs/architecture.md). Row r of every layer
// belongs to the same token. Rows are given to requests in pages of `page_tokens` consecutive
// rows; a per-request page table maps a token position to its host row.
//
// The memory comes from Backend::AllocateHost (pinned and device-mapped under CUDA).
// Thread safety: not thread-safe; the owning manager serialises calls.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <set>
#include <span>
#include <vector>

#include "sparsekv/backend.h"
#include "sparsekv/options.h"
#include "sparsekv/status.h"

namespace sparsekv {

class HostKVPool {
 public:
  // A pool of `capacity_tokens` rounded up to whole pages, with page tables for `max_owners`
  // owners of up to `max_tokens_per_owner` tokens each. `backend` must outlive the pool.
  static StatusOr<std::unique_ptr<HostKVPool>> Create(const KVGeometry& geometry,
                                                      int64_t capacity_tokens, int32_t page_tokens,
                                                      int32_t max_owners,
                                                      int32_t max_tokens_per_owner,
                                                      Backend* backend);
  ~HostKVPool();
  HostKVPool(const HostKVPool&) = delete;
  HostKVPool& operator=(const HostKVPool&) = delete;

  // Gives owner `owner` pages for `tokens` positions, all or nothing. ResourceExhausted if the
  // pool has too few free pages (nothing is changed then); FailedPrecondition if the owner already
  // holds pages; OutOfRange if tokens exceeds max_tokens_per_owner.
  Status Reserve(int32_t owner, int32_t tokens);
  // Returns the owner's pages to the pool. No-op for an owner without pages.
  void Release(int32_t owner);

  // REQUIRES: position < the tokens reserved by owner.
  int32_t HostRow(int32_t owner, int32_t position) const;
  // Tokens reserved by owner (a multiple of page_tokens), 0 if none.
  int32_t ReservedTokens(int32_t owner) const;

  std::byte* layer_base(int32_t layer) const { return layer_base_[layer]; }
  std::byte* row(int32_t layer, int32_t host_row) const {
    return layer_base_[layer] + static_cast<int64_t>(host_row) * geometry_.layers[layer].row_stride;
  }
  int32_t rows() const { return rows_; }
  int32_t page_tokens() const { return page_tokens_; }
  int32_t pages_per_owner() const { return pages_per_owner_; }
  int32_t total_pages() const { return rows_ / page_tokens_; }
  int32_t free_pages() const { return static_cast<int32_t>(free_pages_.size()); }
  int64_t bytes() const { return static_cast<int64_t>(rows_) * geometry_.token_stride_bytes(); }
  // [max_owners, pages_per_owner] host page index of each page of each owner, -1 = none.
  std::span<const int32_t> page_table() const { return page_table_; }
  std::span<const int32_t> page_table_row(int32_t owner) const {
    return {page_table_.data() + static_cast<size_t>(owner) * pages_per_owner_,
            static_cast<size_t>(pages_per_owner_)};
  }

 private:
  HostKVPool(const KVGeometry& geometry, int32_t rows, int32_t page_tokens, int32_t max_owners,
             int32_t pages_per_owner, Backend* backend);

  KVGeometry geometry_;
  int32_t rows_;
  int32_t page_tokens_;
  int32_t pages_per_owner_;
  Backend* backend_;
  std::vector<std::byte*> layer_base_;
  std::vector<int32_t> page_table_;
  std::vector<int32_t> owner_pages_;  // pages held by each owner
  // Lowest pages first, so that an owner's rows are as contiguous as the pool allows.
  std::set<int32_t> free_pages_;
};

}  // namespace sparsekv
