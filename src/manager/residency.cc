#include "manager/residency.h"

#include <algorithm>
#include <string>

#include "manager/pool_copy.h"

namespace sparsekv {

using manager_internal::Describe;

namespace {

bool InBatch(std::span<const RequestId> batch, RequestId id) {
  return std::find(batch.begin(), batch.end(), id) != batch.end();
}

}  // namespace

Residency::Residency(const CacheOptions& options, Backend& backend, Requests& requests,
                     HostCounters& counters)
    : options_(options),
      backend_(&backend),
      requests_(requests),
      host_counters_(counters),
      memory_(backend) {}

Status Residency::Allocate(HostKVPool& pool, HotCache& hot, DeviceTables& tables,
                           unsigned long long* invalid_copies) {
  pool_ = &pool;
  hot_ = &hot;
  tables_ = &tables;
  invalid_copies_ = invalid_copies;
  // Loads into a demoted request's block (hot_slots + window rows) or a resident request's pages
  // (up to max_context rows).
  load_capacity_ = std::max(options_.max_context, options_.hot_slots + options_.window);
  SPARSEKV_ASSIGN_OR_RETURN(load_list_,
                            memory_.AllocateMissList(static_cast<size_t>(load_capacity_), true));
  return Status::Ok();
}

int32_t Residency::OnDeviceRequests() const {
  return static_cast<int32_t>(std::count_if(requests_.begin(), requests_.end(),
                                            [](const auto& it) { return it.second.on_device(); }));
}

int64_t Residency::DemotionGain(RequestId id, const RequestState& r,
                                std::span<const RequestId> open_batch) const {
  if (!r.resident() || InBatch(open_batch, id)) return 0;
  return std::max<int64_t>(0,
                           static_cast<int64_t>(r.resident_pages.size()) - hot_->pages_per_block());
}

bool Residency::CanPlace(int64_t tokens, bool may_be_resident, int64_t key_pages,
                         std::span<const RequestId> open_batch) const {
  if (OnDeviceRequests() >= options_.max_requests) return false;
  const int64_t free = hot_->free_pages() - key_pages;
  if (options_.hybrid_residency && may_be_resident && free >= ResidentPagesFor(tokens)) {
    return true;
  }
  // A block is free whenever a request may join (at most max_requests are on the device); its
  // pages may have to come from demoting resident requests.
  int64_t room = free;
  for (const auto& [id, r] : requests_) room += DemotionGain(id, r, open_batch);
  return room >= hot_->pages_per_block();
}

Status Residency::PlaceOnDevice(RequestState& r, int64_t key_pages,
                                std::span<const RequestId> open_batch, StreamHandle stream) {
  const int64_t resident = ResidentPagesFor(r.reserved);
  const bool resident_fits =
      options_.hybrid_residency && r.may_be_resident && hot_->free_pages() >= key_pages + resident;
  if (!resident_fits) {
    SPARSEKV_RETURN_IF_ERROR(MakeRoom(key_pages + hot_->pages_per_block(), open_batch, stream));
  }
  if (key_pages > 0) {
    SPARSEKV_ASSIGN_OR_RETURN(r.key_pages, hot_->AcquirePages(key_pages));
    SPARSEKV_RETURN_IF_ERROR(tables_->UploadKeyRow(r.owner, r.key_pages, stream));
  }
  if (resident_fits) return TakeResidentPages(r, stream);
  SPARSEKV_ASSIGN_OR_RETURN(r.block, hot_->Acquire(stream));
  return Status::Ok();
}

Status Residency::TakeResidentPages(RequestState& r, StreamHandle stream) {
  SPARSEKV_ASSIGN_OR_RETURN(r.resident_pages, hot_->AcquirePages(ResidentPagesFor(r.reserved)));
  return tables_->UploadResidentRow(r.owner, r.resident_pages, stream);
}

Status Residency::MakeRoom(int64_t pages, std::span<const RequestId> open_batch,
                           StreamHandle stream) {
  if (hot_->free_pages() >= pages) return Status::Ok();
  // Checked first, so that a refusal changes nothing: each demotion frees the victim's pages but
  // a block's worth, which it takes back.
  int64_t room = hot_->free_pages();
  for (const auto& [id, r] : requests_) room += DemotionGain(id, r, open_batch);
  if (room < pages) {
    return ResourceExhausted("device memory: " + std::to_string(pages) + " pages needed, " +
                             std::to_string(hot_->free_pages()) +
                             " free, and demoting the resident requests outside the open step "
                             "frees " +
                             std::to_string(room - hot_->free_pages()) + " more");
  }
  while (hot_->free_pages() < pages) {
    // The victim holding the most pages (ties: the lowest id) frees the most per demotion.
    RequestState* victim = nullptr;
    RequestId victim_id = 0;
    for (auto& [id, r] : requests_) {
      if (DemotionGain(id, r, open_batch) == 0) continue;
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

Status Residency::CheckRows(int32_t layer) const {
  if (options_.geometry.offloaded(layer)) return Status::Ok();
  return InvalidArgument("layer " + std::to_string(layer) + " is " +
                         LayerKindName(options_.geometry.layers[layer].kind) +
                         ", which has no rows in the host pool or the hot cache");
}

Status Residency::LoadIntoBlock(RequestState& r, StreamHandle stream) {
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

Status Residency::LoadIngestedWindows(const RequestState& r, StreamHandle stream) {
  for (int32_t l = 0; l < options_.geometry.num_layers(); ++l) {
    if (r.ingested[l] && options_.geometry.offloaded(l)) {
      SPARSEKV_RETURN_IF_ERROR(LoadWindow(r, l, nullptr, 0, stream));
    }
  }
  return Status::Ok();
}

Status Residency::LoadWindow(const RequestState& r, int32_t layer, const void* rows, int32_t first,
                             StreamHandle stream) {
  SPARSEKV_RETURN_IF_ERROR(CheckRows(layer));
  // Window positions [max(0, seq_len - W), seq_len). `rows` holds positions from `first` on
  // (or is null); earlier positions, and the shared prefix [0, cached) whose pool copy is kept
  // whatever the caller passes for it, are read from the host pool.
  const int32_t stride = options_.geometry.layers[layer].row_stride;
  const int32_t from_rows = std::max(first, r.cached);
  for (int32_t p = std::max(0, r.seq_len - options_.window); p < r.seq_len; ++p) {
    const std::byte* src =
        rows != nullptr && p >= from_rows
            ? static_cast<const std::byte*>(rows) + static_cast<int64_t>(p - first) * stride
            : pool_->row(layer, pool_->HostRow(r.owner, p));
    std::byte* dst =
        hot_->layer_data(layer) + static_cast<int64_t>(hot_->WindowSlot(r.block, p)) * stride;
    SPARSEKV_RETURN_IF_ERROR(backend_->CopyAsync(dst, src, stride, stream));
    host_counters_.bytes_host_to_device += options_.geometry.layers[layer].row_bytes;
  }
  return Status::Ok();
}

Status Residency::LoadResident(const RequestState& r, int32_t first, int32_t last,
                               StreamHandle stream) {
  load_rows_.clear();
  load_slots_.clear();
  for (int32_t p = first; p < last; ++p) {
    load_rows_.push_back(pool_->HostRow(r.owner, p));
    load_slots_.push_back(ResidentSlot(r, p));
  }
  return RunLoads(stream);
}

Status Residency::RunLoads(StreamHandle stream) {
  const auto count = static_cast<int32_t>(load_rows_.size());
  if (count == 0) return Status::Ok();
  // load_capacity_ holds max_context entries, and no request is longer.
  const size_t bytes = sizeof(int32_t) * load_rows_.size();
  SPARSEKV_RETURN_IF_ERROR(
      backend_->CopyAsync(load_list_.host_row, load_rows_.data(), bytes, stream));
  SPARSEKV_RETURN_IF_ERROR(backend_->CopyAsync(load_list_.slot, load_slots_.data(), bytes, stream));
  SPARSEKV_RETURN_IF_ERROR(backend_->CopyAsync(load_list_.count, &count, sizeof(count), stream));
  for (int32_t l = 0; l < options_.geometry.num_layers(); ++l) {
    if (!options_.geometry.offloaded(l)) continue;  // no rows in the pool or the hot cache
    SPARSEKV_RETURN_IF_ERROR(
        backend_->IndexCopy(PoolToHotCopy(*pool_, *hot_, options_.geometry.layers[l], l, load_list_,
                                          load_capacity_, invalid_copies_),
                            stream));
    host_counters_.bytes_host_to_device +=
        static_cast<uint64_t>(count) * options_.geometry.layers[l].row_bytes;
  }
  // The uploads read the host vectors (and `count`) until the stream reaches them.
  return backend_->Synchronize(stream);
}

Status Residency::CopyToResident(const RequestState& r, int32_t layer, const void* rows,
                                 int32_t rows_first, int32_t first, StreamHandle stream) {
  SPARSEKV_RETURN_IF_ERROR(CheckRows(layer));
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

Status Residency::PoolToResident(const RequestState& r, int32_t layer, StreamHandle stream) {
  SPARSEKV_RETURN_IF_ERROR(CheckRows(layer));
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

Status Residency::Promote(RequestId id, RequestState& request,
                          std::span<const RequestId> open_batch, StreamHandle stream) {
  RequestState* r = &request;
  if (!options_.hybrid_residency) {
    return FailedPrecondition("Promote: hybrid_residency is off");
  }
  if (r->resident()) return FailedPrecondition("Promote: " + Describe(id) + " is resident");
  if (r->block < 0) return FailedPrecondition("Promote: " + Describe(id) + " is retracted");
  if (!r->may_be_resident) {
    return FailedPrecondition("Promote: " + Describe(id) +
                              " stays in hot-cache mode (forked or remote-backed)");
  }
  if (InBatch(open_batch, id)) {
    return FailedPrecondition("Promote: " + Describe(id) + " is in the open step");
  }
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
