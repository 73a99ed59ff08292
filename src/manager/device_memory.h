// DeviceMemory: the device buffers one part of the manager owns.
//
// Each buffer is zeroed when it is allocated (on the null stream; the owner synchronises before
// its first use) and freed when the DeviceMemory is destroyed, which must happen while the
// backend lives and after nothing enqueued reads the buffers. bytes() is what they take together
// (CacheStats::device_bytes sums it over the parts).
//
// Not thread-safe; allocation happens once, when the manager is created.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "sparsekv/backend.h"
#include "sparsekv/manager_extension.h"
#include "sparsekv/status.h"

namespace sparsekv {

class DeviceMemory {
 public:
  explicit DeviceMemory(Backend& backend) : backend_(&backend) {}
  ~DeviceMemory();
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;

  // `count` zeroed elements of T.
  template <typename T>
  StatusOr<T*> Allocate(size_t count) {
    SPARSEKV_ASSIGN_OR_RETURN(void* p, AllocateBytes(sizeof(T) * count));
    return static_cast<T*>(p);
  }
  // A miss list of `entries` entries (zeroed), with a count of its own or (`own_count` false)
  // a null count for the owner to point elsewhere.
  StatusOr<MissList> AllocateMissList(size_t entries, bool own_count);

  Backend& backend() const { return *backend_; }
  int64_t bytes() const { return bytes_; }

 private:
  StatusOr<void*> AllocateBytes(size_t bytes);

  Backend* backend_;
  std::vector<void*> buffers_;
  int64_t bytes_ = 0;
};

}  // namespace sparsekv
