// Backend: where sparsekv's memory lives and how its operators run.
//
// Two implementations: the CPU reference backend (plain loops over ordinary memory; the oracle for
// every test) and the CUDA backend (pinned, device-mapped host memory, HBM, kernels). The manager
// is written once against this interface; operators receive the plain views of kernel_views.h.
//
// Streams are opaque handles (a cudaStream_t in the CUDA backend; ignored by the CPU backend, whose
// operations complete before they return). "Async" operations only enqueue on the stream: buffers
// they read or write must stay valid until the stream reaches them.
//
// Thread safety: a Backend may be shared by several managers; its operations on distinct streams
// may be called from different threads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "sparsekv/host_memory.h"
#include "sparsekv/kernel_views.h"
#include "sparsekv/status.h"

namespace sparsekv {

using StreamHandle = void*;  // cudaStream_t for the CUDA backend; nullptr = default stream
using EventHandle = void*;   // cudaEvent_t for the CUDA backend

enum class BackendKind { kCpu, kCuda };

class Backend {
 public:
  virtual ~Backend() = default;

  virtual BackendKind kind() const = 0;
  // e.g. "cpu" or "cuda:0 NVIDIA H200".
  virtual std::string name() const = 0;

  // Host memory for the KV pool: pinned and addressable by the device where there is one.
  virtual StatusOr<void*> AllocateHost(size_t bytes) = 0;
  virtual void FreeHost(void* ptr) = 0;
  // The host memory AllocateHost can still hand out of memory this backend took up front (an
  // arena allocated and pinned once), which a capacity check (capacity.h) counts instead of the
  // machine's; Unavailable (the default) from a backend whose AllocateHost allocates anew.
  virtual StatusOr<int64_t> ReservedHostBytes() {
    return Unavailable("backend " + name() + " reserves no host memory");
  }
  // Makes `bytes` of host memory at `ptr` that the caller mapped (e.g. a node pool's segment,
  // shared with other processes: node_pool.h) pinned and addressable by the operators at its host
  // address, as AllocateHost's memory is: the CUDA backend registers it (cudaHostRegister,
  // portable and mapped); the CPU backend has nothing to do. Unavailable from a backend that
  // cannot (the default). REQUIRES (not checked): the range stays mapped until UnregisterHost.
  virtual Status RegisterHost(void* ptr, size_t bytes) {
    (void)ptr;
    (void)bytes;
    return Unavailable("backend " + name() + " cannot register host memory");
  }
  // Undoes RegisterHost(ptr, ...). REQUIRES (not checked): nothing enqueued still reads it.
  //
  // A large range may be registered whole or chunk by chunk (host_memory.h registers chunks of
  // at most 64 GiB): each call is a registration of its own, undone by UnregisterHost of its own
  // start, and the operators and copies use a range made of several registrations as one. The
  // CUDA backend itself registers a range larger than its HostMemoryOptions::chunk_bytes in
  // chunks, populated in parallel (CreateCudaBackend).
  virtual void UnregisterHost(void* ptr) { (void)ptr; }
  // The NUMA node of the host memory nearest the device (CUDA: the GPU's PCI device's node, from
  // sysfs); -1 if unknown or if there is no device (the CPU backend).
  virtual int32_t HostNumaNode() const { return -1; }
  // Memory the operators use as "device" memory: HBM for CUDA, ordinary memory for the CPU.
  virtual StatusOr<void*> AllocateDevice(size_t bytes) = 0;
  virtual void FreeDevice(void* ptr) = 0;
  // Bytes AllocateDevice can still have: the device's free HBM under CUDA (cudaMemGetInfo), the
  // host memory capacity.h counts for the CPU backend. What the capacity checks ask before a
  // large device allocation (capacity.h). Unavailable from a backend that cannot tell (the
  // default): the checks then pass.
  virtual StatusOr<int64_t> FreeDeviceBytes() {
    return Unavailable("backend " + name() + " does not report its free device memory");
  }

  // Copies between any two of host and device memory. Pageable host sources may be reused as soon
  // as the call returns.
  virtual Status CopyAsync(void* dst, const void* src, size_t bytes, StreamHandle stream) = 0;
  virtual Status MemsetAsync(void* dst, int value, size_t bytes, StreamHandle stream) = 0;
  // Blocks until everything enqueued on the stream has completed.
  virtual Status Synchronize(StreamHandle stream) = 0;

  // A second stream for work that may overlap the main one (host write-back). Fork makes the side
  // stream wait for what the main stream has enqueued so far; Join makes the main stream wait for
  // what the side stream has enqueued so far. Both are legal inside CUDA graph capture.
  virtual StreamHandle SideStream() = 0;
  virtual Status Fork(StreamHandle main) = 0;
  virtual Status Join(StreamHandle main) = 0;

  // Streams and events for callers that order work across streams themselves (the step
  // schedule, step_schedule.h). The CPU backend completes every operation before it returns, so
  // its streams are plain handles, waits do nothing, and its events record the host's clock.
  // A stream that runs concurrently with the others (CUDA: non-blocking).
  virtual StatusOr<StreamHandle> CreateStream() = 0;
  virtual void DestroyStream(StreamHandle stream) = 0;
  // With `timing`, ElapsedSeconds can read the time between two of them.
  virtual StatusOr<EventHandle> CreateEvent(bool timing) = 0;
  virtual void DestroyEvent(EventHandle event) = 0;
  // Marks `event` at what `stream` has enqueued so far; WaitEvent makes `stream` wait for the
  // last mark. Both are legal inside CUDA graph capture.
  virtual Status RecordEvent(EventHandle event, StreamHandle stream) = 0;
  virtual Status WaitEvent(StreamHandle stream, EventHandle event) = 0;
  // Seconds from `start` to `end` (timing events, both recorded); waits until `end` is reached.
  virtual StatusOr<double> ElapsedSeconds(EventHandle start, EventHandle end) = 0;
  // Whether `stream` is being captured into a graph (what it enqueues then runs only at a launch).
  virtual StatusOr<bool> IsCapturing(StreamHandle stream) = 0;
  // Whether `stream` can carry this backend's work: InvalidArgument naming both devices for a
  // stream of another device (CUDA). The default stream (null) and every CPU stream can.
  virtual Status CheckStream(StreamHandle stream) {
    (void)stream;
    return Status::Ok();
  }

  // The operators (semantics in kernel_views.h). They never allocate and never synchronise.
  virtual Status IndexCopy(const IndexCopyView& view, StreamHandle stream) = 0;
  // Both copies of `view` as one operation (the CUDA backend: one kernel launch); what a step's
  // append of rows and indexer keys runs. InvalidArgument (CUDA) where either view is one
  // IndexCopy refuses.
  virtual Status IndexCopyPair(const IndexCopyPairView& view, StreamHandle stream) = 0;
  virtual Status Resolve(const ResolveView& view, int32_t max_batch, StreamHandle stream) = 0;
  virtual Status Assemble(const AssembleView& view, int32_t max_batch, StreamHandle stream) = 0;
  // InvalidArgument for places outside [1, kMaxRoutePlaces] or page_rows < 1.
  virtual Status RouteRows(const RouteRowsView& view, StreamHandle stream) = 0;
  // InvalidArgument for entry_tokens < 1, page_rows < 1, pages_per_row < 0, row_bytes < 1,
  // row_stride < row_bytes, or window rows with raw_window < 1.
  virtual Status DenseAppend(const DenseAppendView& view, int32_t max_batch,
                             StreamHandle stream) = 0;

  // ---- Device memory shared between processes (the peer tier, peer_tier.h) ----

  // A handle to AllocateDevice's allocation at `ptr` (its start) that ImportDevice of a backend in
  // another process of the machine (or in this one) maps. CUDA: a CUDA IPC handle; the CPU backend
  // shares within its own process only. Unavailable from a backend that cannot (the default).
  virtual StatusOr<std::string> ExportDevice(void* ptr) {
    (void)ptr;
    return Unavailable("backend " + name() + " cannot share device memory");
  }
  // Maps the allocation that `handle` names, readable by this backend's operators (under CUDA from
  // another GPU of the machine too, over peer access). A handle is checked before anything is read
  // through it: InvalidArgument for a handle of another kind of backend or one that does not
  // parse; NotFound for a handle of this process whose allocation was freed (or never existed);
  // Unavailable if it cannot be mapped here (e.g. GPUs without peer access, another process's
  // allocation that CUDA IPC cannot open, or any other process's for the CPU backend).
  virtual StatusOr<void*> ImportDevice(std::string_view handle) {
    (void)handle;
    return Unavailable("backend " + name() + " cannot share device memory");
  }
  // The bytes of the allocation ImportDevice mapped at `ptr`: all that may be read there.
  // NotFound if `ptr` is not what an ImportDevice not yet closed returned.
  virtual StatusOr<size_t> ImportedBytes(const void* ptr) {
    (void)ptr;
    return Unavailable("backend " + name() + " cannot share device memory");
  }
  // Unmaps what ImportDevice returned. REQUIRES (not checked): nothing enqueued still reads it.
  virtual void CloseImported(void* ptr) { (void)ptr; }
};

// The reference backend. Never fails to create.
std::shared_ptr<Backend> CreateCpuBackend();

// How the CUDA backend backs large host allocations (the KV pool). The GPU reads the pool through
// its own address translation, whose reach decides the speed of random row gathers over large
// spans (docs/index-copy.md): 2 MB pages are the lever.
enum class HostMemoryKind {
  kAuto,                  // kHugeTlb if the system has free huge pages, else kTransparentHugePages
  kHugeTlb,               // MAP_HUGETLB (reserved 2 MB pages, vm.nr_hugepages), then registered
  kTransparentHugePages,  // 2 MB-aligned anonymous memory with MADV_HUGEPAGE, then registered
  kCudaHostAlloc,         // cudaHostAlloc
  kCudaVmm,               // cuMemCreate of pinned host memory (CUDA virtual memory management),
                          // mapped for the device and the CPU at the allocation granularity
};

// The CUDA backend on `device`. Unavailable if the library was built without CUDA or no device is
// present; the message says which. Allocations below 2 MB always use cudaHostAlloc; a large one
// that cannot be had in the kind asked for falls back along kHugeTlb -> kTransparentHugePages ->
// kCudaHostAlloc only under kAuto, and is an error otherwise. kCudaVmm is only used when asked.
// Large kHugeTlb and kTransparentHugePages allocations, and every RegisterHost, are populated and
// registered as `preparation` says (host_memory.h: chunks of at most chunk_bytes, populated in
// parallel on the GPU's NUMA node, progress per allocation); `host_memory`, not its huge_pages,
// decides the pages.
StatusOr<std::shared_ptr<Backend>> CreateCudaBackend(
    int device = 0, HostMemoryKind host_memory = HostMemoryKind::kAuto);
StatusOr<std::shared_ptr<Backend>> CreateCudaBackend(int device, HostMemoryKind host_memory,
                                                     const HostMemoryOptions& preparation);

// True if the library was compiled with the CUDA backend (whether or not a GPU is present).
bool CudaBackendCompiled();

}  // namespace sparsekv
