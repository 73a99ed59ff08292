// SparseKVCacheManager::Impl, part three: the layer kinds besides offloaded layers. Resident
// layers' entries and every layer's raw window live in dense_ (DenseLayerStore), which follows
// the requests on the device: admitted, forked, retracted, resumed and released with them, and
// given each step's batch by PlanStep. The calls that work through a top-k refuse its layers.
#include <algorithm>
#include <string>

#include "manager/manager_impl.h"

namespace sparsekv {

using manager_internal::Describe;

Status SparseKVCacheManager::Impl::AllocateDense() {
  bool needed = options_.raw_window > 0;
  for (const LayerShape& l : options_.geometry.layers) needed |= l.kind != LayerKind::kOffloaded;
  if (!needed) return Status::Ok();
  DenseLayerStoreOptions o{.geometry = options_.geometry,
                           .raw_window = options_.raw_window,
                           .page_rows = options_.resident_page_rows,
                           .max_requests = options_.max_requests,
                           .max_batch = options_.effective_max_batch(),
                           .max_request_tokens = options_.max_context};
  // Its share: every request on the device (at most max_requests) at max_context, and the
  // tables.
  const int64_t share =
      DenseLayerStore::TableBytes(o) +
      int64_t{options_.max_requests} * DenseLayerStore::RequestBytes(o, options_.max_context).sum();
  if (options_.device_budget_bytes > 0) {
    if (share >= options_.device_budget_bytes) {
      return InvalidArgument(
          "CacheOptions: device_budget_bytes (" + std::to_string(options_.device_budget_bytes) +
          ") cannot hold the resident entries and raw windows of max_requests (" +
          std::to_string(options_.max_requests) + ") requests of max_context (" +
          std::to_string(options_.max_context) + ") tokens (" + std::to_string(share) +
          " bytes) and a hot cache");
    }
    entries_.device_budget_bytes = options_.device_budget_bytes - share;
  }
  o.budget_bytes = share;
  SPARSEKV_ASSIGN_OR_RETURN(dense_, DenseLayerStore::Create(o, backend_));
  return Status::Ok();
}

Status SparseKVCacheManager::Impl::CheckOffloaded(int32_t layer, const char* op) const {
  if (Offloaded(layer)) return Status::Ok();
  const LayerKind kind = options_.geometry.layers[layer].kind;
  return InvalidArgument(std::string(op) + ": layer " + std::to_string(layer) + " is " +
                         LayerKindName(kind) + ", which has no top-k (" +
                         (kind == LayerKind::kResident
                              ? "its entries are read whole: DenseEntries"
                              : "it holds its raw window only: RawWindow") +
                         ")");
}

Status SparseKVCacheManager::Impl::RetractDense(RequestId id) {
  if (dense_ == nullptr) return Status::Ok();
  SPARSEKV_ASSIGN_OR_RETURN(const int64_t bytes, dense_->RetractedBytes(id));
  std::vector<std::byte>& host = dense_retracted_[id];
  host.resize(static_cast<size_t>(bytes));
  // On the default stream, which Retract (a call without a stream) orders after earlier work.
  Status retracted = dense_->Retract(id, host.data(), bytes, nullptr);
  if (!retracted.ok()) dense_retracted_.erase(id);
  return retracted;
}

Status SparseKVCacheManager::Impl::ResumeDense(RequestId id, StreamHandle stream) {
  if (dense_ == nullptr) return Status::Ok();
  auto it = dense_retracted_.find(id);
  if (it == dense_retracted_.end()) {
    return FailedPrecondition("Resume: " + Describe(id) + " has no retracted raw windows");
  }
  SPARSEKV_RETURN_IF_ERROR(
      dense_->Resume(id, it->second.data(), static_cast<int64_t>(it->second.size()), stream));
  dense_retracted_.erase(it);
  return Status::Ok();
}

bool SparseKVCacheManager::Impl::HasResidentLayers() const {
  return std::any_of(options_.geometry.layers.begin(), options_.geometry.layers.end(),
                     [](const LayerShape& l) { return l.kind == LayerKind::kResident; });
}

Status SparseKVCacheManager::Impl::RetainDense(RequestId id, const Request& r) {
  if (!HasResidentLayers()) return Status::Ok();
  // A retracted request's copy is taken already; Retract's copy serves otherwise too (it waits
  // for the default stream, as Retract does).
  if (!dense_retracted_.contains(id)) SPARSEKV_RETURN_IF_ERROR(RetractDense(id));
  auto it = dense_retracted_.find(id);
  dense_retained_[id] = std::make_shared<const RetainedEntries>(
      RetainedEntries{.host = std::move(it->second), .reserved_tokens = r.reserved_tokens});
  dense_retracted_.erase(it);
  return Status::Ok();
}

std::shared_ptr<const SparseKVCacheManager::Impl::RetainedEntries>
SparseKVCacheManager::Impl::PrefixEntries(std::vector<int32_t>& matched) const {
  if (!HasResidentLayers() || matched.empty()) return nullptr;
  // A conversation holding page k - 1 of the match holds pages 0..k-1 too (pages are shared
  // only as prefixes), so its tokens [0, k pages) are the prompt's and its copy holds their
  // entries. The longest such prefix wins; ties hold identical entries.
  size_t best = 0;
  std::shared_ptr<const RetainedEntries> copy;
  for (const auto& [id, entries] : dense_retained_) {
    const std::vector<int32_t>* pages = ledger_->RetainedPages(id);
    if (pages == nullptr) continue;
    size_t k = std::min(pages->size(), matched.size());
    while (k > best && (*pages)[k - 1] != matched[k - 1]) --k;
    if (k > best) {
      best = k;
      copy = entries;
    }
  }
  matched.resize(best);
  return copy;
}

void SparseKVCacheManager::Impl::DropEvictedEntries() {
  std::erase_if(dense_retained_, [&](const auto& it) { return !ledger_->IsRetained(it.first); });
}

Status SparseKVCacheManager::Impl::AppendDense(int32_t layer, const StepRows& rows,
                                               StreamHandle stream) {
  const bool offloaded = Offloaded(layer);
  if (!offloaded) {
    if (dense_ == nullptr) return FailedPrecondition("AppendToken: no layer store");
    SPARSEKV_RETURN_IF_ERROR(order_.CheckAppend(layer));
  }
  if (options_.raw_window > 0 && rows.window == nullptr) {
    return InvalidArgument("AppendToken: window is null (raw_window is " +
                           std::to_string(options_.raw_window) + ")");
  }
  const bool resident = options_.geometry.layers[layer].kind == LayerKind::kResident;
  if (resident && rows.entries == nullptr) {
    return InvalidArgument("AppendToken: entries is null (layer " + std::to_string(layer) +
                           " is kResident)");
  }
  if (offloaded && options_.raw_window == 0) return Status::Ok();
  SPARSEKV_RETURN_IF_ERROR(
      dense_->Append(layer, resident ? rows.entries : nullptr, rows.window, stream));
  if (!offloaded) order_.MarkAppended(layer);
  return Status::Ok();
}

StatusOr<DenseEntriesView> SparseKVCacheManager::Impl::DenseEntries(int32_t layer) const {
  if (dense_ == nullptr) {
    return FailedPrecondition("DenseEntries: the geometry has no resident layer");
  }
  return dense_->DenseEntries(layer);
}

StatusOr<RawWindowView> SparseKVCacheManager::Impl::RawWindow(int32_t layer) const {
  if (dense_ == nullptr) return FailedPrecondition("RawWindow: raw_window is 0");
  return dense_->RawWindow(layer);
}

}  // namespace sparsekv
