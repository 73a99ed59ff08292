// HostKVPool::Book: what a HostKVPool keeps behind its interface. The bookkeeping (page tables,
// page references, the free pages, owners and seals; its layout in pool_state.h) and its mutex,
// and for a node pool the shared segment the bookkeeping and the rows live in (node_segment.h),
// this process's slot in it and its loose references, the reclaim of dead processes and the
// repair after one died holding the mutex.
//
// A private pool's book is a block of its own memory with a plain mutex. A node pool's is the
// segment's block with a robust, process-shared mutex; every HostKVPool attached to the segment
// has a Book over it.
//
// Thread safety: as HostKVPool's contract says. The operations on the bookkeeping take the mutex
// for their duration (the private ...Locked methods require it held); Init runs before any other
// use, and HoldsOwner reads an owner's holder without it (a live holder's owners change only by
// its own calls).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "host_pool/node_segment.h"
#include "host_pool/pool_state.h"
#include "sparsekv/host_kv_pool.h"
#include "sparsekv/status.h"

namespace sparsekv {

class HostKVPool::Book {
 public:
  // A private pool's book, initialised: every page and owner free. Null if its memory cannot be
  // allocated.
  static std::unique_ptr<Book> CreatePrivate(int32_t total_pages, int32_t page_tokens,
                                             int32_t pages_per_owner, int32_t max_owners);
  // A book over `segment`'s block, not initialised (Init) nor attached (Attach).
  static std::unique_ptr<Book> OverSegment(std::unique_ptr<NodeSegment> segment);
  // A private pool's: destroys the mutex. A node pool's: unmaps the segment (detach first).
  ~Book();
  Book(const Book&) = delete;
  Book& operator=(const Book&) = delete;

  // Initialises a zeroed block: every page and owner free; the mutex robust and process-shared
  // for a node pool.
  void Init();

  // The page tables: [max_owners, pages_per_owner], -1 = none.
  int32_t* page_table() const { return page_table_; }
  bool is_node_pool() const { return segment_ != nullptr; }
  // Node pool only.
  NodeSegment& segment() const { return *segment_; }

  // ---- Owners and pages (HostKVPool's methods of the same names) ----

  StatusOr<int32_t> AcquireOwner();
  void ReleaseOwner(int32_t owner);
  int32_t free_owners() const;
  Status Reserve(int32_t owner, int32_t tokens, std::span<const int32_t> shared_prefix,
                 int32_t spare_pages, std::vector<int32_t>* spares);
  void Release(int32_t owner, std::vector<int32_t>* freed);
  StatusOr<int32_t> AllocatePage();
  void AddRef(int32_t page);
  bool Unref(int32_t page);
  int32_t SwapPage(int32_t owner, int32_t index, int32_t page);
  int32_t RefCount(int32_t page) const;
  int32_t HostRow(int32_t owner, int32_t position) const;
  int32_t ReservedTokens(int32_t owner) const;
  int32_t free_pages() const;
  int32_t shared_pages() const;
  int64_t extra_references() const;
  StatusOr<uint64_t> Seal(int32_t owner, int32_t tokens);
  StatusOr<SealedPages> ShareSealed(int32_t owner, uint64_t seal);

  // Node pool: whether `owner` may be used by this process (held by it); true in a private pool.
  bool HoldsOwner(int32_t owner) const;

  // ---- Processes (node pool) ----

  int32_t live_processes() const;
  int32_t ReclaimDeadProcesses();
  // Takes a process slot for this process, after reclaiming dead processes. FailedPrecondition if
  // the segment was closed; ResourceExhausted if every slot is live.
  Status Attach();
  // Detaches if this process attached this book (not a copy of it in a forked child): drops what
  // this process still holds, frees its slot and, if no live process remains, closes the segment
  // and removes its file.
  void DetachIfAttached();
  // Not attached: reclaims dead processes and, if no live process remains, closes the segment
  // (no one may attach any more). True if it closed it.
  bool CloseIfAbandoned();
  // Registration of the segment's rows with this process's backend (HostKVPool's destructor
  // unregisters them): whether it was done, by this process.
  void set_registered() { registered_ = true; }
  bool registered_here() const;

 private:
  class Lock;  // the mutex, held for its scope

  Book(int32_t total_pages, int32_t page_tokens, int32_t pages_per_owner, int32_t max_owners);
  // Points the bookkeeping at `block` (pool_state.h), `max_processes` = 0 for a private pool.
  void Bind(std::byte* block, int32_t max_processes);
  void Detach();

  // The public methods of the same names without the mutex. REQUIRES: the mutex is held.
  int32_t AllocatePageLocked();
  void AddRefLocked(int32_t page);
  bool UnrefLocked(int32_t page);
  int32_t FreePagesLocked() const;
  void ReleaseLocked(int32_t owner, std::vector<int32_t>* freed);
  // Adds `delta` to this process's loose references to `page` (node pool only).
  void CountLoose(int32_t page, int32_t delta);
  // Rebuilds the derived state from the primary state (pool_state.h), after a process died
  // holding the mutex.
  void RepairLocked();
  // ReclaimDeadProcesses with the mutex held.
  int32_t ReclaimDeadLocked();
  // Reclaims dead processes if a reservation of `pages` fresh pages (or an owner, with pages = 0
  // and `owner` set) would fail; true if that freed anything.
  bool ReclaimIfShortLocked(int64_t pages, bool owner);

  const int32_t total_pages_;
  const int32_t page_tokens_;
  const int32_t pages_per_owner_;
  const int32_t max_owners_;
  // In private_block_ for a private pool, in the segment for a node pool. Everything it holds is
  // guarded by header_->mutex.
  std::unique_ptr<std::byte[]> private_block_;
  pool_state::Header* header_ = nullptr;
  pool_state::Owner* owners_ = nullptr;
  pool_state::Process* processes_ = nullptr;  // [max_processes]; node pool only
  int32_t* page_table_ = nullptr;
  int32_t* refs_ = nullptr;        // references per page; 0 = free
  uint64_t* used_bits_ = nullptr;  // bit set: page in use; pages are handed out lowest first
  int32_t* loose_ = nullptr;       // [max_processes, total_pages]; node pool only
  // Node pool: the mapped segment, this process's slot in it, and whether the rows are registered
  // with the backend.
  std::unique_ptr<NodeSegment> segment_;
  int32_t self_ = -1;
  int attached_pid_ = 0;  // a copy of this object in a forked child must not detach the parent
  bool registered_ = false;
};

}  // namespace sparsekv
