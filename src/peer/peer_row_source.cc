// The peer tier's manager extension: imported regions, the page tables that say which host pages
// a region also holds, the routing of each miss list and the copies from the regions.
#include "peer/peer_row_source.h"

#include <algorithm>
#include <limits>
#include <string>
#include <utility>

#include "common/process_liveness.h"
#include "peer/peer_layout.h"
#include "sparsekv/manager.h"

namespace sparsekv {

StatusOr<std::unique_ptr<PeerRowSource>> PeerRowSource::Create(ExtensionHost& host,
                                                               const PeerTierOptions& options) {
  if (options.max_regions < 1 || options.max_regions > kMaxRoutePlaces - 1) {
    return InvalidArgument("AttachPeerTier: max_regions " + std::to_string(options.max_regions) +
                           " outside [1, " + std::to_string(kMaxRoutePlaces - 1) + "]");
  }
  std::unique_ptr<PeerRowSource> source(new PeerRowSource(host, options));
  PeerRowSource& s = *source;
  Backend& backend = host.backend();
  const auto pages = static_cast<size_t>(host.pool().total_pages());
  s.regions_.resize(static_cast<size_t>(options.max_regions));
  s.page_place_.assign(pages, 0);
  s.page_row_.assign(pages, 0);
  s.page_refs_.assign(pages, 0);
  const auto device = [&](size_t bytes) -> StatusOr<int32_t*> {
    SPARSEKV_ASSIGN_OR_RETURN(void* p, backend.AllocateDevice(bytes));
    return static_cast<int32_t*>(p);
  };
  SPARSEKV_ASSIGN_OR_RETURN(s.page_place_device_, device(sizeof(int32_t) * pages));
  SPARSEKV_ASSIGN_OR_RETURN(s.page_row_device_, device(sizeof(int32_t) * pages));
  s.lane_capacity_ = host.miss_list_lane_capacity();
  const size_t entries =
      static_cast<size_t>(host.miss_list_lanes()) * s.places() * s.lane_capacity_;
  SPARSEKV_ASSIGN_OR_RETURN(s.lane_src_, device(sizeof(int32_t) * entries));
  SPARSEKV_ASSIGN_OR_RETURN(s.lane_dst_, device(sizeof(int32_t) * entries));
  SPARSEKV_ASSIGN_OR_RETURN(s.lane_count_,
                            device(sizeof(int32_t) * host.miss_list_lanes() * s.places()));
  SPARSEKV_ASSIGN_OR_RETURN(void* routed, backend.AllocateDevice(sizeof(unsigned long long)));
  s.routed_ = static_cast<unsigned long long*>(routed);
  SPARSEKV_RETURN_IF_ERROR(backend.MemsetAsync(s.routed_, 0, sizeof(unsigned long long), nullptr));
  s.tables_dirty_ = true;
  SPARSEKV_RETURN_IF_ERROR(s.UploadTables(nullptr));
  SPARSEKV_RETURN_IF_ERROR(backend.Synchronize(nullptr));
  return source;
}

PeerRowSource::~PeerRowSource() {
  Backend& backend = host_.backend();
  backend.Synchronize(nullptr).IgnoreError();
  for (Region& r : regions_) Close(r);
  for (void* p : {static_cast<void*>(page_place_device_), static_cast<void*>(page_row_device_),
                  static_cast<void*>(lane_src_), static_cast<void*>(lane_dst_),
                  static_cast<void*>(lane_count_), static_cast<void*>(routed_)}) {
    if (p != nullptr) backend.FreeDevice(p);
  }
}

void PeerRowSource::Close(Region& r) {
  if (r.memory != nullptr) host_.backend().CloseImported(r.memory);
  r.memory = nullptr;
}

StatusOr<int32_t> PeerRowSource::Import(std::string_view text, StreamHandle stream) {
  SPARSEKV_ASSIGN_OR_RETURN(PeerRegionDescriptor d, PeerRegionDescriptor::Parse(text));
  const KVGeometry& geometry = host_.options().geometry;
  bool same = static_cast<int32_t>(d.row_strides.size()) == geometry.num_layers();
  for (int32_t l = 0; same && l < geometry.num_layers(); ++l) {
    same = d.row_strides[l] == geometry.layers[l].row_stride;
  }
  if (!same) {
    return InvalidArgument("ImportPeerRegion: the region's row strides are not the manager's");
  }
  int64_t row_bytes = 0;  // one row of every layer
  for (int32_t stride : d.row_strides) row_bytes += stride;
  if (d.rows > (std::numeric_limits<int64_t>::max() - peer_layout::kHeaderBytes) / row_bytes) {
    return InvalidArgument("ImportPeerRegion: " + std::to_string(d.rows) +
                           " rows per layer overflow a region's size");
  }
  // Validated in an order that reads nothing through the handle before it is known to name a
  // live allocation large enough: the lender's liveness (/proc), the backend's check of the
  // handle (its own allocations are known on the host), the mapping's size, then the header.
  if (!ProcessAlive(d.pid, d.start_time)) {
    return NotFound("ImportPeerRegion: the lender (pid " + std::to_string(d.pid) + ") is gone");
  }
  auto slot = std::find_if(regions_.begin(), regions_.end(),
                           [](const Region& r) { return r.state != RegionState::kImported; });
  if (slot == regions_.end()) {
    return ResourceExhausted("ImportPeerRegion: max_regions (" +
                             std::to_string(options_.max_regions) + ") regions are imported");
  }
  Backend& backend = host_.backend();
  if (slot->memory != nullptr) {  // a lost region's mapping, kept until now
    SPARSEKV_RETURN_IF_ERROR(backend.Synchronize(stream));
    Close(*slot);
  }
  SPARSEKV_ASSIGN_OR_RETURN(void* memory, backend.ImportDevice(d.handle));
  const std::vector<int64_t> layer_offset = peer_layout::LayerOffsets(d.rows, d.row_strides);
  const Status checked = [&]() -> Status {
    SPARSEKV_ASSIGN_OR_RETURN(const size_t bytes, backend.ImportedBytes(memory));
    if (bytes < sizeof(peer_layout::Header)) {
      return NotFound("ImportPeerRegion: the handle names " + std::to_string(bytes) +
                      " bytes, not a region");
    }
    peer_layout::Header header{};
    SPARSEKV_RETURN_IF_ERROR(backend.CopyAsync(&header, memory, sizeof(header), stream));
    SPARSEKV_RETURN_IF_ERROR(backend.Synchronize(stream));
    if (header.magic != peer_layout::kMagic || header.generation != d.generation) {
      return NotFound("ImportPeerRegion: region generation " + std::to_string(d.generation) +
                      " no longer exists");
    }
    const peer_layout::Header want = peer_layout::HeaderOf(d.generation, d.rows, d.row_strides);
    if (header.rows != want.rows || header.layers != want.layers ||
        header.strides_hash != want.strides_hash ||
        static_cast<int64_t>(bytes) < layer_offset.back()) {
      return InvalidArgument("ImportPeerRegion: the descriptor's shape (" + std::to_string(d.rows) +
                             " rows of " + std::to_string(d.row_strides.size()) +
                             " layers) is not region generation " + std::to_string(d.generation) +
                             "'s (" + std::to_string(header.rows) + " rows of " +
                             std::to_string(header.layers) + " layers)");
    }
    return Status::Ok();
  }();
  if (!checked.ok()) {
    backend.CloseImported(memory);
    return checked;
  }
  slot->state = RegionState::kImported;
  slot->memory = static_cast<std::byte*>(memory);
  slot->layer_offset = layer_offset;
  slot->descriptor = std::move(d);
  return static_cast<int32_t>(slot - regions_.begin());
}

Status PeerRowSource::Detach(int32_t region, StreamHandle stream) {
  if (region < 0 || region >= options_.max_regions ||
      regions_[region].state == RegionState::kFree) {
    return NotFound("DetachPeerRegion: region " + std::to_string(region) + " is not imported");
  }
  UnmapRegion(region);
  SPARSEKV_RETURN_IF_ERROR(UploadTables(stream));
  SPARSEKV_RETURN_IF_ERROR(host_.backend().Synchronize(stream));
  Close(regions_[region]);
  regions_[region].state = RegionState::kFree;
  return Status::Ok();
}

Status PeerRowSource::RegionStatus(int32_t region) const {
  if (region < 0 || region >= options_.max_regions ||
      regions_[region].state == RegionState::kFree) {
    return NotFound("PeerRegionStatus: region " + std::to_string(region) + " is not imported");
  }
  if (regions_[region].state == RegionState::kLost) {
    return Unavailable("peer region " + std::to_string(region) + ": its lender (pid " +
                       std::to_string(regions_[region].descriptor.pid) +
                       ") is gone; its rows are read from the host pool");
  }
  return Status::Ok();
}

Status PeerRowSource::Map(RequestId id, int32_t region, int32_t first_row, int32_t tokens,
                          StreamHandle stream) {
  if (!host_.IsLive(id)) {
    return NotFound("MapPeerRows: request " + std::to_string(id) + " is not live");
  }
  if (region < 0 || region >= options_.max_regions ||
      regions_[region].state != RegionState::kImported) {
    return NotFound("MapPeerRows: region " + std::to_string(region) + " is not imported");
  }
  HostKVPool& pool = host_.pool();
  const int32_t owner = host_.OwnerOf(id);
  // Positions without KV yet are written by appends into the host pool, never into a region.
  if (tokens < 1 || tokens > host_.LengthOf(id)) {
    return InvalidArgument("MapPeerRows: tokens " + std::to_string(tokens) + " outside [1, " +
                           std::to_string(host_.LengthOf(id)) + "] (the request's length)");
  }
  if (first_row < 0 || int64_t{first_row} + tokens > regions_[region].descriptor.rows) {
    return OutOfRange("MapPeerRows: rows [" + std::to_string(first_row) + ", " +
                      std::to_string(int64_t{first_row} + tokens) + ") outside the region's " +
                      std::to_string(regions_[region].descriptor.rows));
  }
  const int32_t pt = pool.page_tokens();
  const std::span<const int32_t> table = pool.page_table_row(owner);
  Mappings& mine = mappings_[id];
  for (int32_t i = 0; i < tokens / pt; ++i) {
    const int32_t page = table[i];
    if (page_refs_[page] == 0) {  // a page mapped already keeps its (identical) rows' place
      page_place_[page] = region + 1;
      page_row_[page] = first_row + i * pt;
      ++mapped_pages_;
      tables_dirty_ = true;
    }
    ++page_refs_[page];
    // The region the page is read from (the first mapping's, if it had one), so that OnDrop
    // gives back exactly the references taken here.
    mine.emplace_back(page, page_place_[page] - 1);
  }
  return UploadTables(stream);
}

void PeerRowSource::OnDrop(RequestId id) {
  auto it = mappings_.find(id);
  if (it == mappings_.end()) return;
  for (const auto& [page, region] : it->second) {
    // A page whose region was detached (or lost) since is no longer this mapping's.
    if (page_place_[page] != region + 1 || page_refs_[page] == 0) continue;
    if (--page_refs_[page] == 0) {
      page_place_[page] = 0;
      --mapped_pages_;
      tables_dirty_ = true;
    }
  }
  mappings_.erase(it);
  // Uploaded before the next step reads the tables (BeginStep); the page may be reused by then,
  // but a freed page is read by no step before that.
}

void PeerRowSource::UnmapRegion(int32_t region) {
  for (size_t page = 0; page < page_place_.size(); ++page) {
    if (page_place_[page] != region + 1) continue;
    page_place_[page] = 0;
    page_refs_[page] = 0;
    --mapped_pages_;
    tables_dirty_ = true;
  }
}

Status PeerRowSource::UploadTables(StreamHandle stream) {
  if (!tables_dirty_) return Status::Ok();
  Backend& backend = host_.backend();
  const size_t bytes = sizeof(int32_t) * page_place_.size();
  SPARSEKV_RETURN_IF_ERROR(
      backend.CopyAsync(page_place_device_, page_place_.data(), bytes, stream));
  SPARSEKV_RETURN_IF_ERROR(backend.CopyAsync(page_row_device_, page_row_.data(), bytes, stream));
  tables_dirty_ = false;
  return Status::Ok();
}

bool PeerRowSource::BeginStep(std::span<const RequestId>, StreamHandle stream) {
  for (size_t i = 0; i < regions_.size(); ++i) {
    Region& r = regions_[i];
    if (r.state != RegionState::kImported) continue;
    if (ProcessAlive(r.descriptor.pid, r.descriptor.start_time)) continue;
    // The lender is gone: its rows are read from the host pool from this step on. Its mapping
    // stays open (a step enqueued before may still read it) until the slot is reused.
    r.state = RegionState::kLost;
    UnmapRegion(static_cast<int32_t>(i));
  }
  if (Status s = UploadTables(stream); !s.ok() && upload_error_.ok()) upload_error_ = s;
  return mapped_pages_ > 0;
}

StatusOr<MissList> PeerRowSource::BeforeCopy(int32_t, const MissList& list, int32_t capacity,
                                             int32_t lane, StreamHandle stream) {
  if (!upload_error_.ok()) return std::exchange(upload_error_, Status::Ok());
  const int64_t first = int64_t{lane} * places() * lane_capacity_;
  RouteRowsView route{};
  route.src_index = list.host_row;
  route.dst_index = list.slot;
  route.count = list.count;
  route.capacity = std::min(capacity, lane_capacity_);
  route.page_place = page_place_device_;
  route.page_row = page_row_device_;
  route.pages = static_cast<int64_t>(page_place_.size());
  route.page_rows = host_.pool().page_tokens();
  route.places = places();
  // Place t's list of this lane starts at t * route.capacity, as RouteRowsView lays them out.
  route.out_src = lane_src_ + first;
  route.out_dst = lane_dst_ + first;
  route.out_count = lane_count_ + int64_t{lane} * places();
  route.routed = routed_;
  SPARSEKV_RETURN_IF_ERROR(host_.backend().RouteRows(route, stream));
  pending_lane_ = lane;
  pending_capacity_ = route.capacity;
  return MissList{route.out_src, route.out_dst, route.out_count};
}

Status PeerRowSource::AfterCopy(int32_t layer, StreamHandle stream) {
  const int32_t lane = std::exchange(pending_lane_, -1);
  if (lane < 0) return Status::Ok();
  const CacheOptions& options = host_.options();
  const LayerShape shape = options.geometry.layers[layer];
  const HotCache& hot = host_.hot_cache();
  const int64_t first = int64_t{lane} * places() * lane_capacity_;
  // A copy for every slot, imported or not: a graph captured now has one for a slot imported
  // later, and that copy, sourceless (no rows), skips and counts what is routed to it rather than
  // leaving it uncopied.
  for (int32_t region = 0; region < options_.max_regions; ++region) {
    const Region& r = regions_[region];
    const bool imported = r.state == RegionState::kImported;
    const int64_t list = first + int64_t{region + 1} * pending_capacity_;
    IndexCopyView copy{};
    copy.src = imported ? r.memory + r.layer_offset[layer] : nullptr;
    copy.dst = hot.layer_data(layer);
    copy.src_index = lane_src_ + list;
    copy.dst_index = lane_dst_ + list;
    copy.count = lane_count_ + int64_t{lane} * places() + region + 1;
    copy.capacity = pending_capacity_;
    copy.row_bytes = shape.row_bytes;
    copy.src_stride = copy.dst_stride = shape.row_stride;
    copy.src_rows = imported ? r.descriptor.rows : 0;
    copy.dst_rows = hot.layer_rows();
    copy.invalid = host_.invalid_copy_counter();
    copy.max_blocks = options.copy_blocks;
    copy.strategy = options.copy_strategy;
    SPARSEKV_RETURN_IF_ERROR(host_.backend().IndexCopy(copy, stream));
  }
  return Status::Ok();
}

StatusOr<const std::byte*> PeerRowSource::RegionRow(int32_t region, int32_t layer,
                                                    int32_t row) const {
  if (region < 0 || region >= options_.max_regions ||
      regions_[region].state != RegionState::kImported) {
    return NotFound("peer region " + std::to_string(region) + " is not imported");
  }
  const Region& r = regions_[region];
  return r.memory + r.layer_offset[layer] +
         int64_t{row} * host_.options().geometry.layers[layer].row_stride;
}

StatusOr<uint64_t> PeerRowSource::RowsRead(StreamHandle stream) const {
  Backend& backend = host_.backend();
  unsigned long long rows = 0;
  SPARSEKV_RETURN_IF_ERROR(backend.Synchronize(stream));
  SPARSEKV_RETURN_IF_ERROR(backend.CopyAsync(&rows, routed_, sizeof(rows), stream));
  SPARSEKV_RETURN_IF_ERROR(backend.Synchronize(stream));
  return uint64_t{rows};
}

// ---- The peer tier's manager API (peer_tier.h) ----

namespace {

PeerRowSource* SourceOf(const SparseKVCacheManager& manager) {
  for (ManagerExtension* extension : manager.extensions()) {
    if (auto* source = dynamic_cast<PeerRowSource*>(extension)) return source;
  }
  return nullptr;
}

}  // namespace

Status AttachPeerTier(SparseKVCacheManager& manager, const PeerTierOptions& options) {
  if (SourceOf(manager) != nullptr) {
    return FailedPrecondition("AttachPeerTier: a peer tier is attached already");
  }
  return manager.InstallExtension(
      [options](ExtensionHost& host) -> StatusOr<std::unique_ptr<ManagerExtension>> {
        SPARSEKV_ASSIGN_OR_RETURN(std::unique_ptr<PeerRowSource> source,
                                  PeerRowSource::Create(host, options));
        return std::unique_ptr<ManagerExtension>(std::move(source));
      });
}

StatusOr<int32_t> ImportPeerRegion(SparseKVCacheManager& manager, std::string_view descriptor,
                                   StreamHandle stream) {
  PeerRowSource* source = SourceOf(manager);
  if (source == nullptr) return FailedPrecondition("ImportPeerRegion: no peer tier is attached");
  return source->Import(descriptor, stream);
}

Status DetachPeerRegion(SparseKVCacheManager& manager, int32_t region, StreamHandle stream) {
  PeerRowSource* source = SourceOf(manager);
  if (source == nullptr) return FailedPrecondition("DetachPeerRegion: no peer tier is attached");
  return source->Detach(region, stream);
}

Status PeerRegionStatus(const SparseKVCacheManager& manager, int32_t region) {
  PeerRowSource* source = SourceOf(manager);
  if (source == nullptr) return FailedPrecondition("PeerRegionStatus: no peer tier is attached");
  return source->RegionStatus(region);
}

Status MapPeerRows(SparseKVCacheManager& manager, RequestId id, int32_t region, int32_t first_row,
                   int32_t tokens, StreamHandle stream) {
  PeerRowSource* source = SourceOf(manager);
  if (source == nullptr) return FailedPrecondition("MapPeerRows: no peer tier is attached");
  return source->Map(id, region, first_row, tokens, stream);
}

StatusOr<uint64_t> PeerRowsRead(const SparseKVCacheManager& manager, StreamHandle stream) {
  PeerRowSource* source = SourceOf(manager);
  if (source == nullptr) return FailedPrecondition("PeerRowsRead: no peer tier is attached");
  return source->RowsRead(stream);
}

Status AdmitFromPeer(SparseKVCacheManager& manager, RequestId id, int32_t region, int32_t first_row,
                     int32_t prompt_len, int32_t max_new_tokens, StreamHandle stream) {
  PeerRowSource* source = SourceOf(manager);
  if (source == nullptr) return FailedPrecondition("AdmitFromPeer: no peer tier is attached");
  // Checked before admitting, so that a bad region or range leaves nothing behind.
  SPARSEKV_RETURN_IF_ERROR(source->RegionRow(region, 0, 0).status());
  if (prompt_len < 1) return InvalidArgument("AdmitFromPeer: prompt_len must be >= 1");
  if (first_row < 0 || int64_t{first_row} + prompt_len > source->RegionRows(region)) {
    return OutOfRange("AdmitFromPeer: rows [" + std::to_string(first_row) + ", " +
                      std::to_string(int64_t{first_row} + prompt_len) + ") outside peer region " +
                      std::to_string(region));
  }
  SPARSEKV_RETURN_IF_ERROR(manager.Admit(id, prompt_len, max_new_tokens, stream));
  Status status;
  const int32_t layers = manager.options().geometry.num_layers();
  for (int32_t l = 0; status.ok() && l < layers; ++l) {
    StatusOr<const std::byte*> rows = source->RegionRow(region, l, first_row);
    status = rows.ok() ? manager.IngestPrompt(id, l, *rows, stream) : rows.status();
  }
  if (status.ok()) status = source->Map(id, region, first_row, prompt_len, stream);
  if (!status.ok()) {
    // The ingest's copies read the region and write the request's pages: done before the release.
    manager.backend().Synchronize(stream).IgnoreError();
    manager.Release(id).IgnoreError();
  }
  return status;
}

}  // namespace sparsekv
