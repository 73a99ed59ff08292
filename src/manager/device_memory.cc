#include "manager/device_memory.h"

namespace sparsekv {

DeviceMemory::~DeviceMemory() {
  for (void* p : buffers_) backend_->FreeDevice(p);
}

StatusOr<void*> DeviceMemory::AllocateBytes(size_t bytes) {
  SPARSEKV_ASSIGN_OR_RETURN(void* p, backend_->AllocateDevice(bytes));
  buffers_.push_back(p);
  SPARSEKV_RETURN_IF_ERROR(backend_->MemsetAsync(p, 0, bytes, nullptr));
  bytes_ += static_cast<int64_t>(bytes);
  return p;
}

StatusOr<MissList> DeviceMemory::AllocateMissList(size_t entries, bool own_count) {
  MissList list;
  SPARSEKV_ASSIGN_OR_RETURN(list.host_row, Allocate<int32_t>(entries));
  SPARSEKV_ASSIGN_OR_RETURN(list.slot, Allocate<int32_t>(entries));
  if (own_count) {
    SPARSEKV_ASSIGN_OR_RETURN(list.count, Allocate<int32_t>(1));
  }
  return list;
}

}  // namespace sparsekv
