// SparseKVCacheManager::Impl, part three: hybrid residency. Where a request's rows live in HBM
// (resident pages or a hot-cache block), demotion to make room for an admission, promotion, and
// the loads from the host pool that both need (docs/residency.md).
#include <algorithm>
#include <string>

#include "manager/manager_impl.h"

namespace sparsekv {

using manager_internal::Describe;

int32_t SparseKVCacheManager::Impl::OnDeviceRequests() const {
  return static_cast<int32_t>(std::count_if(requests_.begin(), requests_.end(),
                                            [](const auto& it) { return it.second.on_device(); }));
}

int64_t SparseKVCacheManager::Impl::ResidentPagesFor(int64_t tokens) const {
  return (tokens + hot_->page_rows() - 1) / hot_->page_rows();
}

int64_t SparseKVCacheManager::Impl::KeyPagesFor(int64_t tokens) const {
  return keys_per_page_ > 0 ? (tokens + keys_per_page_ - 1) / keys_per_page_ : 0;
}

int64_t SparseKVCacheManager::Impl::DemotionGain(RequestId id, const Request& r) const {
  if (!r.resident() || InOpenStep(id)) return 0;
  return std::max<int64_t>(0,
                           static_cast<int64_t>(r.resident_pages.size()) - hot_->pages_per_block());
}

bool SparseKVCacheManager::Impl::CanPlace(int64_t tokens, bool may_be_resident,
                                          int64_t key_pages) const {
  if (OnDeviceRequests() >= options_.max_requests) return false;
  const int64_t free = hot_->free_pages() - key_pages;
  if (options_.hybrid_residency && may_be_resident && free >= ResidentPagesFor(tokens)) {
    return true;
  }
  // A block is free whenever a request may join (at most max_requests are on the device); its
  // pages may have to come from demoting resident requests.
  int64_t room = free;
  for (const auto& [id, r] : requests_) room += DemotionGain(id, r);
  return room >= hot_->pages_per_block();
}

Status SparseKVCacheManager::Impl::PlaceOnDevice(Request& r, int64_t key_pages,
                                                 StreamHandle stream) {
  const int64_t resident = ResidentPagesFor(r.reserved);
  const bool resident_fits =
      options_.hybrid_residency && r.may_be_resident && hot_->free_pages() >= key_pages + resident;
  if (!resident_fits) {
    SPARSEKV_RETURN_IF_ERROR(MakeRoom(key_pages + hot_->pages_per_block(), stream));
  }
  if (key_pages > 0) {
    SPARSEKV_ASSIGN_OR_RETURN(r.key_pages, hot_->AcquirePages(key_pages));
    SPARSEKV_RETURN_IF_ERROR(tables_.UploadKeyRow(r.owner, r.key_pages, stream));
  }
  if (resident_fits) return TakeResidentPages(r, stream);
  SPARSEKV_ASSIGN_OR_RETURN(r.block, hot_->Acquire(stream));
  return Status::Ok();
}

Status SparseKVCacheManager::Impl::TakeResidentPages(Request& r, StreamHandle stream) {
  SPARSEKV_ASSIGN_OR_RETURN(r.resident_pages, hot_->AcquirePages(ResidentPagesFor(r.reserved)));
  return tables_.UploadResidentRow(r.owner, r.resident_pages, stream);
}

Status SparseKVCacheManager::Impl::MakeRoom(int64_t pages, StreamHandle stream) {
  if (hot_->free_pages() >= pages) return Status::Ok();
  // Checked first, so that a refusal changes nothing: each demotion frees the victim's pages but
  // a block's worth, which it takes back.
  int64_t room = hot_->free_pages();
  for (const auto& [id, r] : requests_) room += DemotionGain(id, r);
  if (room < pages) {
    return ResourceExhausted("device memory: " + std::to_string(pages) + " pages needed, " +
                             std::to_string(hot_->free_pages()) +
                             " free, and demoting the resident requests outside the open step "
                             "frees " +
                             std::to_string(room - hot_->free_pages()) + " more");
  }
  while (hot_->free_pages() < pages) {
    // The victim holding the most pages (ties: the lowest id) frees the most per demotion.
    Request* victim = nullptr;
    RequestId victim_id = 0;
    for (auto& [id, r] : requests_) {
      if (DemotionGain(id, r) == 0) continue;
      if (victim == nullptr || r.resident_pages.size() > victim->resident_pages.size() ||
          (r.resident_pages.size() == victim->resident_pages.size() && id < victim_id)) {
        victim = &r;
        victim_id = id;
      }
    }
    // Its rows are reloaded from the host pool, never from the pages it gives back.
    hot_->ReleasePages(victim->resident_pages);
    victim->resident_pages.clear();
    SPARSEKV_RETURN_IF_ERROR(LoadIntoBlock(*victim, stream));
    ++host_counters_.demotions;
  }
  return Status::Ok();
}

Status SparseKVCacheManager::Impl::LoadIntoBlock(Request& r, StreamHandle stream) {
  if (r.ingested_layers != options_.geometry.num_layers()) {
    // Still being ingested: the pool holds only some layers' rows, and the LRU slots are shared
    // by all layers, so the block starts empty, as at an admission.
    SPARSEKV_ASSIGN_OR_RETURN(r.block, hot_->Acquire(stream));
    return LoadIngestedWindows(r, stream);
  }
  // The window's positions go to their window slots, the hot_slots positions before them to LRU
  // slots 0.. in position order (the oldest is the least recently used).
  const int32_t window_begin = std::max(0, r.seq_len - options_.window);
  const int32_t seed_begin = std::max(0, window_begin - options_.hot_slots);
  std::vector<int32_t> seeds(static_cast<size_t>(window_begin - seed_begin));
  for (int32_t i = 0; i < static_cast<int32_t>(seeds.size()); ++i) seeds[i] = seed_begin + i;
  SPARSEKV_ASSIGN_OR_RETURN(r.block, hot_->AcquireSeeded(seeds, stream));
  load_rows_.clear();
  load_slots_.clear();
  for (int32_t p = seed_begin; p < r.seq_len; ++p) {
    load_rows_.push_back(pool_->HostRow(r.owner, p));
    load_slots_.push_back(p < window_begin ? hot_->Slot(r.block, p - seed_begin)
                                           : hot_->WindowSlot(r.block, p));
  }
  return RunLoads(stream);
}

Status SparseKVCacheManager::Impl::LoadResident(const Request& r, int32_t first, int32_t last,
                                                StreamHandle stream) {
  load_rows_.clear();
  load_slots_.clear();
  for (int32_t p = first; p < last; ++p) {
    load_rows_.push_back(pool_->HostRow(r.owner, p));
    load_slots_.push_back(ResidentSlot(r, p));
  }
  return RunLoads(stream);
}

Status SparseKVCacheManager::Impl::RunLoads(StreamHandle stream) {
  const auto count = static_cast<int32_t>(load_rows_.size());
  if (count == 0) return Status::Ok();
  // load_capacity_ holds max_context entries, and no request is longer.
  const size_t bytes = sizeof(int32_t) * load_rows_.size();
  SPARSEKV_RETURN_IF_ERROR(
      backend_->CopyAsync(load_list_.host_row, load_rows_.data(), bytes, stream));
  SPARSEKV_RETURN_IF_ERROR(backend_->CopyAsync(load_list_.slot, load_slots_.data(), bytes, stream));
  SPARSEKV_RETURN_IF_ERROR(backend_->CopyAsync(load_list_.count, &count, sizeof(count), stream));
  for (int32_t l = 0; l < options_.geometry.num_layers(); ++l) {
    SPARSEKV_RETURN_IF_ERROR(
        backend_->IndexCopy(PoolToHotCopy(l, load_list_, load_capacity_), stream));
    host_counters_.bytes_host_to_device +=
        static_cast<uint64_t>(count) * options_.geometry.layers[l].row_bytes;
  }
  // The uploads read the host vectors (and `count`) until the stream reaches them.
  return backend_->Synchronize(stream);
}

Status SparseKVCacheManager::Impl::CopyToResident(const Request& r, int32_t layer, const void* rows,
                                                  int32_t rows_first, int32_t first,
                                                  StreamHandle stream) {
  const int32_t stride = options_.geometry.layers[layer].row_stride;
  const int32_t page_rows = options_.resident_page_rows;
  const auto* src = static_cast<const std::byte*>(rows);
  // One copy per run of positions that share a resident page.
  for (int32_t p = first; p < r.seq_len;) {
    const int32_t n = std::min(r.seq_len - p, page_rows - p % page_rows);
    SPARSEKV_RETURN_IF_ERROR(backend_->CopyAsync(
        hot_->layer_data(layer) + static_cast<int64_t>(ResidentSlot(r, p)) * stride,
        src + static_cast<int64_t>(p - rows_first) * stride, static_cast<size_t>(n) * stride,
        stream));
    p += n;
  }
  host_counters_.bytes_host_to_device += static_cast<uint64_t>(std::max(0, r.seq_len - first)) *
                                         options_.geometry.layers[layer].row_bytes;
  return Status::Ok();
}

Status SparseKVCacheManager::Impl::PoolToResident(const Request& r, int32_t layer,
                                                  StreamHandle stream) {
  const int32_t stride = options_.geometry.layers[layer].row_stride;
  const int32_t pt = options_.host_page_tokens;
  const int32_t page_rows = options_.resident_page_rows;
  // One copy per run of positions that share a host page and a resident page.
  for (int32_t p = r.cached; p < r.seq_len;) {
    const int32_t n = std::min({r.seq_len - p, pt - p % pt, page_rows - p % page_rows});
    SPARSEKV_RETURN_IF_ERROR(backend_->CopyAsync(
        hot_->layer_data(layer) + static_cast<int64_t>(ResidentSlot(r, p)) * stride,
        pool_->row(layer, pool_->HostRow(r.owner, p)), static_cast<size_t>(n) * stride, stream));
    p += n;
  }
  host_counters_.bytes_host_to_device += static_cast<uint64_t>(std::max(0, r.seq_len - r.cached)) *
                                         options_.geometry.layers[layer].row_bytes;
  return Status::Ok();
}

Status SparseKVCacheManager::Impl::Promote(RequestId id, StreamHandle stream) {
  SPARSEKV_ASSIGN_OR_RETURN(Request * r, Find(id, "Promote"));
  if (!options_.hybrid_residency) {
    return FailedPrecondition("Promote: hybrid_residency is off");
  }
  if (r->resident()) return FailedPrecondition("Promote: " + Describe(id) + " is resident");
  if (r->block < 0) return FailedPrecondition("Promote: " + Describe(id) + " is retracted");
  if (!r->may_be_resident) {
    return FailedPrecondition("Promote: " + Describe(id) +
                              " stays in hot-cache mode (forked or remote-backed)");
  }
  if (InOpenStep(id))
    return FailedPrecondition("Promote: " + Describe(id) + " is in the open step");
  if (r->ingested_layers != options_.geometry.num_layers()) {
    return FailedPrecondition("Promote: " + Describe(id) + " has layers not yet ingested");
  }
  // Its own block's pages count as free room once given back.
  const int64_t pages = ResidentPagesFor(r->reserved);
  if (hot_->free_pages() + hot_->pages_per_block() < pages) {
    return ResourceExhausted("Promote: " + Describe(id) + " needs " + std::to_string(pages) +
                             " resident pages, " + std::to_string(hot_->free_pages()) + " free");
  }
  hot_->Release(r->block);
  r->block = -1;
  SPARSEKV_RETURN_IF_ERROR(TakeResidentPages(*r, stream));
  SPARSEKV_RETURN_IF_ERROR(LoadResident(*r, 0, r->seq_len, stream));
  ++host_counters_.promotions;
  return Status::Ok();
}

}  // namespace sparsekv
