// The remote tier's manager extension: remote-backed admission, and the hooks around a miss copy
// that read remote rows (into their host rows, or into the staging area for the staged copy) and
// blank failed requests.
#include "remote/remote_row_source.h"

#include <algorithm>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "sparsekv/index_groups.h"
#include "sparsekv/manager.h"

namespace sparsekv {

StatusOr<std::unique_ptr<RemoteRowSource>> RemoteRowSource::Create(ExtensionHost& host,
                                                                   RemoteTier* tier) {
  std::unique_ptr<RemoteRowSource> source(new RemoteRowSource(host, tier));
  const CacheOptions& options = host.options();
  Backend& backend = host.backend();
  HostKVPool& pool = host.pool();
  const int32_t layers = options.geometry.num_layers();
  std::vector<std::byte*> bases;
  std::vector<int32_t> strides;
  std::vector<int32_t> row_bytes;
  for (int32_t l = 0; l < layers; ++l) {
    bases.push_back(pool.layer_base(l));
    strides.push_back(options.geometry.layers[l].row_stride);
    row_bytes.push_back(options.geometry.layers[l].row_bytes);
  }
  RemoteRowSource& s = *source;
  s.stride_ = *std::max_element(strides.begin(), strides.end());
  s.capacity_ = options.effective_max_batch() *
                std::max(IndexGroups(options).max_top_k(), options.max_prefetch);
  const size_t index_bytes = sizeof(int32_t) * s.capacity_;
  SPARSEKV_ASSIGN_OR_RETURN(
      void* rows, backend.AllocateHost(static_cast<size_t>(int64_t{s.capacity_} * s.stride_)));
  s.rows_ = static_cast<std::byte*>(rows);
  SPARSEKV_ASSIGN_OR_RETURN(void* src, backend.AllocateDevice(index_bytes));
  s.src_index_ = static_cast<int32_t*>(src);
  SPARSEKV_ASSIGN_OR_RETURN(void* dst, backend.AllocateDevice(index_bytes));
  s.dst_index_ = static_cast<int32_t*>(dst);
  SPARSEKV_ASSIGN_OR_RETURN(void* count, backend.AllocateDevice(sizeof(int32_t)));
  s.count_ = static_cast<int32_t*>(count);
  SPARSEKV_ASSIGN_OR_RETURN(s.placeholder_page_, pool.AllocatePage());
  SPARSEKV_RETURN_IF_ERROR(tier->AttachPool(bases, strides, row_bytes, pool.rows(),
                                            options.host_page_tokens, s.rows_, s.capacity_,
                                            s.stride_));
  s.attached_ = true;  // only now does the destructor detach the tier
  return source;
}

RemoteRowSource::~RemoteRowSource() {
  if (attached_) tier_->DetachPool();
  Backend& backend = host_.backend();
  if (rows_ != nullptr) backend.FreeHost(rows_);
  for (int32_t* p : {src_index_, dst_index_, count_}) {
    if (p != nullptr) backend.FreeDevice(p);
  }
  if (placeholder_page_ >= 0) host_.pool().Unref(placeholder_page_);
}

Status RemoteRowSource::Admit(RequestId id, uint32_t region, const RemotePromptLayout& layout,
                              int32_t max_new_tokens, StreamHandle stream) {
  if (layout.tokens < 1 || max_new_tokens < 0) {
    return InvalidArgument("AdmitRemote: layout.tokens must be >= 1 and max_new_tokens >= 0");
  }
  const CacheOptions& options = host_.options();
  HostKVPool& pool = host_.pool();
  // Pages wholly before the window are remote: they point at the placeholder page.
  const int32_t pt = options.host_page_tokens;
  const int32_t remote_pages = std::max(0, layout.tokens - options.window) / pt;
  const std::vector<int32_t> shared(static_cast<size_t>(remote_pages), placeholder_page_);
  SPARSEKV_RETURN_IF_ERROR(host_.AdmitWithPages(id, layout.tokens, max_new_tokens, shared, stream));
  const int32_t owner = host_.OwnerOf(id);
  const std::span<const int32_t> table = pool.page_table_row(owner);
  const int32_t pages = pool.ReservedTokens(owner) / pt;
  Status status =
      tier_->Bind(id, region, layout, table.first(static_cast<size_t>(pages)), remote_pages);
  // The window rows are in the hot cache from admission on, as after an ingest.
  const int32_t first = std::max(0, layout.tokens - options.window);
  for (int32_t l = 0; status.ok() && l < options.geometry.num_layers(); ++l) {
    status = tier_->FetchPositions(id, l, first, layout.tokens);
    if (status.ok()) status = host_.CompleteLayer(id, l, stream);
  }
  if (!status.ok()) {
    // CompleteLayer's copies read host rows: they must be done before the pages are freed.
    host_.backend().Synchronize(stream).IgnoreError();
    host_.Drop(id);
  }
  return status;
}

Status RemoteRowSource::RequestStatus(RequestId id) const {
  if (!host_.IsLive(id)) {
    return NotFound("RemoteStatus: request " + std::to_string(id) +
                    " is not a live remote-backed request");
  }
  return tier_->RequestStatus(id);
}

Status RemoteRowSource::CheckFork(RequestId parent) const {
  if (!tier_->IsBound(parent)) return Status::Ok();
  return FailedPrecondition("Fork: request " + std::to_string(parent) + " is remote-backed");
}

bool RemoteRowSource::BeginStep(std::span<const RequestId> batch, StreamHandle) {
  // A staged copy belongs to the copy before it, in its step.
  staged_ = 0;
  if (!tier_->HasBoundRequests()) return false;
  return std::any_of(batch.begin(), batch.end(),
                     [this](RequestId id) { return tier_->IsBound(id); });
}

StatusOr<MissList> RemoteRowSource::BeforeCopy(int32_t layer, const MissList& list,
                                               int32_t capacity, int32_t /*lane*/,
                                               StreamHandle stream) {
  const CacheOptions& options = host_.options();
  const HotCache& hot = host_.hot_cache();
  Backend& backend = host_.backend();
  staged_ = 0;
  // The miss list (and the slot tables) are written by the resolve enqueued on `stream`; the
  // staging area may still be read by the previous staged copy.
  SPARSEKV_RETURN_IF_ERROR(backend.Synchronize(stream));
  int32_t count = 0;
  SPARSEKV_RETURN_IF_ERROR(backend.CopyAsync(&count, list.count, sizeof(count), stream));
  SPARSEKV_RETURN_IF_ERROR(backend.Synchronize(stream));
  count = std::clamp(count, 0, capacity);
  if (count == 0) return list;
  std::vector<int32_t> rows(static_cast<size_t>(count));
  std::vector<int32_t> slots(static_cast<size_t>(count));
  const size_t bytes = rows.size() * sizeof(int32_t);
  SPARSEKV_RETURN_IF_ERROR(backend.CopyAsync(rows.data(), list.host_row, bytes, stream));
  SPARSEKV_RETURN_IF_ERROR(backend.CopyAsync(slots.data(), list.slot, bytes, stream));
  SPARSEKV_RETURN_IF_ERROR(backend.Synchronize(stream));

  // Which request owns a slot's block, and (read on demand) which position each of its LRU slots
  // holds now: a miss in a remote page is known by its slot, not by its (placeholder) host row.
  const int32_t pt = options.host_page_tokens;
  std::unordered_map<int32_t, RequestId> block_owner;
  for (RequestId id : host_.batch()) {
    if (tier_->IsBound(id)) block_owner[host_.BlockOf(id)] = id;
  }
  std::unordered_map<int32_t, std::vector<int32_t>> slot_tokens;  // block -> [hot_slots]
  std::vector<RemoteTier::RowFetch> fetches;
  std::vector<int32_t> entry_of;  // fetch -> miss list entry
  for (int32_t i = 0; i < count; ++i) {
    RemoteTier::RowFetch f;
    if (rows[i] >= 0 && rows[i] / pt == placeholder_page_) {
      const HotCache::BlockSlot at = hot.Locate(slots[i]);
      const int32_t block = at.block;
      auto owner = block_owner.find(block);
      if (owner == block_owner.end()) {
        return Internal("remote tier: a miss in a remote page of no remote-backed request");
      }
      auto [tokens, fresh] = slot_tokens.try_emplace(block);
      if (fresh) {
        tokens->second.resize(static_cast<size_t>(options.hot_slots));
        SPARSEKV_RETURN_IF_ERROR(backend.CopyAsync(
            tokens->second.data(),
            hot.slot_token(layer) + static_cast<int64_t>(block) * options.hot_slots,
            sizeof(int32_t) * options.hot_slots, stream));
        SPARSEKV_RETURN_IF_ERROR(backend.Synchronize(stream));
      }
      f.id = owner->second;
      f.position = tokens->second[at.slot];
      f.staging_row = 0;  // assigned below
    } else if (tier_->OwnerOfHostRow(rows[i], &f.id, &f.position)) {
      f.host_row = rows[i];
    } else {
      continue;  // a local request's row
    }
    fetches.push_back(f);
    entry_of.push_back(i);
  }
  if (fetches.empty()) return list;
  // Staging rows in (request, position) order, so that adjacent remote rows land in adjacent
  // staging rows and are merged into one read (the miss list is in host-row order, which for
  // remote pages is the placeholder page's, not the positions').
  std::vector<size_t> staged;
  for (size_t f = 0; f < fetches.size(); ++f) {
    if (fetches[f].host_row < 0) staged.push_back(f);
  }
  std::sort(staged.begin(), staged.end(), [&](size_t a, size_t b) {
    return std::pair(fetches[a].id, fetches[a].position) <
           std::pair(fetches[b].id, fetches[b].position);
  });
  for (size_t s = 0; s < staged.size(); ++s) {
    fetches[staged[s]].staging_row = static_cast<int32_t>(s);
  }
  SPARSEKV_RETURN_IF_ERROR(tier_->FetchRows(layer, fetches));

  // Rows of failed requests leave the list (for every layer of the group: it is shared). Rows
  // read into the staging area stay in it, so that the group's other layers find them too: the
  // direct copy writes their slot from the placeholder, then the staged copy, after it on the
  // same stream, writes the row read.
  std::vector<bool> keep(static_cast<size_t>(count), true);
  std::vector<int32_t> staged_src, staged_dst;
  for (size_t f = 0; f < fetches.size(); ++f) {
    const int32_t i = entry_of[f];
    keep[i] = fetches[f].ok;
    if (fetches[f].ok && fetches[f].host_row < 0) {
      staged_src.push_back(fetches[f].staging_row);
      staged_dst.push_back(slots[i]);
    }
  }
  int32_t kept = 0;
  for (int32_t i = 0; i < count; ++i) {
    if (!keep[i]) continue;
    rows[kept] = rows[i];
    slots[kept] = slots[i];
    ++kept;
  }
  staged_ = static_cast<int32_t>(staged_src.size());
  const size_t kept_bytes = sizeof(int32_t) * static_cast<size_t>(kept);
  const size_t staged_bytes = sizeof(int32_t) * staged_src.size();
  SPARSEKV_RETURN_IF_ERROR(backend.CopyAsync(list.host_row, rows.data(), kept_bytes, stream));
  SPARSEKV_RETURN_IF_ERROR(backend.CopyAsync(list.slot, slots.data(), kept_bytes, stream));
  SPARSEKV_RETURN_IF_ERROR(backend.CopyAsync(list.count, &kept, sizeof(kept), stream));
  SPARSEKV_RETURN_IF_ERROR(backend.CopyAsync(src_index_, staged_src.data(), staged_bytes, stream));
  SPARSEKV_RETURN_IF_ERROR(backend.CopyAsync(dst_index_, staged_dst.data(), staged_bytes, stream));
  SPARSEKV_RETURN_IF_ERROR(backend.CopyAsync(count_, &staged_, sizeof(int32_t), stream));
  // The uploads read these host vectors.
  SPARSEKV_RETURN_IF_ERROR(backend.Synchronize(stream));
  return list;
}

Status RemoteRowSource::AfterCopy(int32_t layer, StreamHandle stream) {
  if (staged_ == 0) return Status::Ok();
  const LayerShape shape = host_.options().geometry.layers[layer];
  const HotCache& hot = host_.hot_cache();
  IndexCopyView copy{};
  copy.src = rows_;
  copy.dst = hot.layer_data(layer);
  copy.src_index = src_index_;
  copy.dst_index = dst_index_;
  copy.count = count_;
  copy.capacity = capacity_;
  copy.row_bytes = shape.row_bytes;
  copy.src_stride = stride_;
  copy.dst_stride = shape.row_stride;
  copy.src_rows = capacity_;
  copy.dst_rows = hot.layer_rows();
  copy.invalid = host_.invalid_copy_counter();
  return host_.backend().IndexCopy(copy, stream);
}

Status RemoteRowSource::AfterResolve(int32_t layer, int32_t* slots, StreamHandle stream) {
  slots_[IndexGroups(host_.options()).Of(layer) % 2] = slots;
  return BlankFailedSlots(layer, stream);
}

Status RemoteRowSource::AfterMissCopy(int32_t layer, StreamHandle stream) {
  return BlankFailedSlots(layer, stream);
}

Status RemoteRowSource::BlankFailedSlots(int32_t layer, StreamHandle stream) {
  const IndexGroups groups(host_.options());
  const int32_t top_k = groups.LayerTopK(layer);
  int32_t* slots = slots_[groups.Of(layer) % 2];
  if (slots == nullptr) return Status::Ok();
  const std::span<const RequestId> batch = host_.batch();
  for (size_t b = 0; b < batch.size(); ++b) {
    if (!tier_->Failed(batch[b])) continue;
    SPARSEKV_RETURN_IF_ERROR(
        host_.backend().MemsetAsync(slots + b * top_k, 0xFF, sizeof(int32_t) * top_k, stream));
  }
  return Status::Ok();
}

// ---- The remote tier's manager API (remote_tier.h) ----

namespace {

RemoteRowSource* SourceOf(const SparseKVCacheManager& manager) {
  for (ManagerExtension* extension : manager.extensions()) {
    if (auto* source = dynamic_cast<RemoteRowSource*>(extension)) return source;
  }
  return nullptr;
}

}  // namespace

Status AttachRemoteTier(SparseKVCacheManager& manager, RemoteTier* tier) {
  if (tier == nullptr) return InvalidArgument("AttachRemoteTier: tier is null");
  if (SourceOf(manager) != nullptr) {
    return FailedPrecondition("AttachRemoteTier: a remote tier is attached already");
  }
  return manager.InstallExtension(
      [tier](ExtensionHost& host) -> StatusOr<std::unique_ptr<ManagerExtension>> {
        SPARSEKV_ASSIGN_OR_RETURN(std::unique_ptr<RemoteRowSource> source,
                                  RemoteRowSource::Create(host, tier));
        return std::unique_ptr<ManagerExtension>(std::move(source));
      });
}

Status AdmitRemote(SparseKVCacheManager& manager, RequestId id, uint32_t region,
                   const RemotePromptLayout& layout, int32_t max_new_tokens, StreamHandle stream) {
  RemoteRowSource* source = SourceOf(manager);
  if (source == nullptr) return FailedPrecondition("AdmitRemote: no remote tier is attached");
  return source->Admit(id, region, layout, max_new_tokens, stream);
}

Status RemoteStatus(const SparseKVCacheManager& manager, RequestId id) {
  RemoteRowSource* source = SourceOf(manager);
  if (source == nullptr) {
    return NotFound("RemoteStatus: request " + std::to_string(id) +
                    " is not a live remote-backed request");
  }
  return source->RequestStatus(id);
}

}  // namespace sparsekv
