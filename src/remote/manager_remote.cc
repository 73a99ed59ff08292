// The remote tier's part of SparseKVCacheManager (see "Remote tier" in manager.h and
// remote_tier.h): remote-backed admission, and the hooks around a miss copy that read remote rows
// (into their host rows, or into the staging area for the staged copy) and blank failed requests.
#include <algorithm>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "remote/remote_staging.h"
#include "sparsekv/manager.h"

namespace sparsekv {

RemoteStaging::~RemoteStaging() {
  if (tier != nullptr) tier->DetachPool();
  if (rows != nullptr) backend->FreeHost(rows);
  for (int32_t* p : {src_index, dst_index, count}) {
    if (p != nullptr) backend->FreeDevice(p);
  }
}

Status SparseKVCacheManager::AttachRemoteTier(RemoteTier* tier) {
  if (tier == nullptr) return InvalidArgument("AttachRemoteTier: tier is null");
  if (remote_ != nullptr) return FailedPrecondition("AttachRemoteTier: a tier is attached already");
  // The tier is set once it is attached: only then does the staging area detach it.
  auto staging = std::make_unique<RemoteStaging>(backend_.get(), nullptr);
  const int32_t layers = options_.geometry.num_layers();
  std::vector<std::byte*> bases;
  std::vector<int32_t> strides;
  std::vector<int32_t> row_bytes;
  for (int32_t l = 0; l < layers; ++l) {
    bases.push_back(pool_->layer_base(l));
    strides.push_back(options_.geometry.layers[l].row_stride);
    row_bytes.push_back(options_.geometry.layers[l].row_bytes);
  }
  staging->stride = *std::max_element(strides.begin(), strides.end());
  staging->capacity =
      options_.effective_max_batch() * std::max(options_.top_k, options_.max_prefetch);
  const size_t index_bytes = sizeof(int32_t) * staging->capacity;
  SPARSEKV_ASSIGN_OR_RETURN(
      void* rows,
      backend_->AllocateHost(static_cast<size_t>(int64_t{staging->capacity} * staging->stride)));
  staging->rows = static_cast<std::byte*>(rows);
  SPARSEKV_ASSIGN_OR_RETURN(void* src, backend_->AllocateDevice(index_bytes));
  staging->src_index = static_cast<int32_t*>(src);
  SPARSEKV_ASSIGN_OR_RETURN(void* dst, backend_->AllocateDevice(index_bytes));
  staging->dst_index = static_cast<int32_t*>(dst);
  SPARSEKV_ASSIGN_OR_RETURN(void* count, backend_->AllocateDevice(sizeof(int32_t)));
  staging->count = static_cast<int32_t*>(count);
  SPARSEKV_ASSIGN_OR_RETURN(staging->placeholder_page, pool_->AllocatePage());
  const Status attached =
      tier->AttachPool(bases, strides, row_bytes, pool_->rows(), options_.host_page_tokens,
                       staging->rows, staging->capacity, staging->stride);
  if (!attached.ok()) {
    pool_->Unref(staging->placeholder_page);
    return attached;
  }
  staging->tier = tier;
  remote_ = tier;
  remote_staging_ = std::move(staging);
  return Status::Ok();
}

Status SparseKVCacheManager::AdmitRemote(RequestId id, uint32_t region,
                                         const RemotePromptLayout& layout, int32_t max_new_tokens,
                                         StreamHandle stream) {
  if (remote_ == nullptr) return FailedPrecondition("AdmitRemote: no remote tier is attached");
  if (layout.tokens < 1 || max_new_tokens < 0) {
    return InvalidArgument("AdmitRemote: layout.tokens must be >= 1 and max_new_tokens >= 0");
  }
  // Pages wholly before the window are remote: they point at the placeholder page.
  const int32_t pt = options_.host_page_tokens;
  const int32_t remote_pages = std::max(0, layout.tokens - options_.window) / pt;
  const std::vector<int32_t> shared(static_cast<size_t>(remote_pages),
                                    remote_staging_->placeholder_page);
  std::vector<int32_t> no_spares;
  SPARSEKV_ASSIGN_OR_RETURN(Request * admitted,
                            AdmitShared(id, layout.tokens, int64_t{layout.tokens} + max_new_tokens,
                                        shared, 0, no_spares, stream));
  Request& r = *admitted;
  r.cached = remote_pages * pt;  // never ingested, never written
  const std::span<const int32_t> table = pool_->page_table_row(r.owner);
  const int32_t pages = pool_->ReservedTokens(r.owner) / pt;
  Status status =
      remote_->Bind(id, region, layout, table.first(static_cast<size_t>(pages)), remote_pages);
  // The window rows are in the hot cache from admission on, as after an ingest.
  const int32_t first = std::max(0, r.seq_len - options_.window);
  for (int32_t l = 0; status.ok() && l < options_.geometry.num_layers(); ++l) {
    status = remote_->FetchPositions(id, l, first, r.seq_len);
    if (status.ok()) status = LoadWindow(r, l, nullptr, 0, stream);
    if (status.ok()) {
      r.ingested[l] = true;
      ++r.ingested_layers;
    }
  }
  if (!status.ok()) {
    // LoadWindow's copies read host rows: they must be done before the pages are freed.
    backend_->Synchronize(stream).IgnoreError();
    Forget(id, r);
  }
  return status;
}

Status SparseKVCacheManager::RemoteStatus(RequestId id) const {
  if (remote_ == nullptr || !requests_.contains(id)) {
    return NotFound("RemoteStatus: request " + std::to_string(id) +
                    " is not a live remote-backed request");
  }
  return remote_->RequestStatus(id);
}

bool SparseKVCacheManager::BatchHasRemote() const {
  if (remote_ == nullptr || !remote_->HasBoundRequests()) return false;
  return std::any_of(batch_.begin(), batch_.end(),
                     [this](RequestId id) { return remote_->IsBound(id); });
}

Status SparseKVCacheManager::FetchRemoteRows(int32_t layer, const MissList& list, int32_t capacity,
                                             StreamHandle stream) {
  if (!BatchHasRemote()) return Status::Ok();
  RemoteStaging& staging = *remote_staging_;
  staging.staged = 0;
  // The miss list (and the slot tables) are written by the resolve enqueued on `stream`; the
  // staging area may still be read by the previous staged copy.
  SPARSEKV_RETURN_IF_ERROR(backend_->Synchronize(stream));
  int32_t count = 0;
  SPARSEKV_RETURN_IF_ERROR(backend_->CopyAsync(&count, list.count, sizeof(count), stream));
  SPARSEKV_RETURN_IF_ERROR(backend_->Synchronize(stream));
  count = std::clamp(count, 0, capacity);
  if (count == 0) return Status::Ok();
  std::vector<int32_t> rows(static_cast<size_t>(count));
  std::vector<int32_t> slots(static_cast<size_t>(count));
  const size_t bytes = rows.size() * sizeof(int32_t);
  SPARSEKV_RETURN_IF_ERROR(backend_->CopyAsync(rows.data(), list.host_row, bytes, stream));
  SPARSEKV_RETURN_IF_ERROR(backend_->CopyAsync(slots.data(), list.slot, bytes, stream));
  SPARSEKV_RETURN_IF_ERROR(backend_->Synchronize(stream));

  // Which request owns a slot's block, and (read on demand) which position each of its LRU slots
  // holds now: a miss in a remote page is known by its slot, not by its (placeholder) host row.
  const int32_t pt = options_.host_page_tokens;
  const int32_t per_block = hot_->slots_per_block();
  std::unordered_map<int32_t, RequestId> block_owner;
  for (RequestId id : batch_) {
    if (remote_->IsBound(id)) block_owner[requests_.at(id).block] = id;
  }
  std::unordered_map<int32_t, std::vector<int32_t>> slot_tokens;  // block -> [hot_slots]
  std::vector<RemoteTier::RowFetch> fetches;
  std::vector<int32_t> entry_of;  // fetch -> miss list entry
  for (int32_t i = 0; i < count; ++i) {
    RemoteTier::RowFetch f;
    if (rows[i] >= 0 && rows[i] / pt == staging.placeholder_page) {
      const int32_t block = slots[i] / per_block;
      auto owner = block_owner.find(block);
      if (owner == block_owner.end()) {
        return Internal("remote tier: a miss in a remote page of no remote-backed request");
      }
      auto [tokens, fresh] = slot_tokens.try_emplace(block);
      if (fresh) {
        tokens->second.resize(static_cast<size_t>(options_.hot_slots));
        SPARSEKV_RETURN_IF_ERROR(backend_->CopyAsync(
            tokens->second.data(),
            hot_->slot_token(layer) + static_cast<int64_t>(block) * options_.hot_slots,
            sizeof(int32_t) * options_.hot_slots, stream));
        SPARSEKV_RETURN_IF_ERROR(backend_->Synchronize(stream));
      }
      f.id = owner->second;
      f.position = tokens->second[slots[i] % per_block];
      f.staging_row = 0;  // assigned below
    } else if (remote_->OwnerOfHostRow(rows[i], &f.id, &f.position)) {
      f.host_row = rows[i];
    } else {
      continue;  // a local request's row
    }
    fetches.push_back(f);
    entry_of.push_back(i);
  }
  if (fetches.empty()) return Status::Ok();
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
  SPARSEKV_RETURN_IF_ERROR(remote_->FetchRows(layer, fetches));

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
  staging.staged = static_cast<int32_t>(staged_src.size());
  const size_t kept_bytes = sizeof(int32_t) * static_cast<size_t>(kept);
  const size_t staged_bytes = sizeof(int32_t) * staged_src.size();
  SPARSEKV_RETURN_IF_ERROR(backend_->CopyAsync(list.host_row, rows.data(), kept_bytes, stream));
  SPARSEKV_RETURN_IF_ERROR(backend_->CopyAsync(list.slot, slots.data(), kept_bytes, stream));
  SPARSEKV_RETURN_IF_ERROR(backend_->CopyAsync(list.count, &kept, sizeof(kept), stream));
  SPARSEKV_RETURN_IF_ERROR(
      backend_->CopyAsync(staging.src_index, staged_src.data(), staged_bytes, stream));
  SPARSEKV_RETURN_IF_ERROR(
      backend_->CopyAsync(staging.dst_index, staged_dst.data(), staged_bytes, stream));
  SPARSEKV_RETURN_IF_ERROR(
      backend_->CopyAsync(staging.count, &staging.staged, sizeof(int32_t), stream));
  // The uploads read these host vectors.
  return backend_->Synchronize(stream);
}

Status SparseKVCacheManager::CopyStagedRemoteRows(int32_t layer, StreamHandle stream) {
  if (remote_staging_ == nullptr || remote_staging_->staged == 0) return Status::Ok();
  const RemoteStaging& staging = *remote_staging_;
  const LayerShape shape = options_.geometry.layers[layer];
  IndexCopyView copy{};
  copy.src = staging.rows;
  copy.dst = hot_->layer_data(layer);
  copy.src_index = staging.src_index;
  copy.dst_index = staging.dst_index;
  copy.count = staging.count;
  copy.capacity = staging.capacity;
  copy.row_bytes = shape.row_bytes;
  copy.src_stride = staging.stride;
  copy.dst_stride = shape.row_stride;
  copy.src_rows = staging.capacity;
  copy.dst_rows = hot_->layer_rows();
  copy.invalid = invalid_copies_;
  return backend_->IndexCopy(copy, stream);
}

Status SparseKVCacheManager::BlankFailedRemoteSlots(int32_t layer, StreamHandle stream) {
  if (!BatchHasRemote()) return Status::Ok();
  int32_t* slots = remote_slots_[MissListOf(layer)];
  if (slots == nullptr) return Status::Ok();
  for (size_t b = 0; b < batch_.size(); ++b) {
    if (!remote_->Failed(batch_[b])) continue;
    SPARSEKV_RETURN_IF_ERROR(backend_->MemsetAsync(slots + b * options_.top_k, 0xFF,
                                                   sizeof(int32_t) * options_.top_k, stream));
  }
  return Status::Ok();
}

}  // namespace sparsekv
