// Residency: where each live request's rows live in the device memory the hot cache manages
// (docs/residency.md).
//
// A request on the device either holds a hot-cache block (its replaceable slots and window) or,
// with hybrid residency, resident pages holding every position it may reach; a retracted request
// holds neither. Residency decides and carries out placement (resident if its pages are free,
// else a block, demoting resident requests outside the open step for the block's pages),
// demotion and promotion, and the loads from the host pool both need. It owns the device index
// list those loads go through and the budget arithmetic (CanPlace); the requests, the pool, the
// hot cache and the device tables are the manager's, and it writes the requests' placement
// (block, resident_pages, key_pages) and their tables' rows.
//
// Not thread-safe; owned by the manager. `open_batch` is the open step's batch (empty while no
// step is open): its requests are never demoted.
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "manager/device_memory.h"
#include "manager/device_tables.h"
#include "manager/request_state.h"
#include "sparsekv/backend.h"
#include "sparsekv/host_kv_pool.h"
#include "sparsekv/hot_cache.h"
#include "sparsekv/manager.h"
#include "sparsekv/options.h"

namespace sparsekv {

class Residency {
 public:
  using Requests = std::unordered_map<RequestId, RequestState>;
  // `options`, `requests` and `counters` (which the loads and demotions count in) must outlive it.
  Residency(const CacheOptions& options, Backend& backend, Requests& requests,
            HostCounters& counters);
  Residency(const Residency&) = delete;
  Residency& operator=(const Residency&) = delete;
  // Once the manager's pool, hot cache and tables exist (they must outlive it): the load list
  // (zeroed on the null stream). `invalid_copies` is the device counter the loads count skipped
  // entries in.
  Status Allocate(HostKVPool& pool, HotCache& hot, DeviceTables& tables,
                  unsigned long long* invalid_copies);

  // ---- Budget ----
  // Requests on the device (resident or holding a block); at most max_requests.
  int32_t OnDeviceRequests() const;
  // Pages of the device memory that `tokens` positions take resident.
  int64_t ResidentPagesFor(int64_t tokens) const {
    return (tokens + hot_->page_rows() - 1) / hot_->page_rows();
  }
  // Whether PlaceOnDevice could place a request of `tokens` that needs `key_pages` pages of
  // indexer keys now (demoting if it must).
  bool CanPlace(int64_t tokens, bool may_be_resident, int64_t key_pages,
                std::span<const RequestId> open_batch) const;

  // ---- Placement ----
  // Gives `r` (not on the device) `key_pages` pages for its indexer keys, and resident pages if
  // they fit, else a hot-cache block, demoting resident requests for its pages if too few are
  // free. The block's state is reset; rows are the caller's to load (LoadWindow,
  // LoadIngestedWindows, LoadResident, CopyToResident, PoolToResident).
  Status PlaceOnDevice(RequestState& r, int64_t key_pages, std::span<const RequestId> open_batch,
                       StreamHandle stream);
  // Promote (manager.h) of `r`, the live request `id`: its checks, then resident pages in place
  // of its block, loaded from the host pool.
  Status Promote(RequestId id, RequestState& r, std::span<const RequestId> open_batch,
                 StreamHandle stream);

  // ---- Loads ----
  // Only offloaded layers have rows in the host pool and the hot cache: the loads of one layer
  // refuse any other (InvalidArgument naming its kind), those of every layer skip them.
  // Window positions [max(0, seq_len - W), seq_len) of `layer` into r's block. `rows` holds
  // positions from `first` on (or is null); earlier positions, and the shared prefix
  // [0, cached), are read from the host pool.
  Status LoadWindow(const RequestState& r, int32_t layer, const void* rows, int32_t first,
                    StreamHandle stream);
  // LoadWindow from the host pool for every offloaded layer of `r` already ingested (the others
  // get their window at their ingestion).
  Status LoadIngestedWindows(const RequestState& r, StreamHandle stream);
  // Copies rows of positions [first, last) of every offloaded layer from the host pool into r's
  // resident pages.
  Status LoadResident(const RequestState& r, int32_t first, int32_t last, StreamHandle stream);
  // One layer's rows of positions [first, r.seq_len) from `rows` (positions from rows_first on,
  // in host or device memory) into r's resident pages.
  Status CopyToResident(const RequestState& r, int32_t layer, const void* rows, int32_t rows_first,
                        int32_t first, StreamHandle stream);
  // One layer's rows of positions [r.cached, r.seq_len) from the host pool into r's resident
  // pages (a request resumed while its prompt is being ingested).
  Status PoolToResident(const RequestState& r, int32_t layer, StreamHandle stream);
  // The layer-wide slot of `position` of a resident request.
  int32_t ResidentSlot(const RequestState& r, int32_t position) const {
    const int32_t rows = hot_->page_rows();
    return r.resident_pages[position / rows] + position % rows;
  }

  int64_t device_bytes() const { return memory_.bytes(); }

 private:
  // OK if `layer` is offloaded; InvalidArgument naming its kind otherwise.
  Status CheckRows(int32_t layer) const;
  // The pages demoting `r` would free (its resident pages but a block's worth): 0 unless it is
  // resident, outside the open step and holds more than a block.
  int64_t DemotionGain(RequestId id, const RequestState& r,
                       std::span<const RequestId> open_batch) const;
  // Demotes resident requests (not in the open step; most pages first) until `pages` pages are
  // free. ResourceExhausted, changing nothing, if demoting all of them would not free enough.
  Status MakeRoom(int64_t pages, std::span<const RequestId> open_batch, StreamHandle stream);
  // Takes a block for `r` seeded with its most recent rows and loads them from the host pool
  // (an empty block, and the ingested layers' windows, while its prompt is being ingested).
  Status LoadIntoBlock(RequestState& r, StreamHandle stream);
  // Takes resident pages for `r` (ResourceExhausted if they are not free) and uploads its row
  // of the residency table.
  Status TakeResidentPages(RequestState& r, StreamHandle stream);
  // Copies load_rows_ -> load_slots_ from the pool into every layer: one IndexCopy per layer.
  Status RunLoads(StreamHandle stream);

  const CacheOptions& options_;
  Backend* backend_;
  Requests& requests_;
  HostCounters& host_counters_;
  HostKVPool* pool_ = nullptr;
  HotCache* hot_ = nullptr;
  DeviceTables* tables_ = nullptr;
  unsigned long long* invalid_copies_ = nullptr;
  DeviceMemory memory_;
  MissList load_list_;  // [load_capacity_]: host row -> slot, for LoadIntoBlock / LoadResident
  int32_t load_capacity_ = 0;
  std::vector<int32_t> load_rows_;  // host mirror of load_list_ being built
  std::vector<int32_t> load_slots_;
};

}  // namespace sparsekv
