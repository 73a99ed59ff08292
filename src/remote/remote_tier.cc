#include "sparsekv/remote_tier.h"

#include <algorithm>

namespace sparsekv {

RemotePromptLayout RemotePromptLayout::Dense(int32_t layers, int32_t tokens, int32_t row_bytes) {
  RemotePromptLayout layout;
  layout.row_stride = static_cast<uint64_t>(row_bytes);
  layout.layer_stride = static_cast<uint64_t>(tokens) * layout.row_stride;
  layout.row_bytes = row_bytes;
  layout.layers = layers;
  layout.tokens = tokens;
  return layout;
}

uint64_t RemotePromptLayout::ExtentBytes() const {
  if (layers <= 0 || tokens <= 0 || row_bytes <= 0) return 0;
  return RowOffset(layers - 1, tokens - 1) + static_cast<uint64_t>(row_bytes);
}

StatusOr<std::unique_ptr<RemoteTier>> RemoteTier::Create(Transport* transport) {
  if (transport == nullptr) return InvalidArgument("RemoteTier: transport is null");
  return std::unique_ptr<RemoteTier>(new RemoteTier(transport));
}

RemoteTier::~RemoteTier() {
  for (auto& [id, region] : regions_) transport_->ReleaseRemote(region.remote).IgnoreError();
  DetachPool();
}

void RemoteTier::DetachPool() {
  for (const RegionHandle& h : layer_regions_) transport_->UnregisterRegion(h).IgnoreError();
  layer_regions_.clear();
  if (staging_.valid()) transport_->UnregisterRegion(staging_).IgnoreError();
  staging_ = RegionHandle{};
}

StatusOr<uint32_t> RemoteTier::ImportRegion(const std::string& node_id,
                                            std::string_view descriptor) {
  if (node_id.empty()) return InvalidArgument("RemoteTier::ImportRegion: empty node id");
  for (const auto& [id, region] : regions_) {
    if (region.descriptor == descriptor && nodes_[region.node] == node_id) return id;
  }
  SPARSEKV_ASSIGN_OR_RETURN(const RemoteRegion remote, transport_->ImportRegion(descriptor));
  auto node = std::find(nodes_.begin() + 1, nodes_.end(), node_id);
  if (node == nodes_.end()) node = nodes_.insert(nodes_.end(), node_id);
  const uint32_t id = next_region_++;
  regions_[id] =
      Region{static_cast<uint32_t>(node - nodes_.begin()), std::string(descriptor), remote, 0};
  return id;
}

Status RemoteTier::ReleaseRegion(uint32_t region) {
  auto it = regions_.find(region);
  if (it == regions_.end()) return NotFound("RemoteTier: unknown region " + std::to_string(region));
  if (it->second.bound_requests > 0) {
    return FailedPrecondition("RemoteTier: region " + std::to_string(region) + " has " +
                              std::to_string(it->second.bound_requests) + " bound requests");
  }
  SPARSEKV_RETURN_IF_ERROR(transport_->ReleaseRemote(it->second.remote));
  regions_.erase(it);
  return Status::Ok();
}

Status RemoteTier::WritePromptLayer(uint32_t region, const RemotePromptLayout& layout,
                                    int32_t layer, const void* rows) {
  auto it = regions_.find(region);
  if (it == regions_.end()) return NotFound("RemoteTier: unknown region " + std::to_string(region));
  if (rows == nullptr || layer < 0 || layer >= layout.layers || layout.tokens < 1 ||
      layout.row_bytes < 1) {
    return InvalidArgument("WritePromptLayer: bad layer, layout or rows");
  }
  if (layout.ExtentBytes() > it->second.remote.bytes) {
    return OutOfRange("WritePromptLayer: the layout needs " + std::to_string(layout.ExtentBytes()) +
                      " bytes; the region has " + std::to_string(it->second.remote.bytes));
  }
  const uint64_t bytes = static_cast<uint64_t>(layout.tokens) * layout.row_bytes;
  SPARSEKV_ASSIGN_OR_RETURN(const RegionHandle local,
                            transport_->RegisterRegion(const_cast<void*>(rows), bytes));
  std::vector<CopyRange> ranges;
  ranges.reserve(static_cast<size_t>(layout.tokens));
  for (int32_t p = 0; p < layout.tokens; ++p) {
    ranges.push_back({layout.RowOffset(layer, p), static_cast<uint64_t>(p) * layout.row_bytes,
                      static_cast<uint64_t>(layout.row_bytes)});
  }
  Status status;
  {
    StatusOr<TransferHandle> transfer =
        transport_->Write(it->second.remote, local, MergeAdjacentRanges(ranges));
    status = transfer.ok() ? transfer->Wait() : transfer.status();
  }
  const Status unregistered = transport_->UnregisterRegion(local);
  SPARSEKV_RETURN_IF_ERROR(status);
  return unregistered;
}

StatusOr<GlobalRowAddress> RemoteTier::Locate(RequestId id, int32_t layer, int32_t position,
                                              int32_t host_row) const {
  auto it = requests_.find(id);
  if (it == requests_.end()) {
    return NotFound("RemoteTier: request " + std::to_string(id) + " is not remote-backed");
  }
  const Bound& b = it->second;
  if (layer < 0 || layer >= b.layout.layers || position < 0) {
    return OutOfRange("RemoteTier::Locate: layer or position out of range");
  }
  if (position < b.layout.tokens) {
    return GlobalRowAddress{regions_.at(b.region).node, b.region,
                            b.layout.RowOffset(layer, position)};
  }
  return GlobalRowAddress{GlobalRowAddress::kLocalNode, static_cast<uint32_t>(layer),
                          static_cast<uint64_t>(host_row) * row_strides_.at(layer)};
}

StatusOr<std::string> RemoteTier::NodeName(uint32_t node) const {
  if (node >= nodes_.size()) return NotFound("RemoteTier: unknown node " + std::to_string(node));
  return nodes_[node];
}

Status RemoteTier::AttachPool(std::span<std::byte* const> layer_bases,
                              std::span<const int32_t> row_strides,
                              std::span<const int32_t> row_bytes, int32_t rows, int32_t page_tokens,
                              std::byte* staging, int32_t staging_rows, int32_t staging_stride) {
  if (!layer_regions_.empty()) {
    return FailedPrecondition("RemoteTier: already attached to a host pool");
  }
  if (layer_bases.empty() || layer_bases.size() != row_strides.size() ||
      layer_bases.size() != row_bytes.size() || rows < 1 || page_tokens < 1 || staging == nullptr ||
      staging_rows < 1 || staging_stride < 1) {
    return InvalidArgument("RemoteTier::AttachPool: inconsistent pool description");
  }
  StatusOr<RegionHandle> h = transport_->RegisterRegion(
      staging, static_cast<uint64_t>(staging_rows) * static_cast<uint64_t>(staging_stride));
  if (!h.ok()) return h.status();
  staging_ = *h;
  for (size_t l = 0; l < layer_bases.size(); ++l) {
    h = transport_->RegisterRegion(
        layer_bases[l], static_cast<uint64_t>(rows) * static_cast<uint64_t>(row_strides[l]));
    if (!h.ok()) {
      DetachPool();
      return h.status();
    }
    layer_regions_.push_back(*h);
  }
  staging_stride_ = static_cast<uint64_t>(staging_stride);
  row_strides_.assign(row_strides.begin(), row_strides.end());
  row_bytes_.assign(row_bytes.begin(), row_bytes.end());
  page_tokens_ = page_tokens;
  return Status::Ok();
}

Status RemoteTier::Bind(RequestId id, uint32_t region, const RemotePromptLayout& layout,
                        std::span<const int32_t> pages, int32_t remote_pages) {
  if (layer_regions_.empty()) return FailedPrecondition("RemoteTier: no host pool attached");
  auto rit = regions_.find(region);
  if (rit == regions_.end())
    return NotFound("RemoteTier: unknown region " + std::to_string(region));
  if (requests_.contains(id)) {
    return AlreadyExists("RemoteTier: request " + std::to_string(id) + " is already bound");
  }
  if (layout.layers != static_cast<int32_t>(layer_regions_.size()) || layout.tokens < 1) {
    return InvalidArgument("RemoteTier: the layout has " + std::to_string(layout.layers) +
                           " layers and " + std::to_string(layout.tokens) +
                           " tokens; the pool has " + std::to_string(layer_regions_.size()) +
                           " layers");
  }
  for (int32_t l = 0; l < layout.layers; ++l) {
    if (layout.row_bytes != row_bytes_[l]) {
      return InvalidArgument("RemoteTier: remote rows are " + std::to_string(layout.row_bytes) +
                             " bytes; layer " + std::to_string(l) + " has " +
                             std::to_string(row_bytes_[l]));
    }
  }
  if (layout.row_stride < static_cast<uint64_t>(layout.row_bytes) ||
      layout.ExtentBytes() > rit->second.remote.bytes) {
    return OutOfRange("RemoteTier: the layout (" + std::to_string(layout.ExtentBytes()) +
                      " bytes) does not fit region " + std::to_string(region) + " (" +
                      std::to_string(rit->second.remote.bytes) + " bytes)");
  }
  if (static_cast<int64_t>(pages.size()) * page_tokens_ < layout.tokens || remote_pages < 0 ||
      int64_t{remote_pages} * page_tokens_ > layout.tokens) {
    return InvalidArgument(
        "RemoteTier: fewer host pages than prompt tokens, or remote pages "
        "beyond the prompt");
  }
  Bound b;
  b.region = region;
  b.layout = layout;
  b.pages.assign(pages.begin() + remote_pages, pages.end());
  b.first_page = remote_pages;
  b.local.assign(static_cast<size_t>(layout.layers),
                 std::vector<bool>(static_cast<size_t>(layout.tokens), false));
  for (size_t i = static_cast<size_t>(remote_pages); i < pages.size(); ++i) {
    page_owner_[pages[i]] = {id, static_cast<int32_t>(i)};
  }
  ++rit->second.bound_requests;
  requests_.emplace(id, std::move(b));
  return Status::Ok();
}

void RemoteTier::Unbind(RequestId id) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return;
  for (int32_t page : it->second.pages) page_owner_.erase(page);
  --regions_.at(it->second.region).bound_requests;
  requests_.erase(it);
}

Status RemoteTier::RequestStatus(RequestId id) const {
  auto it = requests_.find(id);
  if (it == requests_.end()) {
    return NotFound("RemoteTier: request " + std::to_string(id) + " is not remote-backed");
  }
  return it->second.status;
}

bool RemoteTier::Failed(RequestId id) const {
  auto it = requests_.find(id);
  return it != requests_.end() && !it->second.status.ok();
}

void RemoteTier::Fail(RequestId id, Bound& b, const Status& error) {
  if (!b.status.ok()) return;
  const Region& region = regions_.at(b.region);
  b.status = Status(error.code(), "remote prompt rows of request " + std::to_string(id) +
                                      " on node '" + nodes_[region.node] + "' (region " +
                                      std::to_string(b.region) + "): " + error.message());
  ++stats_.failed_requests;
}

bool RemoteTier::OwnerOfHostRow(int32_t host_row, RequestId* id, int32_t* position) const {
  if (host_row < 0 || page_tokens_ == 0) return false;
  auto owner = page_owner_.find(host_row / page_tokens_);
  if (owner == page_owner_.end()) return false;
  *id = owner->second.first;
  *position = owner->second.second * page_tokens_ + host_row % page_tokens_;
  return true;
}

void RemoteTier::ReadAll(int32_t layer, std::vector<Pending>& pending) {
  std::vector<StatusOr<TransferHandle>> transfers;
  transfers.reserve(pending.size());
  for (Pending& p : pending) {
    const Bound& b = requests_.at(p.id);
    p.ranges = MergeAdjacentRanges(p.ranges);
    transfers.push_back(transport_->Read(
        regions_.at(b.region).remote, p.to_staging ? staging_ : layer_regions_[layer], p.ranges));
    stats_.reads += p.ranges.size();
    ++stats_.transfers;
  }
  for (size_t i = 0; i < pending.size(); ++i) {
    Bound& b = requests_.at(pending[i].id);
    const Status status = transfers[i].ok() ? transfers[i]->Wait() : transfers[i].status();
    if (!status.ok()) {
      Fail(pending[i].id, b, status);
      continue;
    }
    for (RowFetch* row : pending[i].rows) {
      row->ok = true;
      if (!pending[i].to_staging) b.local[layer][row->position] = true;
    }
    stats_.rows_fetched += pending[i].rows.size();
    if (pending[i].to_staging) stats_.rows_staged += pending[i].rows.size();
    stats_.bytes_fetched += pending[i].rows.size() * static_cast<uint64_t>(row_bytes_[layer]);
  }
}

Status RemoteTier::FetchRows(int32_t layer, std::span<RowFetch> rows) {
  if (layer < 0 || layer >= static_cast<int32_t>(layer_regions_.size())) {
    return InvalidArgument("RemoteTier::FetchRows: layer out of range");
  }
  const uint64_t stride = static_cast<uint64_t>(row_strides_[layer]);
  const uint64_t bytes = static_cast<uint64_t>(row_bytes_[layer]);
  // (request, to staging) -> its entry in `pending`.
  std::map<std::pair<RequestId, bool>, size_t> index;
  std::vector<Pending> pending;
  for (RowFetch& row : rows) {
    row.ok = false;
    auto it = requests_.find(row.id);
    if (it == requests_.end()) {
      return InvalidArgument("RemoteTier::FetchRows: request " + std::to_string(row.id) +
                             " is not bound");
    }
    Bound& b = it->second;
    const bool to_staging = row.host_row < 0;
    const bool bad_staging_row =
        row.staging_row < 0 ||
        static_cast<uint64_t>(row.staging_row + 1) * staging_stride_ > staging_.bytes;
    if (row.position < 0 || (to_staging && (row.position >= b.layout.tokens || bad_staging_row))) {
      return InvalidArgument("RemoteTier::FetchRows: bad position or staging row");
    }
    if (!b.status.ok()) continue;
    if (!to_staging && (row.position >= b.layout.tokens || b.local[layer][row.position])) {
      row.ok = true;  // a generated row, or a prompt row read before: local
      continue;
    }
    auto [slot, fresh] = index.try_emplace({row.id, to_staging}, pending.size());
    if (fresh) pending.push_back(Pending{row.id, to_staging, {}, {}});
    Pending& p = pending[slot->second];
    const uint64_t local = to_staging ? static_cast<uint64_t>(row.staging_row) * staging_stride_
                                      : static_cast<uint64_t>(row.host_row) * stride;
    p.ranges.push_back({b.layout.RowOffset(layer, row.position), local, bytes});
    p.rows.push_back(&row);
  }
  ReadAll(layer, pending);
  return Status::Ok();
}

Status RemoteTier::FetchPositions(RequestId id, int32_t layer, int32_t first, int32_t last) {
  auto it = requests_.find(id);
  if (it == requests_.end()) {
    return NotFound("RemoteTier: request " + std::to_string(id) + " is not remote-backed");
  }
  Bound& b = it->second;
  if (layer < 0 || layer >= b.layout.layers || first < b.first_page * page_tokens_ ||
      last < first) {
    return InvalidArgument("RemoteTier::FetchPositions: bad layer, or positions in remote pages");
  }
  SPARSEKV_RETURN_IF_ERROR(b.status);
  std::vector<RowFetch> rows;
  for (int32_t p = first; p < std::min(last, b.layout.tokens); ++p) {
    const int32_t page = b.pages[p / page_tokens_ - b.first_page];
    rows.push_back(RowFetch{id, p, page * page_tokens_ + p % page_tokens_, -1, false});
  }
  SPARSEKV_RETURN_IF_ERROR(FetchRows(layer, rows));
  return b.status;
}

}  // namespace sparsekv
