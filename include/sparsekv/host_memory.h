// Host memory at real sizes: populating and pinning a large range for the device, in chunks.
//
// One cudaHostRegister of a whole pool is slow (the driver faults in and pins every page from one
// thread) and fails outright for a range of 512 GiB or more. RegisterHostRange splits the range
// into chunks of at most `chunk_bytes` (vLLM registers 64-GiB chunks), populates them in parallel
// (first touch from `threads` threads, each bound to the GPU's NUMA node where libnuma is present,
// so that the pages are placed there), and registers each populated chunk with a HostRegistrar
// (Backend::RegisterHost, or a fake in tests) while the next chunks are being populated. Progress
// is reported after every populated slice and every registered chunk. Teardown unregisters the
// chunks in parallel, and HostMemory unmaps its mapping in parallel chunks too.
//
// A range made of several registrations is one contiguous range to the device: under UVA every
// chunk is mapped at its host address, so kernels read across chunk boundaries as they would
// within one registration, and cudaMemcpy of a span that crosses a boundary is correct (the
// driver may stage such a copy as it does pageable memory; the pool's copies are rows, each
// inside one chunk but at the chunk boundaries).
//
// Populating writes nothing: it uses MADV_POPULATE_WRITE (Linux 5.14) and, where the kernel
// lacks it, an atomic read-modify-write of one byte per page that leaves its value as it was, so
// a range with contents (a node pool's shared segment) may be registered too.
//
// Thread safety: the functions may be called from any thread; a HostRegistration or HostMemory
// is owned by one thread. The progress callback is called from the worker threads, one call at a
// time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "sparsekv/status.h"

namespace sparsekv {

class Backend;

// [offset, offset + bytes) of a range: one registration.
struct HostChunk {
  size_t offset = 0;
  size_t bytes = 0;
};

// Chunks covering [begin, begin + bytes) in order, each at most max(chunk_bytes rounded down to
// `alignment`, alignment) bytes, with every boundary between two chunks at an address that is a
// multiple of `alignment` (so that no page, or huge page, is in two registrations): the first
// chunk is shorter when `begin` is not aligned, the last one holds the remainder. Empty for
// bytes == 0. REQUIRES: alignment is a power of two.
std::vector<HostChunk> SplitHostRange(uintptr_t begin, size_t bytes, size_t chunk_bytes,
                                      size_t alignment);

// How far RegisterHostRange has come. Every field only grows from one call to the next; the last
// call has registered_bytes == total_bytes.
struct HostMemoryProgress {
  int64_t total_bytes = 0;
  int64_t populated_bytes = 0;   // first-touched
  int64_t registered_bytes = 0;  // populated and registered: ready for the device
  int32_t chunks = 0;
  int32_t registered_chunks = 0;
  double elapsed_seconds = 0;  // since RegisterHostRange began
};

struct HostMemoryOptions {
  // ---- Behaviour ----

  // The largest single registration (cudaHostRegister fails at >= 512 GiB).
  size_t chunk_bytes = size_t{64} << 30;
  // The NUMA node whose memory the pages should come from and whose cores populate them;
  // kDeviceNumaNode: the registrar's (HostRegistrar::numa_node: Backend::HostNumaNode, the
  // node of the GPU's PCI device under CUDA), no binding where that is -1. Without libnuma
  // (libnuma.so.1) at run time, or for a node that does not exist, the threads run unbound and the
  // kernel places the pages.
  static constexpr int32_t kDeviceNumaNode = -1;
  int32_t numa_node = kDeviceNumaNode;
  // Ask for transparent huge pages (MADV_HUGEPAGE) on anonymous memory HostMemory maps; reserved
  // huge pages (hugetlb) are used where enough are free (HostMemory::Allocate).
  bool huge_pages = true;
  // Called after each populated slice and each registered chunk (HostMemoryProgress), one call
  // at a time, from a worker thread; must not call back into the range's registration.
  std::function<void(const HostMemoryProgress&)> progress;

  // ---- Performance ----

  // Threads that populate: 0 = the cores of numa_node (sysfs), or std::thread's
  // hardware_concurrency when there is no node. Also the threads that unregister and unmap.
  int32_t threads = 0;
  // Threads that register populated chunks, in chunk order. The CUDA documentation promises
  // thread safety of cudaHostRegister, not that concurrent calls pin concurrently; 1 overlaps
  // registration with population without relying on that.
  int32_t register_threads = 1;
};

// How chunks are registered and unregistered: Backend::RegisterHost / UnregisterHost (Of), or
// a fake in tests. Both are called from worker threads; register_chunk from several at once
// when register_threads > 1.
struct HostRegistrar {
  std::function<Status(void* ptr, size_t bytes)> register_chunk;
  std::function<void(void* ptr)> unregister_chunk;
  int32_t numa_node = -1;  // the device's NUMA node, -1 = unknown (HostMemoryOptions::numa_node)

  // RegisterHost / UnregisterHost of `backend`, which must outlive every use.
  static HostRegistrar Of(Backend& backend);
};

// What populating ran on: for the caller's log, and for tests.
struct HostMemoryPlacement {
  int32_t threads = 0;
  int32_t numa_node = -1;      // the node asked for (resolved), -1 = none
  bool bound_to_node = false;  // whether the threads could be bound to it (libnuma present)
};

// A registered range: its chunks stay registered until it is destroyed (or Release is called),
// which unregisters them in parallel. REQUIRES: the range stays mapped while it is registered,
// and nothing enqueued still reads it when it is unregistered.
class HostRegistration {
 public:
  ~HostRegistration() { Release(); }
  HostRegistration(const HostRegistration&) = delete;
  HostRegistration& operator=(const HostRegistration&) = delete;

  // Unregisters every chunk (with options.threads threads); idempotent.
  void Release();

  std::byte* data() const { return base_; }
  size_t bytes() const { return bytes_; }
  const std::vector<HostChunk>& chunks() const { return chunks_; }
  const HostMemoryPlacement& placement() const { return placement_; }
  // Seconds from the start to the last chunk registered.
  double ready_seconds() const { return ready_seconds_; }

 private:
  friend StatusOr<std::unique_ptr<HostRegistration>> RegisterHostRange(
      void* ptr, size_t bytes, const HostMemoryOptions& options, HostRegistrar registrar);
  HostRegistration() = default;

  std::byte* base_ = nullptr;
  size_t bytes_ = 0;
  std::vector<HostChunk> chunks_;
  HostRegistrar registrar_;
  int32_t threads_ = 1;
  HostMemoryPlacement placement_;
  double ready_seconds_ = 0;
  bool registered_ = false;
};

// Populates and registers [ptr, ptr + bytes) in chunks, as the file comment says; chunk
// boundaries are 2 MB-aligned addresses. All or nothing: if a chunk's registration fails, the
// chunks already registered are unregistered and the error, naming the chunk, is returned.
// InvalidArgument for bytes == 0, chunk_bytes < 2 MB, threads < 0 or register_threads < 1.
StatusOr<std::unique_ptr<HostRegistration>> RegisterHostRange(void* ptr, size_t bytes,
                                                              const HostMemoryOptions& options,
                                                              HostRegistrar registrar);

// Anonymous host memory of its own, mapped, populated and registered in chunks; unmapped (in
// parallel chunks) when destroyed, after its registration is released.
class HostMemory {
 public:
  // `bytes` rounded up to 2 MB at a 2 MB-aligned address: reserved huge pages (MAP_HUGETLB) if
  // options.huge_pages and as many are free (vm.nr_hugepages), else ordinary anonymous memory
  // with MADV_HUGEPAGE when options.huge_pages. ResourceExhausted if it cannot be mapped; the
  // errors of RegisterHostRange otherwise (nothing stays mapped then).
  static StatusOr<std::unique_ptr<HostMemory>> Allocate(size_t bytes,
                                                        const HostMemoryOptions& options,
                                                        HostRegistrar registrar);
  // Only reserved huge pages (hugetlb), or only ordinary pages: what Allocate chooses between.
  enum class Pages { kHugeTlb, kOrdinary };
  static StatusOr<std::unique_ptr<HostMemory>> Allocate(size_t bytes, Pages pages,
                                                        const HostMemoryOptions& options,
                                                        HostRegistrar registrar);
  ~HostMemory();
  HostMemory(const HostMemory&) = delete;
  HostMemory& operator=(const HostMemory&) = delete;

  std::byte* data() const { return registration_->data(); }
  size_t bytes() const { return registration_->bytes(); }
  bool huge_tlb() const { return pages_ == Pages::kHugeTlb; }
  const HostRegistration& registration() const { return *registration_; }

 private:
  HostMemory(std::unique_ptr<HostRegistration> registration, Pages pages)
      : registration_(std::move(registration)), pages_(pages) {}

  std::unique_ptr<HostRegistration> registration_;
  Pages pages_;
};

// The cores of NUMA node `node` (its sysfs cpulist); 0 if it has none or cannot be read.
int32_t NumaNodeCores(int32_t node);
// The NUMA node of the PCI device `bus_id` ("0000:3b:00.0", any case), from sysfs; -1 if the
// machine does not say (one node, or no sysfs).
int32_t NumaNodeOfPciDevice(const std::string& bus_id);

}  // namespace sparsekv
