// The bookkeeping of a HostKVPool as one block of plain data: page tables, page references, the
// free pages and the owners. A private pool keeps the block in its own memory; a node pool keeps it
// in the shared segment (node_segment.h), so that every process attached to the segment sees the
// same page tables and references. Nothing in the block is a pointer, since each process maps the
// segment at an address of its own.
//
// Primary and derived state. A node pool can lose a process that holds its mutex (SIGKILL): the
// next process to take the mutex (robust, process-shared) finds the derived state possibly
// half-updated and rebuilds it from the primary state (RepairLocked in pool_book.h):
//   primary: every owner's record and the first `pages` entries of its page-table row, every
//            process's record and its loose references (references held outside page tables:
//            copy-on-write spares, retained conversations, pages shared by a hand-off);
//   derived: the reference count of every page (page-table entries + loose references), the
//            used-page bitmap, and the counters in the header.
// A private pool has no loose-reference table (one process holds everything, and its mutex cannot
// be orphaned), so there its reference counts are primary.
#pragma once

#include <pthread.h>

#include <cstddef>
#include <cstdint>

namespace sparsekv::pool_state {

// Owner::process of a free owner, and of a held owner of a private pool.
inline constexpr int32_t kFreeOwner = -1;
inline constexpr int32_t kPrivateOwner = -2;

struct Header {
  pthread_mutex_t mutex;  // guards everything in the block
  int32_t total_pages;
  int32_t page_tokens;
  int32_t pages_per_owner;
  int32_t max_owners;
  int32_t max_processes;  // 0: a private pool (no process table, no loose references)
  // Derived (see above).
  int32_t free_pages;
  int32_t free_owners;
  int32_t shared_pages;      // pages with more than one reference
  int64_t extra_references;  // sum over pages of max(references - 1, 0)
  int32_t first_free_word;   // no word of the used-page bitmap below it has a free page
  int32_t live_processes;    // node pool: attached processes not known to be dead
  // Primary.
  int32_t closed;      // node pool: the last process detached and unlinked the file
  int32_t pad;         // keeps next_seal 8-byte aligned in every compiler's layout
  uint64_t next_seal;  // the last seal handed out (HostKVPool::Seal); never reused
};

struct Owner {
  int32_t process;  // the process slot holding it, kFreeOwner or kPrivateOwner
  int32_t pages;    // entries [0, pages) of its page-table row hold a reference each
  // Seal: readers may share the first sealed_pages pages while `seal` is current; 0 = unsealed.
  int32_t sealed_pages;
  int32_t sealed_tokens;
  uint64_t seal;
};

struct Process {
  int32_t live;  // 1 while attached (and not found dead)
  int32_t pid;
  // The kernel's start time of `pid` (clock ticks after boot, /proc/<pid>/stat field 22), so that
  // a reused pid is never taken for the process that registered.
  uint64_t start_time;
};

// Byte offsets of the parts of a block, each 64-byte aligned.
struct Layout {
  size_t header = 0;
  size_t owners = 0;      // Owner[max_owners]
  size_t processes = 0;   // Process[max_processes]
  size_t page_table = 0;  // int32_t[max_owners * pages_per_owner], -1 = none
  size_t refs = 0;        // int32_t[total_pages]
  size_t used_bits =
      0;             // uint64_t[ceil(total_pages / 64)]: bit set = page in use (or past the end)
  size_t loose = 0;  // int32_t[max_processes * total_pages]
  size_t bytes = 0;

  static Layout Of(int32_t total_pages, int32_t pages_per_owner, int32_t max_owners,
                   int32_t max_processes) {
    Layout l;
    size_t at = 0;
    auto take = [&at](size_t bytes) {
      const size_t start = at;
      at = (at + bytes + 63) / 64 * 64;
      return start;
    };
    const size_t pages = static_cast<size_t>(total_pages);
    l.header = take(sizeof(Header));
    l.owners = take(sizeof(Owner) * static_cast<size_t>(max_owners));
    l.processes = take(sizeof(Process) * static_cast<size_t>(max_processes));
    l.page_table = take(sizeof(int32_t) * static_cast<size_t>(max_owners) * pages_per_owner);
    l.refs = take(sizeof(int32_t) * pages);
    l.used_bits = take(sizeof(uint64_t) * Words(total_pages));
    l.loose = take(sizeof(int32_t) * static_cast<size_t>(max_processes) * pages);
    l.bytes = at;
    return l;
  }
  static size_t Words(int32_t total_pages) { return (static_cast<size_t>(total_pages) + 63) / 64; }
};

}  // namespace sparsekv::pool_state
