// ArenaBackend: a Backend whose host allocations come from one block allocated up front.
//
// Pinning host memory costs seconds per ten gigabytes, and the end-to-end benchmark creates a
// host pool for every (variant, context) it runs. Wrapping the CUDA backend in an ArenaBackend
// pins the largest pool once per process: AllocateHost hands out consecutive, 2 MB-aligned pieces
// of the arena, and once every piece has been freed the next allocation starts at its beginning
// again. Everything else (RegisterHost for a node pool's segment included) is forwarded to the
// wrapped backend.
//
// The arena is the library's HostMemory (host_memory.h): huge pages where the system has them,
// populated in parallel on the GPU's NUMA node, registered with the wrapped backend
// (RegisterHost) in chunks, with progress reported as HostMemoryOptions says.
//
// It lives with `sparsekv bench`, not in the library: the end-to-end benchmark is its only user
// (the operator benchmarks under bench/ allocate their pinned buffers directly).
//
// Thread safety: AllocateHost and FreeHost must not be called concurrently.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "sparsekv/backend.h"
#include "sparsekv/host_memory.h"

namespace sparsekv::tools {

class ArenaBackend final : public Backend {
 public:
  // Allocates the arena (`bytes`, rounded up to 2 MB) with HostMemory::Allocate, registered with
  // `base` chunk by chunk.
  static StatusOr<std::shared_ptr<ArenaBackend>> Create(std::shared_ptr<Backend> base, size_t bytes,
                                                        const HostMemoryOptions& options = {});
  ~ArenaBackend() override;

  std::byte* arena() const { return arena_; }
  size_t arena_bytes() const { return bytes_; }
  // How the arena was populated and registered (chunks, threads, NUMA node, time).
  const HostRegistration& arena_registration() const { return memory_->registration(); }

  BackendKind kind() const override { return base_->kind(); }
  std::string name() const override { return base_->name(); }
  // ResourceExhausted if the rest of the arena is too small.
  StatusOr<void*> AllocateHost(size_t bytes) override;
  void FreeHost(void* ptr) override;
  // What is left of the arena: the pool's capacity check counts it, not the machine's memory
  // (which the arena already holds).
  StatusOr<int64_t> ReservedHostBytes() override { return static_cast<int64_t>(bytes_ - used_); }
  Status RegisterHost(void* ptr, size_t bytes) override { return base_->RegisterHost(ptr, bytes); }
  void UnregisterHost(void* ptr) override { base_->UnregisterHost(ptr); }
  int32_t HostNumaNode() const override { return base_->HostNumaNode(); }
  StatusOr<void*> AllocateDevice(size_t bytes) override { return base_->AllocateDevice(bytes); }
  void FreeDevice(void* ptr) override { base_->FreeDevice(ptr); }
  Status CopyAsync(void* dst, const void* src, size_t bytes, StreamHandle stream) override {
    return base_->CopyAsync(dst, src, bytes, stream);
  }
  Status MemsetAsync(void* dst, int value, size_t bytes, StreamHandle stream) override {
    return base_->MemsetAsync(dst, value, bytes, stream);
  }
  Status Synchronize(StreamHandle stream) override { return base_->Synchronize(stream); }
  StreamHandle SideStream() override { return base_->SideStream(); }
  Status Fork(StreamHandle main) override { return base_->Fork(main); }
  Status Join(StreamHandle main) override { return base_->Join(main); }
  StatusOr<StreamHandle> CreateStream() override { return base_->CreateStream(); }
  void DestroyStream(StreamHandle stream) override { base_->DestroyStream(stream); }
  StatusOr<EventHandle> CreateEvent(bool timing) override { return base_->CreateEvent(timing); }
  void DestroyEvent(EventHandle event) override { base_->DestroyEvent(event); }
  Status RecordEvent(EventHandle event, StreamHandle stream) override {
    return base_->RecordEvent(event, stream);
  }
  Status WaitEvent(StreamHandle stream, EventHandle event) override {
    return base_->WaitEvent(stream, event);
  }
  StatusOr<double> ElapsedSeconds(EventHandle start, EventHandle end) override {
    return base_->ElapsedSeconds(start, end);
  }
  StatusOr<bool> IsCapturing(StreamHandle stream) override { return base_->IsCapturing(stream); }
  Status CheckStream(StreamHandle stream) override { return base_->CheckStream(stream); }
  Status IndexCopy(const IndexCopyView& view, StreamHandle stream) override {
    return base_->IndexCopy(view, stream);
  }
  Status IndexCopyPair(const IndexCopyPairView& view, StreamHandle stream) override {
    return base_->IndexCopyPair(view, stream);
  }
  Status Resolve(const ResolveView& view, int32_t max_batch, StreamHandle stream) override {
    return base_->Resolve(view, max_batch, stream);
  }
  Status Assemble(const AssembleView& view, int32_t max_batch, StreamHandle stream) override {
    return base_->Assemble(view, max_batch, stream);
  }
  Status RouteRows(const RouteRowsView& view, StreamHandle stream) override {
    return base_->RouteRows(view, stream);
  }
  Status DenseAppend(const DenseAppendView& view, int32_t max_batch, StreamHandle stream) override {
    return base_->DenseAppend(view, max_batch, stream);
  }
  StatusOr<std::string> ExportDevice(void* ptr) override { return base_->ExportDevice(ptr); }
  StatusOr<void*> ImportDevice(std::string_view handle) override {
    return base_->ImportDevice(handle);
  }
  StatusOr<size_t> ImportedBytes(const void* ptr) override { return base_->ImportedBytes(ptr); }
  void CloseImported(void* ptr) override { base_->CloseImported(ptr); }

 private:
  ArenaBackend(std::shared_ptr<Backend> base, std::unique_ptr<HostMemory> memory)
      : base_(std::move(base)),
        memory_(std::move(memory)),
        arena_(memory_->data()),
        bytes_(memory_->bytes()) {}

  std::shared_ptr<Backend> base_;
  std::unique_ptr<HostMemory> memory_;  // destroyed first: unregisters with base_, then unmaps
  std::byte* arena_;
  size_t bytes_;
  size_t used_ = 0;          // bytes handed out since the arena was last empty
  int64_t outstanding_ = 0;  // pieces not yet freed
};

}  // namespace sparsekv::tools
