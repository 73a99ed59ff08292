// CountingBackend: the CPU backend, counting the host and device bytes allocated and not yet
// freed, so that a test can hold a part's memory figures to what it allocated.
//
// Not thread-safe: for tests that drive one part from one thread.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "sparsekv/backend.h"

namespace sparsekv::testing {

class CountingBackend final : public Backend {
 public:
  BackendKind kind() const override { return base_->kind(); }
  std::string name() const override { return base_->name(); }
  StatusOr<void*> AllocateHost(size_t bytes) override {
    SPARSEKV_ASSIGN_OR_RETURN(void* p, base_->AllocateHost(bytes));
    host_[p] = static_cast<int64_t>(bytes);
    return p;
  }
  void FreeHost(void* ptr) override {
    host_.erase(ptr);
    base_->FreeHost(ptr);
  }
  StatusOr<void*> AllocateDevice(size_t bytes) override {
    SPARSEKV_ASSIGN_OR_RETURN(void* p, base_->AllocateDevice(bytes));
    device_[p] = static_cast<int64_t>(bytes);
    return p;
  }
  void FreeDevice(void* ptr) override {
    device_.erase(ptr);
    base_->FreeDevice(ptr);
  }
  Status CopyAsync(void* dst, const void* src, size_t bytes, StreamHandle s) override {
    return base_->CopyAsync(dst, src, bytes, s);
  }
  Status MemsetAsync(void* dst, int value, size_t bytes, StreamHandle s) override {
    return base_->MemsetAsync(dst, value, bytes, s);
  }
  Status Synchronize(StreamHandle s) override { return base_->Synchronize(s); }
  StreamHandle SideStream() override { return base_->SideStream(); }
  Status Fork(StreamHandle main) override { return base_->Fork(main); }
  Status Join(StreamHandle main) override { return base_->Join(main); }
  StatusOr<StreamHandle> CreateStream() override { return base_->CreateStream(); }
  void DestroyStream(StreamHandle s) override { base_->DestroyStream(s); }
  StatusOr<EventHandle> CreateEvent(bool timing) override { return base_->CreateEvent(timing); }
  void DestroyEvent(EventHandle e) override { base_->DestroyEvent(e); }
  Status RecordEvent(EventHandle e, StreamHandle s) override { return base_->RecordEvent(e, s); }
  Status WaitEvent(StreamHandle s, EventHandle e) override { return base_->WaitEvent(s, e); }
  StatusOr<double> ElapsedSeconds(EventHandle a, EventHandle b) override {
    return base_->ElapsedSeconds(a, b);
  }
  StatusOr<bool> IsCapturing(StreamHandle s) override { return base_->IsCapturing(s); }
  Status IndexCopy(const IndexCopyView& v, StreamHandle s) override {
    return base_->IndexCopy(v, s);
  }
  Status IndexCopyPair(const IndexCopyPairView& v, StreamHandle s) override {
    return base_->IndexCopyPair(v, s);
  }
  Status Resolve(const ResolveView& v, int32_t max_batch, StreamHandle s) override {
    return base_->Resolve(v, max_batch, s);
  }
  Status Assemble(const AssembleView& v, int32_t max_batch, StreamHandle s) override {
    return base_->Assemble(v, max_batch, s);
  }
  Status RouteRows(const RouteRowsView& v, StreamHandle s) override {
    return base_->RouteRows(v, s);
  }
  Status DenseAppend(const DenseAppendView& v, int32_t max_batch, StreamHandle s) override {
    return base_->DenseAppend(v, max_batch, s);
  }

  // Bytes allocated and not yet freed.
  int64_t live_device_bytes() const { return Sum(device_); }
  int64_t live_host_bytes() const { return Sum(host_); }
  // Allocations not yet freed.
  int32_t live_host_allocations() const { return static_cast<int32_t>(host_.size()); }

 private:
  static int64_t Sum(const std::map<void*, int64_t>& live) {
    int64_t sum = 0;
    for (const auto& [p, bytes] : live) sum += bytes;
    return sum;
  }

  std::shared_ptr<Backend> base_ = CreateCpuBackend();
  std::map<void*, int64_t> device_;
  std::map<void*, int64_t> host_;
};

}  // namespace sparsekv::testing
