// CountingBackend: the CPU backend (through ForwardingBackend), counting the host and device bytes
// allocated and not yet freed, so that a test can hold a part's memory figures to what it
// allocated.
//
// Not thread-safe: for tests that drive one part from one thread.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "sparsekv/backend.h"
#include "testing/forwarding_backend.h"

namespace sparsekv::testing {

class CountingBackend final : public ForwardingBackend {
 public:
  StatusOr<void*> AllocateHost(size_t bytes) override {
    SPARSEKV_ASSIGN_OR_RETURN(void* p, ForwardingBackend::AllocateHost(bytes));
    host_[p] = static_cast<int64_t>(bytes);
    return p;
  }
  void FreeHost(void* ptr) override {
    host_.erase(ptr);
    ForwardingBackend::FreeHost(ptr);
  }
  StatusOr<void*> AllocateDevice(size_t bytes) override {
    SPARSEKV_ASSIGN_OR_RETURN(void* p, ForwardingBackend::AllocateDevice(bytes));
    device_[p] = static_cast<int64_t>(bytes);
    return p;
  }
  void FreeDevice(void* ptr) override {
    device_.erase(ptr);
    ForwardingBackend::FreeDevice(ptr);
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

  std::map<void*, int64_t> device_;
  std::map<void*, int64_t> host_;
};

}  // namespace sparsekv::testing
