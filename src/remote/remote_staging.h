// The manager's remote-tier state (see "Remote tier" in sparsekv/manager.h): the placeholder host
// page that stands for remote prompt pages in page tables, and the staging area their rows are
// read into before the staged IndexCopy brings them into the hot cache.
#pragma once

#include <cstddef>
#include <cstdint>

#include "sparsekv/backend.h"
#include "sparsekv/remote_tier.h"

namespace sparsekv {

struct RemoteStaging {
  RemoteStaging(Backend* backend, RemoteTier* tier) : backend(backend), tier(tier) {}
  // Detaches the host pool and the staging area from the tier, then frees the buffers.
  ~RemoteStaging();
  RemoteStaging(const RemoteStaging&) = delete;
  RemoteStaging& operator=(const RemoteStaging&) = delete;

  Backend* backend;
  RemoteTier* tier;
  // A host page of the pool that every remote-backed request's remote prompt pages point at
  // (one reference per page-table entry, plus the manager's own). Its rows are never read: misses
  // in it are read from the remote region into `rows` instead.
  int32_t placeholder_page = -1;
  std::byte* rows = nullptr;     // [capacity, stride], host memory of the backend (pinned)
  int32_t capacity = 0;          // rows: the largest miss list
  int32_t stride = 0;            // the largest row stride of the geometry
  int32_t* src_index = nullptr;  // [capacity] device: staging row of each staged entry
  int32_t* dst_index = nullptr;  // [capacity] device: its hot-cache slot
  int32_t* count = nullptr;      // device scalar
  int32_t staged = 0;            // entries of the pending staged copy (host mirror of *count)
};

}  // namespace sparsekv
