// DeviceTables: the device copies of the manager's per-request tables, one row per owner (the
// request's row in the host pool's page table).
//
//   page table      [max_owners, pages_per_owner]: the host pages of each owner's positions, as
//                   the pool's page table holds them (-1 until a row is uploaded). The resolve
//                   reads it to find a miss's host row.
//   residency table [max_owners, resident_pages_per_owner] (hybrid residency only): the first
//                   slots of a resident request's pages.
//   key table       [max_owners, key_pages_per_owner] (indexer keys only): the first slots of the
//                   pages holding a request's indexer keys.
//
// The host side of each row is its owner's (the pool's page table, the request's pages); an
// upload copies one row on the caller's stream, so the host source must stay unchanged until the
// stream reaches it unless it is pageable (Backend::CopyAsync). Not thread-safe; owned by the
// manager.
#pragma once

#include <cstdint>
#include <span>

#include "manager/device_memory.h"
#include "sparsekv/backend.h"
#include "sparsekv/status.h"

namespace sparsekv {

class DeviceTables {
 public:
  struct Shape {
    int32_t max_owners = 0;
    int32_t pages_per_owner = 0;
    int32_t resident_pages_per_owner = 0;  // 0: no residency table
    int32_t key_pages_per_owner = 0;       // 0: no key table
  };
  explicit DeviceTables(Backend& backend) : memory_(backend) {}
  // The tables (the page table filled with -1, the others zeroed), on the null stream.
  Status Allocate(const Shape& shape);

  // Copies `row` (the owner's row of the pool's page table), `pages` (a resident request's) or
  // `key_pages` into the owner's row of its table.
  Status UploadPageRow(int32_t owner, std::span<const int32_t> row, StreamHandle stream) {
    return memory_.backend().CopyAsync(page_table_ + static_cast<size_t>(owner) * row.size(),
                                       row.data(), row.size_bytes(), stream);
  }
  Status UploadResidentRow(int32_t owner, std::span<const int32_t> pages, StreamHandle stream) {
    return memory_.backend().CopyAsync(
        resident_table_ + static_cast<int64_t>(owner) * shape_.resident_pages_per_owner,
        pages.data(), pages.size_bytes(), stream);
  }
  Status UploadKeyRow(int32_t owner, std::span<const int32_t> key_pages, StreamHandle stream) {
    return memory_.backend().CopyAsync(
        key_table_ + static_cast<int64_t>(owner) * shape_.key_pages_per_owner, key_pages.data(),
        key_pages.size_bytes(), stream);
  }

  // For the run phase's views.
  const int32_t* page_table() const { return page_table_; }
  const int32_t* resident_table() const { return resident_table_; }  // null without residency
  int32_t resident_pages_per_owner() const { return shape_.resident_pages_per_owner; }
  const int32_t* key_table() const { return key_table_; }  // null without indexer keys
  int32_t key_pages_per_owner() const { return shape_.key_pages_per_owner; }

  int64_t device_bytes() const { return memory_.bytes(); }

 private:
  DeviceMemory memory_;
  Shape shape_;
  int32_t* page_table_ = nullptr;
  int32_t* resident_table_ = nullptr;
  int32_t* key_table_ = nullptr;
};

}  // namespace sparsekv
