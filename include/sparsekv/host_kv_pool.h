// HostKVPool: the complete KV history of every request, in host memory.
//
// Layout is layer-major: layer l is one region of [rows][row_stride(l)] bytes, so that the rows a
// decode step gathers for one layer are compact in the address space (GPU address translation,
// not PCIe, limits random gathers over large spans: see docs/architecture.md). Row r of every layer
// belongs to the same token. Rows are given to requests in pages of `page_tokens` consecutive
// rows; a per-request page table maps a token position to its host row.
//
// The memory comes from Backend::AllocateHost: under CUDA it is pinned, device-mapped and portable
// (cudaHostAllocPortable / cudaHostRegisterPortable), one address for the host and every GPU
// (UVA), so that the managers of several GPUs of one machine can share one pool (node-level
// sharing, docs/scale-out.md). HostMemoryKind::kCudaVmm is the exception: its mapping is
// accessible from the allocating GPU only, so a pool shared by several GPUs must not use it.
//
// Sharing: the pool hands out owners (rows of the page table) with AcquireOwner, so that every
// manager uses rows of its own; a page's reference count is global. Page numbers and owner ids
// are pool-wide.
//
// Thread safety: every method that reads or changes page references, the free list or owner
// state takes an internal mutex, so that several managers, each driven by its own thread, may
// call them at once. page_table_row(owner) and the layer memory are read without the mutex: an
// owner's row is changed only by calls for that owner, and the bytes of a page only by the holder
// of its only reference, so the one thread that holds an owner (or page) must order its reads
// after its own changes. The layout accessors (rows(), layer_base(), ...) are immutable.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
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
  // A pool for several managers created with `options` (SparseKVCacheManager::Create with a
  // pool): options' geometry, host_capacity_tokens, host_page_tokens and max_context, and
  // `max_owners` live requests over all of them (e.g. GPUs * effective_max_host_requests()).
  // The pool keeps `backend` alive. InvalidArgument for invalid options or max_owners < 1.
  static StatusOr<std::shared_ptr<HostKVPool>> CreateShared(const CacheOptions& options,
                                                            int32_t max_owners,
                                                            std::shared_ptr<Backend> backend);
  ~HostKVPool();
  HostKVPool(const HostKVPool&) = delete;
  HostKVPool& operator=(const HostKVPool&) = delete;

  // A free owner (row of the page table), lowest first; ResourceExhausted if all max_owners are
  // taken. The caller holds it until ReleaseOwner.
  StatusOr<int32_t> AcquireOwner();
  // REQUIRES (not checked, asserted in debug builds): the caller acquired `owner` and it holds no
  // pages (Release first).
  void ReleaseOwner(int32_t owner);
  int32_t max_owners() const { return static_cast<int32_t>(owner_pages_.size()); }
  int32_t free_owners() const;

  // Gives owner `owner` pages for `tokens` positions, all or nothing: table entry i is
  // shared_prefix[i] (which gains a reference) for i < shared_prefix.size(), a fresh page after;
  // and appends `spare_pages` more free pages, one reference each held by the caller, to
  // `spares`. ResourceExhausted if the pool has too few free pages (nothing is changed then);
  // FailedPrecondition if the owner already holds pages; OutOfRange if tokens exceeds
  // max_tokens_per_owner; InvalidArgument for a bad owner, if shared_prefix has more pages than
  // `tokens` need or a page of it that is out of range or free (every page of shared_prefix must
  // hold a reference), or if spare_pages < 0 or spares is null with spare_pages > 0.
  Status Reserve(int32_t owner, int32_t tokens, std::span<const int32_t> shared_prefix = {},
                 int32_t spare_pages = 0, std::vector<int32_t>* spares = nullptr);
  // Drops the owner's references. Pages whose last reference this was are free again and, if
  // `freed` is not null, appended to it. No-op for an owner without pages.
  void Release(int32_t owner, std::vector<int32_t>* freed = nullptr);

  // A free page, with one reference held by the caller. ResourceExhausted if none is free.
  StatusOr<int32_t> AllocatePage();
  // REQUIRES (not checked, asserted in debug builds): page has a reference.
  void AddRef(int32_t page);
  // Drops one reference; true if it was the last one (the page is free again).
  // REQUIRES (not checked, asserted in debug builds): page has a reference.
  bool Unref(int32_t page);
  // Puts `page` at entry `index` of owner's table and returns the page that was there: the
  // caller's reference to `page` moves into the table, the table's reference to the old page
  // moves to the caller. REQUIRES (not checked, asserted in debug builds): index < the owner's
  // reserved pages; page has a reference.
  int32_t SwapPage(int32_t owner, int32_t index, int32_t page);
  int32_t RefCount(int32_t page) const;

  // REQUIRES (not checked: called per request and step): position < the tokens reserved by
  // owner.
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
  int32_t free_pages() const;
  // Pages with more than one reference.
  int32_t shared_pages() const;
  // Sum over pages of (references - 1): the page copies that sharing avoids storing.
  int64_t extra_references() const;
  const KVGeometry& geometry() const { return geometry_; }
  // Bytes of one page over all layers: page_tokens * token_stride_bytes.
  int64_t page_bytes() const { return int64_t{page_tokens_} * geometry_.token_stride_bytes(); }
  int64_t bytes() const { return static_cast<int64_t>(rows_) * geometry_.token_stride_bytes(); }
  // [max_owners, pages_per_owner] host page index of each page of each owner, -1 = none. Not
  // synchronised: for its size, or while no other thread uses the pool.
  std::span<const int32_t> page_table() const { return page_table_; }
  std::span<const int32_t> page_table_row(int32_t owner) const {
    return {page_table_.data() + static_cast<size_t>(owner) * pages_per_owner_,
            static_cast<size_t>(pages_per_owner_)};
  }

 private:
  HostKVPool(const KVGeometry& geometry, int32_t rows, int32_t page_tokens, int32_t max_owners,
             int32_t pages_per_owner, Backend* backend);
  // The public methods of the same names without the mutex. REQUIRES: mutex_ is held.
  int32_t AllocatePageLocked();
  void AddRefLocked(int32_t page);
  bool UnrefLocked(int32_t page);
  int32_t FreePagesLocked() const;

  KVGeometry geometry_;
  int32_t rows_;
  int32_t page_tokens_;
  int32_t pages_per_owner_;
  Backend* backend_;
  std::shared_ptr<Backend> backend_owner_;  // CreateShared: keeps backend_ alive
  std::vector<std::byte*> layer_base_;
  // Guards page_table_, owner_pages_, refs_, shared_pages_, extra_references_, returned_pages_,
  // next_fresh_page_ and free_owners_.
  mutable std::mutex mutex_;
  std::vector<int32_t> page_table_;
  std::vector<int32_t> owner_pages_;  // pages held by each owner
  std::vector<int32_t> refs_;         // references per page; 0 = free
  int32_t shared_pages_ = 0;          // pages with refs_ > 1
  int64_t extra_references_ = 0;      // sum of max(refs_ - 1, 0)
  // The free pages are returned_pages_ and every page from next_fresh_page_ on; every returned
  // page is below next_fresh_page_. Pages are handed out lowest first, so that an owner's rows are
  // as contiguous as the pool allows. Pages never used cost no bookkeeping, so that creating a
  // pool is O(layers + owners), not O(pages).
  std::set<int32_t> returned_pages_;
  int32_t next_fresh_page_ = 0;
  std::vector<int32_t> free_owners_;  // highest first: AcquireOwner takes from the back
};

}  // namespace sparsekv
