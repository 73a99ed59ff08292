// Backends for tests that wrap another one (the CPU backend by default): ForwardingBackend passes
// every call on, and the others override what they watch or change: FaultyBackend (here) fails a
// chosen stream operation, for the refusals a host cannot foresee; CountingBackend
// (counting_backend.h) counts the memory it holds; RecordingBackend (recording_backend.h) counts
// the operations of each stream and records a run phase to replay it, as a CUDA graph would.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "sparsekv/backend.h"

namespace sparsekv::testing {

// Every call goes to `base`.
class ForwardingBackend : public Backend {
 public:
  explicit ForwardingBackend(std::shared_ptr<Backend> base = CreateCpuBackend())
      : base_(std::move(base)) {}

  BackendKind kind() const override { return base_->kind(); }
  std::string name() const override { return base_->name(); }
  StatusOr<void*> AllocateHost(size_t bytes) override { return base_->AllocateHost(bytes); }
  void FreeHost(void* ptr) override { base_->FreeHost(ptr); }
  StatusOr<void*> AllocateDevice(size_t bytes) override { return base_->AllocateDevice(bytes); }
  void FreeDevice(void* ptr) override { base_->FreeDevice(ptr); }
  StatusOr<int64_t> FreeDeviceBytes() override { return base_->FreeDeviceBytes(); }
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

 protected:
  Backend& base() { return *base_; }

 private:
  std::shared_ptr<Backend> base_;
};

// Fails one call (with Internal, doing nothing) once armed: FailCopy(n) lets n more CopyAsync
// calls through and fails the next one, FailIndexCopy(n) the same for IndexCopy; either then
// disarms.
class FaultyBackend final : public ForwardingBackend {
 public:
  void FailCopy(int n) { copies_left_ = n; }
  void FailIndexCopy(int n) { index_copies_left_ = n; }
  void Disarm() { copies_left_ = index_copies_left_ = -1; }

  Status CopyAsync(void* dst, const void* src, size_t bytes, StreamHandle s) override {
    if (Fails(copies_left_)) return Internal("FaultyBackend: an injected CopyAsync failure");
    return ForwardingBackend::CopyAsync(dst, src, bytes, s);
  }
  Status IndexCopy(const IndexCopyView& v, StreamHandle s) override {
    if (Fails(index_copies_left_)) return Internal("FaultyBackend: an injected IndexCopy failure");
    return ForwardingBackend::IndexCopy(v, s);
  }

 private:
  // Counts one call down; true (and disarmed) for the one to fail.
  static bool Fails(int& left) {
    if (left == 0) {
      left = -1;
      return true;
    }
    if (left > 0) --left;
    return false;
  }

  int copies_left_ = -1;  // -1: disarmed
  int index_copies_left_ = -1;
};

}  // namespace sparsekv::testing
