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

  // Gives owner `owner` pages for `tokens` positions, all or nothing: table entry i is
  // shared_prefix[i] (which gains a reference) for i < shared_prefix.size(), a fresh page after.
  // ResourceExhausted if the pool has too few free pages (nothing is changed then);
  // FailedPrecondition if the owner already holds pages; OutOfRange if tokens exceeds
  // max_tokens_per_owner; InvalidArgument if shared_prefix has more pages than `tokens` need.
  // REQUIRES: every page of shared_prefix has a reference.
  Status Reserve(int32_t owner, int32_t tokens, std::span<const int32_t> shared_prefix = {});
  // Drops the owner's references. Pages whose last reference this was are free again and, if
  // `freed` is not null, appended to it. No-op for an owner without pages.
  void Release(int32_t owner, std::vector<int32_t>* freed = nullptr);

  // A free page, with one reference held by the caller. ResourceExhausted if none is free.
  StatusOr<int32_t> AllocatePage();
  // REQUIRES: page has a reference.
  void AddRef(int32_t page);
  // Drops one reference; true if it was the last one (the page is free again).
  // REQUIRES: page has a reference.
  bool Unref(int32_t page);
  // Puts `page` at entry `index` of owner's table and returns the page that was there: the
  // caller's reference to `page` moves into the table, the table's reference to the old page
  // moves to the caller. REQUIRES: index < the owner's reserved pages; page has a reference.
  int32_t SwapPage(int32_t owner, int32_t index, int32_t page);
  int32_t RefCount(int32_t page) const { return refs_[page]; }

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
  // Pages with more than one reference.
  int32_t shared_pages() const { return shared_pages_; }
  // Sum over pages of (references - 1): the page copies that sharing avoids storing.
  int64_t extra_references() const { return extra_references_; }
  // Bytes of one page over all layers: page_tokens * token_stride_bytes.
  int64_t page_bytes() const { return int64_t{page_tokens_} * geometry_.token_stride_bytes(); }
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
  std::vector<int32_t> refs_;         // references per page; 0 = free
  int32_t shared_pages_ = 0;          // pages with refs_ > 1
  int64_t extra_references_ = 0;      // sum of max(refs_ - 1, 0)
  // Lowest pages first, so that an owner's rows are as contiguous as the pool allows.
  std::set<int32_t> free_pages_;
};

}  // namespace sparsekv
