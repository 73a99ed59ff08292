// Node pool: one host KV pool for the processes of a machine, read directly by their GPUs.
//
// A node pool is a HostKVPool (host_kv_pool.h) whose rows and bookkeeping live in one
// shared-memory segment: a file in a tmpfs (/dev/shm, POSIX shared memory) or a hugetlbfs mount
// that every process of the machine using the pool maps. Each process attaches with a HostKVPool
// of its own over the segment (CreateNodePool, OpenNodePool); under CUDA the rows are registered
// as mapped, portable pinned memory (Backend::RegisterHost), so that the resolve and gather
// kernels of every GPU read them at their host address like any pool's rows.
//
// The prefill -> decode hand-off on one machine, without copying a prompt:
//   prefill:  owner = pool.AcquireOwner(); pool.Reserve(owner, tokens);
//             WritePromptLayer(pool, ..., owner, layer, rows) for every layer;
//             seal = pool.Seal(owner, tokens)
//             -> the control plane: the pool's descriptor (DescribeNodePool) as a region of the
//                node that serves it, and the request's location {owner, seal}
//                (control_plane.h, RequestLocation::node_pool_owner / node_pool_seal)
//   decode:   a manager created over the same node pool (UseNodePoolShape, then
//             SparseKVCacheManager::Create(options, backend, pool)) admits the request with
//             AdmitFromNodePool(manager, id, {owner, seal}, ...) (manager.h; SparseKVCacheManager::
//             AdmitSealedPrompt): its page table takes the sealed pages (one reference each),
//             nothing is copied but the window into the hot cache, and its steps run exactly as
//             for a local request (graph-capturable, no special case).
//             Then Done on the control plane.
//   prefill:  once the reader is done, Release on the control plane, then pool.Release(owner)
//             and pool.ReleaseOwner(owner); the decode's references keep the pages.
//
// Failure semantics. Every page reference and owner is held by the attached process that took
// it. A process that dies (even SIGKILL) holding the segment's mutex leaves the next process to
// take it a consistent state (a robust mutex; the derived state is rebuilt); the references and
// owners of a dead process are dropped by the next attach, detach, ReclaimDeadProcesses, or
// reservation that finds the pool short, so that pages are freed exactly once, whoever exits
// first. A dead writer's seals end with its owners: AdmitFromNodePool of one fails (NotFound)
// and the request must be recomputed; a reader that admitted a request before keeps its pages
// and decodes on. The last process to detach removes the segment's file; if every process was
// killed, the next CreateNodePool of that name finds the segment stale (no live process) and
// replaces it.
//
// Processes must share a PID namespace (liveness is the pid and its start time in /proc), and a
// process must not use a pool object it inherited through fork() (it opens the pool itself).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "sparsekv/backend.h"
#include "sparsekv/host_kv_pool.h"
#include "sparsekv/options.h"
#include "sparsekv/status.h"
#include "sparsekv/types.h"

namespace sparsekv {

struct NodePoolOptions {
  // ---- Behaviour ----
  // The segment's file name in `directory`: 1-200 characters of [A-Za-z0-9._-], not starting
  // with '.'. CreateNodePool only (OpenNodePool takes the path).
  std::string name;
  // A tmpfs (POSIX shared memory) or a hugetlbfs mount (2 MB pages reserved with
  // vm.nr_hugepages). CreateNodePool only.
  std::string directory = "/dev/shm";
  // Attached processes at once (each HostKVPool over the segment counts), in [1, 4096].
  // CreateNodePool only. The bookkeeping holds a loose-reference count per process and page:
  // max_processes * pages * 4 bytes.
  int32_t max_processes = 16;

  // ---- Performance ----
  // Advise transparent huge pages for the rows (madvise MADV_HUGEPAGE; a tmpfs honours it when
  // /sys/kernel/mm/transparent_hugepage/shmem_enabled is "advise", "within_size" or "always").
  // The GPU's gathers over a large pool are limited by address translation: docs/index-copy.md.
  bool huge_pages = true;
};

// What a process needs to open a node pool: the segment's path and id. The node that serves the
// pool publishes it through the control plane as a region descriptor (Serialize).
struct NodePoolDescriptor {
  std::string path;
  uint64_t id = 0;  // the segment's id: a segment created again under the path has another

  // "sparsekv-node-pool/1 id=<hex> path=<path>".
  std::string Serialize() const;
  // InvalidArgument unless `text` is what Serialize writes.
  static StatusOr<NodePoolDescriptor> Parse(std::string_view text);
};

// A sealed prompt in a node pool: the writer's owner and the seal HostKVPool::Seal returned.
struct NodePoolPrompt {
  int32_t owner = -1;
  uint64_t seal = 0;
};

// Creates the segment `node.directory`/`node.name` for a pool with options' geometry,
// host_capacity_tokens, host_page_tokens and max_context, `max_owners` page-table rows (live
// requests and prompts of every process together), and attaches this process to it. Under CUDA
// the rows are registered with `backend` (RegisterHost). The pool keeps `backend` alive.
// AlreadyExists if a live node pool has that name (a stale one, whose processes all exited, is
// replaced); ResourceExhausted if the file system or the machine has no room for it
// (NodePoolBytes); InvalidArgument for invalid
// options, a bad name or max_processes, or max_owners < 1; Unimplemented for a geometry with
// resident or window-only layers (HostKVPool::CheckShareable: a segment records no layer kinds);
// the backend's error if it cannot register host memory.
StatusOr<std::shared_ptr<HostKVPool>> CreateNodePool(const CacheOptions& options,
                                                     int32_t max_owners,
                                                     const NodePoolOptions& node,
                                                     std::shared_ptr<Backend> backend);
// The size of the segment CreateNodePool(options, max_owners, node, ...) creates: the rows of
// every layer (each layer 2 MB-aligned) and the bookkeeping (page tables, reference counts, a
// loose-reference count per process and page). All of it is written when the pool is created,
// so node.directory's file system must have that much room, and the machine that much memory:
// CreateNodePool checks both first (capacity.h) and refuses with ResourceExhausted, naming the
// numbers, before it makes the file. InvalidArgument and Unimplemented as CreateNodePool.
StatusOr<int64_t> NodePoolBytes(const CacheOptions& options, int32_t max_owners,
                                const NodePoolOptions& node);
// Attaches this process to the node pool at `path` (node.huge_pages applies; the other fields are
// the creator's). The segment's header is checked (its checksum, then its shape against the
// file's size) before anything it describes is read. NotFound if there is none; Unavailable if
// the path cannot be opened (a directory, say); FailedPrecondition if it is not a node pool (not
// a regular file, too small, another version, a header that fails its checks) or was closed by
// its last process; ResourceExhausted if max_processes live processes are attached; the
// backend's error if it cannot register host memory.
StatusOr<std::shared_ptr<HostKVPool>> OpenNodePool(const std::string& path,
                                                   const NodePoolOptions& node,
                                                   std::shared_ptr<Backend> backend);
// OpenNodePool of the pool `descriptor` (NodePoolDescriptor::Serialize's text) names, refused
// before this process attaches unless the segment at its path is the one described: how a reader
// opens a pool it learnt of through the control plane. InvalidArgument for a descriptor that does
// not parse or has id 0; NotFound if there is no segment at its path or the segment there has
// another id (the pool was created again since); otherwise OpenNodePool's errors.
StatusOr<std::shared_ptr<HostKVPool>> OpenDescribedNodePool(std::string_view descriptor,
                                                            const NodePoolOptions& node,
                                                            std::shared_ptr<Backend> backend);
// The descriptor of a node pool (empty path and id 0 for a private pool).
NodePoolDescriptor DescribeNodePool(const HostKVPool& pool);
// Sets options' geometry, host_capacity_tokens, host_page_tokens and max_context to the pool's,
// so that SparseKVCacheManager::Create(options, backend, pool) accepts the pool.
void UseNodePoolShape(const HostKVPool& pool, CacheOptions& options);

// Writes the rows of positions [0, tokens) of `layer` ([tokens, row_stride(layer)] at `rows`, in
// host memory or `backend`'s device memory) into `owner`'s pages, with backend.CopyAsync on
// `stream`: how a writer fills a prompt before sealing it. `rows` must stay valid until `stream`
// reaches the copies. InvalidArgument for a bad layer, an owner out of range, null rows or
// tokens < 1; OutOfRange if
// tokens exceeds the owner's reserved tokens; FailedPrecondition in a node pool for an owner this
// process does not hold.
Status WritePromptLayer(HostKVPool& pool, Backend& backend, int32_t owner, int32_t layer,
                        const void* rows, int32_t tokens, StreamHandle stream);

}  // namespace sparsekv
