// HostKVPool: the complete KV history of every request, in host memory.
//
// Layout is layer-major: layer l is one region of [rows][row_stride(l)] bytes, so that the rows a
// decode step gathers for one layer are compact in the address space (GPU address translation,
// not PCIe, limits random gathers over large spans: see docs/architecture.md). Row r of every layer
// belongs to the same token (entry). Only offloaded layers (LayerKind::kOffloaded) have a region:
// a resident or window-only layer's entries live in the manager's device memory alone, so its
// layer_base() is null and its rows must not be addressed; layer indices stay the model's. Rows are
// given to requests in pages of `page_tokens` consecutive rows; a per-request page table maps a
// token position to its host row.
//
// The memory comes from Backend::AllocateHost: under CUDA it is pinned, device-mapped and portable
// (cudaHostAllocPortable / cudaHostRegisterPortable), one address for the host and every GPU
// (UVA), so that the managers of several GPUs of one machine can share one pool (node-level
// sharing, docs/scale-out.md). HostMemoryKind::kCudaVmm is the exception: its mapping is
// accessible from the allocating GPU only, so a pool shared by several GPUs must not use it. A
// node pool's memory is its shared segment's instead, registered the same way in each process
// (Backend::RegisterHost).
//
// Sharing: the pool hands out owners (rows of the page table) with AcquireOwner, so that every
// manager uses rows of its own; a page's reference count is global. Page numbers and owner ids
// are pool-wide.
//
// Node pool (node_pool.h): a pool whose rows and bookkeeping (page tables, reference counts, free
// pages, owners) live in a shared-memory segment that several processes of one machine attach
// to, each with a HostKVPool of its own over the same segment. Page numbers, owner ids and
// references are then machine-wide; every reference and owner is held by the attached process
// that took it, so that the survivors can drop those of a process that died
// (ReclaimDeadProcesses). A writer hands pages to readers without copying them with Seal and
// ShareSealed (below), in one process or across processes.
//
// Thread safety: every method that reads or changes page references, the free list or owner
// state takes an internal mutex (in a node pool, a robust process-shared mutex in the segment),
// so that several managers, each driven by its own thread or process, may call them at once.
// page_table_row(owner) and the layer memory are read without the mutex: an owner's row is
// changed only by calls for that owner, and the bytes of a page only by the holder of its only
// reference, so the one thread that holds an owner (or page) must order its reads after its own
// changes. The layout accessors (rows(), layer_base(), ...) are immutable.
#pragma once

#include <cassert>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "sparsekv/backend.h"
#include "sparsekv/options.h"
#include "sparsekv/status.h"

namespace sparsekv {

class HostKVPool {
 public:
  // A pool of `capacity_tokens` rows rounded up to whole pages, in the offloaded layers of
  // `geometry` only, with page tables for `max_owners` owners of up to `max_tokens_per_owner`
  // rows each. `backend` must outlive the pool. InvalidArgument for a bad shape or a geometry
  // with no offloaded layer. ResourceExhausted, before anything is allocated, if the rows are more
  // host memory than the machine has (capacity.h: the message names both sizes and
  // host_capacity_tokens); also if an allocation fails.
  static StatusOr<std::unique_ptr<HostKVPool>> Create(const KVGeometry& geometry,
                                                      int64_t capacity_tokens, int32_t page_tokens,
                                                      int32_t max_owners,
                                                      int32_t max_tokens_per_owner,
                                                      Backend* backend);
  // OK if a pool over `geometry` may be shared (CreateShared, CreateNodePool): every layer is
  // offloaded. Unimplemented otherwise, naming `op` and the first other layer: a shared pool is
  // laid out over every layer (a node pool's segment records no layer kinds).
  static Status CheckShareable(const KVGeometry& geometry, const char* op);
  // A pool for several managers created with `options` (SparseKVCacheManager::Create with a
  // pool): options' geometry, host_capacity_tokens, host_page_tokens and max_context, and
  // `max_owners` live requests over all of them (e.g. GPUs * effective_max_host_requests()).
  // The pool keeps `backend` alive. InvalidArgument for invalid options or max_owners < 1;
  // Unimplemented for a geometry with resident or window-only layers (CheckShareable).
  static StatusOr<std::shared_ptr<HostKVPool>> CreateShared(const CacheOptions& options,
                                                            int32_t max_owners,
                                                            std::shared_ptr<Backend> backend);
  ~HostKVPool();
  HostKVPool(const HostKVPool&) = delete;
  HostKVPool& operator=(const HostKVPool&) = delete;

  // A free owner (row of the page table), lowest first; ResourceExhausted if all max_owners are
  // taken. The caller holds it until ReleaseOwner (in a node pool: this process holds it, until
  // it releases it or is found dead).
  StatusOr<int32_t> AcquireOwner();
  // REQUIRES (not checked, asserted in debug builds): the caller acquired `owner` and it holds no
  // pages (Release first).
  void ReleaseOwner(int32_t owner);
  int32_t max_owners() const { return max_owners_; }
  int32_t free_owners() const;

  // Gives owner `owner` pages for `tokens` positions, all or nothing: table entry i is
  // shared_prefix[i] (which gains a reference) for i < shared_prefix.size(), a fresh page after;
  // and appends `spare_pages` more free pages, one reference each held by the caller, to
  // `spares`. ResourceExhausted if the pool has too few free pages (nothing is changed then);
  // FailedPrecondition if the owner already holds pages (or, in a node pool, is not held by this
  // process); OutOfRange if tokens exceeds
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

  // ---- Hand-off of sealed pages ----
  //
  // A writer (e.g. a prefill process) reserves pages for an owner, writes a prompt's rows into
  // them and seals them; readers (managers in this process, or in another process attached to the
  // same node pool) then take references to the sealed pages instead of copying the rows
  // (SparseKVCacheManager::AdmitFromPages). A seal ends when its owner's pages are released
  // (Release, or the reclaim of the owner's dead process): the readers' references keep the pages
  // and their bytes, but no new reader can share them. Sealed pages must not be written again.

  // Seals the pages that hold positions [0, tokens) of `owner` and returns the seal: >= 1, never
  // handed out twice by this pool (nor by any process of a node pool). Sealing again replaces the
  // seal. InvalidArgument for a bad owner or tokens < 1; OutOfRange if tokens exceeds the owner's
  // reserved tokens; FailedPrecondition in a node pool for an owner this process does not hold.
  StatusOr<uint64_t> Seal(int32_t owner, int32_t tokens);
  struct SealedPages {
    std::vector<int32_t> pages;  // in position order
    int32_t tokens = 0;          // the sealed positions: [0, tokens)
  };
  // Adds one reference, held by the caller (drop it with Unref), to each page of `owner`'s seal
  // and returns them. NotFound if `seal` is not the owner's current seal (never sealed, released,
  // sealed again, or its process died and was reclaimed); InvalidArgument for a bad owner.
  StatusOr<SealedPages> ShareSealed(int32_t owner, uint64_t seal);

  // ---- Node pool (node_pool.h) ----

  bool is_node_pool() const;
  // The segment's file and its id (a new one each time a segment is created under a path);
  // "" and 0 for a private pool.
  const std::string& node_pool_path() const;
  uint64_t node_pool_id() const;
  // Processes attached to the segment and not known to have exited (this one included); 1 for a
  // private pool.
  int32_t live_processes() const;
  // Finds the attached processes that have exited (killed or not, without detaching) and drops
  // every page reference and owner they held; pages whose last reference that was are free
  // again, and the dead processes' seals end. Returns how many processes it reclaimed (0 for a
  // private pool). Also run by attaching, detaching and by any reservation that finds the pool
  // short of pages or owners. Cost: O(pages) per dead process, one liveness check
  // (/proc/<pid>/stat) per attached process.
  int32_t ReclaimDeadProcesses();

  // REQUIRES (not checked: called per request and step): position < the tokens reserved by
  // owner.
  int32_t HostRow(int32_t owner, int32_t position) const;
  // Tokens reserved by owner (a multiple of page_tokens), 0 if none.
  int32_t ReservedTokens(int32_t owner) const;

  // Layer `layer`'s region, [rows(), row_stride(layer)]; null for a layer that is not offloaded.
  std::byte* layer_base(int32_t layer) const { return layer_base_[layer]; }
  // REQUIRES (asserted in debug builds): `layer` is offloaded, host_row < rows().
  std::byte* row(int32_t layer, int32_t host_row) const {
    assert(layer_base_[layer] != nullptr && host_row >= 0 && host_row < rows_);
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
  // The backend that allocated the rows (a node pool: registered them in this process).
  Backend& backend() const { return *backend_; }
  // Bytes of one page over the offloaded layers: page_tokens * token_stride_bytes (also what the
  // planner charges a request's host pages, kv_footprint.h).
  static int64_t PageBytes(const KVGeometry& geometry, int32_t page_tokens) {
    return int64_t{page_tokens} * geometry.token_stride_bytes();
  }
  int64_t page_bytes() const { return PageBytes(geometry_, page_tokens_); }
  int64_t bytes() const { return static_cast<int64_t>(rows_) * geometry_.token_stride_bytes(); }
  // [max_owners, pages_per_owner] host page index of each page of each owner, -1 = none. Not
  // synchronised: for its size, or while no other thread uses the pool.
  std::span<const int32_t> page_table() const {
    return {page_table_, static_cast<size_t>(max_owners_) * pages_per_owner_};
  }
  std::span<const int32_t> page_table_row(int32_t owner) const {
    return {page_table_ + static_cast<size_t>(owner) * pages_per_owner_,
            static_cast<size_t>(pages_per_owner_)};
  }

 private:
  friend class NodePoolAccess;  // node_pool.cc: creates, opens and checks node pools
  // The bookkeeping (page tables, references, free pages, owners, seals) and its mutex; for a
  // node pool also the shared segment, this process's slot in it and the reclaim of dead
  // processes (src/host_pool/pool_book.h).
  class Book;

  HostKVPool(const KVGeometry& geometry, int32_t rows, int32_t page_tokens, int32_t max_owners,
             int32_t pages_per_owner, Backend* backend);

  KVGeometry geometry_;
  int32_t rows_;
  int32_t page_tokens_;
  int32_t pages_per_owner_;
  int32_t max_owners_;
  Backend* backend_;
  std::shared_ptr<Backend> backend_owner_;  // CreateShared, node pools: keeps backend_ alive
  std::vector<std::byte*> layer_base_;
  // Destroyed before backend_owner_: a node pool's book unmaps the segment the rows are in.
  std::unique_ptr<Book> book_;
  const int32_t* page_table_ = nullptr;  // book_'s page tables
};

}  // namespace sparsekv
