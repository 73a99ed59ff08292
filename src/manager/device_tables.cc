#include "manager/device_tables.h"

namespace sparsekv {

Status DeviceTables::Allocate(const Shape& shape) {
  shape_ = shape;
  const auto rows = static_cast<size_t>(shape.max_owners);
  const size_t page_entries = rows * shape.pages_per_owner;
  SPARSEKV_ASSIGN_OR_RETURN(page_table_, memory_.Allocate<int32_t>(page_entries));
  SPARSEKV_RETURN_IF_ERROR(
      memory_.backend().MemsetAsync(page_table_, 0xff, page_entries * sizeof(int32_t), nullptr));
  if (shape.resident_pages_per_owner > 0) {
    SPARSEKV_ASSIGN_OR_RETURN(resident_table_,
                              memory_.Allocate<int32_t>(rows * shape.resident_pages_per_owner));
  }
  if (shape.key_pages_per_owner > 0) {
    SPARSEKV_ASSIGN_OR_RETURN(key_table_,
                              memory_.Allocate<int32_t>(rows * shape.key_pages_per_owner));
  }
  return Status::Ok();
}

}  // namespace sparsekv
