// PeerRowSource: the peer tier's ManagerExtension (see sparsekv/peer_tier.h).
//
// It owns the table of the host pool's pages (the place and first row of each mapped page), the
// imported regions, and per miss-list lane one list per place for RouteRows. In a step with a
// mapped page, before each miss copy it routes the list (the host pool's part goes back to the
// manager's copy) and after it copies each live region's part from the region's address.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "sparsekv/manager_extension.h"
#include "sparsekv/peer_tier.h"

namespace sparsekv {

class PeerRowSource final : public ManagerExtension {
 public:
  // Allocates the page tables (every page read from the host pool) and the lanes' lists.
  static StatusOr<std::unique_ptr<PeerRowSource>> Create(ExtensionHost& host,
                                                         const PeerTierOptions& options);
  // Closes every mapping (after synchronising the default stream) and frees the buffers.
  ~PeerRowSource() override;

  // The free functions of peer_tier.h, for the manager this source extends.
  StatusOr<int32_t> Import(std::string_view descriptor, StreamHandle stream);
  Status Detach(int32_t region, StreamHandle stream);
  Status RegionStatus(int32_t region) const;
  Status Map(RequestId id, int32_t region, int32_t first_row, int32_t tokens, StreamHandle stream);
  // The address of a row of an imported region in this process.
  StatusOr<const std::byte*> RegionRow(int32_t region, int32_t layer, int32_t row) const;
  // Rows per layer of an imported region. REQUIRES (not checked): RegionRow(region, ...) is OK.
  int32_t RegionRows(int32_t region) const { return regions_[region].descriptor.rows; }
  // Synchronises `stream`; rows routed to regions since the source was created.
  StatusOr<uint64_t> RowsRead(StreamHandle stream) const;

  bool BeginStep(std::span<const RequestId> batch, StreamHandle stream) override;
  StatusOr<MissList> BeforeCopy(int32_t layer, const MissList& list, int32_t capacity, int32_t lane,
                                StreamHandle stream) override;
  Status AfterCopy(int32_t layer, StreamHandle stream) override;
  Status AfterResolve(int32_t, int32_t*, StreamHandle) override { return Status::Ok(); }
  Status AfterMissCopy(int32_t, StreamHandle) override { return Status::Ok(); }
  void OnDrop(RequestId id) override;
  // A child shares its parent's pages, and with them their mapping.
  Status CheckFork(RequestId) const override { return Status::Ok(); }

 private:
  enum class RegionState { kFree, kImported, kLost };
  struct Region {
    RegionState state = RegionState::kFree;
    PeerRegionDescriptor descriptor;
    std::byte* memory = nullptr;        // the mapping; kept open while lost, until reused
    std::vector<int64_t> layer_offset;  // bytes from memory to each layer's row 0
  };
  // What a request mapped: (page, region) pairs, one mapping reference each.
  using Mappings = std::vector<std::pair<int32_t, int32_t>>;

  PeerRowSource(ExtensionHost& host, const PeerTierOptions& options)
      : host_(host), options_(options) {}
  int32_t places() const { return options_.max_regions + 1; }
  // Sends every page of `region` back to the host pool.
  void UnmapRegion(int32_t region);
  // Uploads the page tables on `stream` if they changed.
  Status UploadTables(StreamHandle stream);
  // Closes a lost or detached region's mapping. REQUIRES: nothing enqueued still reads it.
  void Close(Region& r);

  ExtensionHost& host_;
  PeerTierOptions options_;
  std::vector<Region> regions_;  // [max_regions]; region i is place i + 1
  // The page tables: host mirrors, device copies, and a mapping reference count per page.
  std::vector<int32_t> page_place_;
  std::vector<int32_t> page_row_;
  std::vector<int32_t> page_refs_;
  int32_t* page_place_device_ = nullptr;
  int32_t* page_row_device_ = nullptr;
  bool tables_dirty_ = false;
  Status upload_error_;  // an upload BeginStep could not report; returned by BeforeCopy
  int64_t mapped_pages_ = 0;
  std::unordered_map<RequestId, Mappings> mappings_;
  // Per lane: [places, lane capacity] (source row, slot) lists and [places] counts.
  int32_t lane_capacity_ = 0;
  int32_t* lane_src_ = nullptr;
  int32_t* lane_dst_ = nullptr;
  int32_t* lane_count_ = nullptr;
  unsigned long long* routed_ = nullptr;  // device scalar: RouteRowsView::routed
  int32_t pending_lane_ = -1;             // the lane of the copy between BeforeCopy and AfterCopy
  int32_t pending_capacity_ = 0;          // and its lists' capacity
};

}  // namespace sparsekv
