// SparseKVCacheManager: creation, and the public API forwarded to its Impl (manager_impl.h).
#include "sparsekv/manager.h"

#include <algorithm>
#include <memory>
#include <utility>

#include "manager/manager_impl.h"

namespace sparsekv {

double LayerStats::hit_rate() const {
  const uint64_t found = hits + window_hits + resident_hits;
  const uint64_t lookups = found + misses;
  return lookups == 0 ? 0.0 : static_cast<double>(found) / static_cast<double>(lookups);
}

StatusOr<std::unique_ptr<SparseKVCacheManager>> SparseKVCacheManager::Create(
    const CacheOptions& options, std::shared_ptr<Backend> backend) {
  SPARSEKV_RETURN_IF_ERROR(ValidateOptions(options));
  SPARSEKV_RETURN_IF_ERROR(CheckServedGeometry(options.geometry, options.raw_window));
  if (backend == nullptr) return InvalidArgument("SparseKVCacheManager: backend is null");
  auto impl = std::make_unique<Impl>(options, std::move(backend), nullptr);
  SPARSEKV_RETURN_IF_ERROR(impl->Allocate());
  return std::unique_ptr<SparseKVCacheManager>(new SparseKVCacheManager(std::move(impl)));
}

StatusOr<std::unique_ptr<SparseKVCacheManager>> SparseKVCacheManager::Create(
    const CacheOptions& options, std::shared_ptr<Backend> backend,
    std::shared_ptr<HostKVPool> pool) {
  SPARSEKV_RETURN_IF_ERROR(ValidateOptions(options));
  SPARSEKV_RETURN_IF_ERROR(CheckServedGeometry(options.geometry, options.raw_window));
  if (backend == nullptr) return InvalidArgument("SparseKVCacheManager: backend is null");
  if (pool == nullptr) return InvalidArgument("SparseKVCacheManager: pool is null");
  if (options.raw_window > 0 ||
      std::any_of(options.geometry.layers.begin(), options.geometry.layers.end(),
                  [](const LayerShape& l) { return l.kind != LayerKind::kOffloaded; })) {
    return Unimplemented(
        "SparseKVCacheManager: a shared host pool with resident or window-only layers or a "
        "raw_window (pools are shared only by managers of offloaded layers; docs/deepseek-v4.md)");
  }
  if (options.geometry.layers[0].entry_tokens != 1) {
    return Unimplemented("SparseKVCacheManager: a shared host pool with entry_tokens " +
                         std::to_string(options.geometry.layers[0].entry_tokens) +
                         " (pools are shared only at one entry per token; docs/deepseek-v4.md)");
  }
  const int32_t pt = options.host_page_tokens;
  const auto same_layers = [](const LayerShape& a, const LayerShape& b) {
    return a.row_bytes == b.row_bytes && a.row_stride == b.row_stride;
  };
  const std::vector<LayerShape>& layers = pool->geometry().layers;
  if (!std::equal(layers.begin(), layers.end(), options.geometry.layers.begin(),
                  options.geometry.layers.end(), same_layers)) {
    return InvalidArgument("SparseKVCacheManager: the pool's geometry differs from options'");
  }
  if (pool->page_tokens() != pt ||
      int64_t{pool->total_pages()} != (options.host_capacity_tokens + pt - 1) / pt ||
      pool->pages_per_owner() != (options.max_context + pt - 1) / pt) {
    return InvalidArgument(
        "SparseKVCacheManager: the pool's host_page_tokens, host_capacity_tokens or max_context "
        "differ from options'");
  }
  if (backend->kind() == BackendKind::kCuda && pool->backend().kind() != BackendKind::kCuda) {
    return InvalidArgument(
        "SparseKVCacheManager: the pool's rows were not allocated (or, for a node pool, "
        "registered) by a CUDA backend, so the device cannot read them");
  }
  auto impl = std::make_unique<Impl>(options, std::move(backend), std::move(pool));
  SPARSEKV_RETURN_IF_ERROR(impl->Allocate());
  return std::unique_ptr<SparseKVCacheManager>(new SparseKVCacheManager(std::move(impl)));
}

SparseKVCacheManager::SparseKVCacheManager(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

SparseKVCacheManager::~SparseKVCacheManager() = default;

Status SparseKVCacheManager::Admit(RequestId id, int32_t prompt_len, int32_t max_new_tokens,
                                   StreamHandle stream) {
  return impl_->Admit(id, prompt_len, max_new_tokens, stream);
}
Status SparseKVCacheManager::IngestPrompt(RequestId id, int32_t layer, const void* rows,
                                          StreamHandle stream) {
  return impl_->IngestPrompt(id, layer, PromptRows{.entries = rows}, stream);
}

Status SparseKVCacheManager::IngestPrompt(RequestId id, int32_t layer, const PromptRows& rows,
                                          StreamHandle stream) {
  return impl_->IngestPrompt(id, layer, rows, stream);
}
Status SparseKVCacheManager::Release(RequestId id) { return impl_->Release(id); }
Status SparseKVCacheManager::Retract(RequestId id) { return impl_->Retract(id); }
Status SparseKVCacheManager::Resume(RequestId id, StreamHandle stream) {
  return impl_->Resume(id, stream);
}
Status SparseKVCacheManager::Promote(RequestId id, StreamHandle stream) {
  return impl_->Promote(id, stream);
}
bool SparseKVCacheManager::IsResident(RequestId id) const { return impl_->IsResident(id); }
Status SparseKVCacheManager::AdmitSealedPrompt(RequestId id, int32_t owner, uint64_t seal,
                                               int32_t max_new_tokens, StreamHandle stream) {
  return impl_->AdmitSealedPrompt(id, owner, seal, max_new_tokens, stream);
}
StatusOr<int32_t> SparseKVCacheManager::AdmitWithPrefix(RequestId id,
                                                        std::span<const int32_t> token_ids,
                                                        int32_t max_new_tokens,
                                                        StreamHandle stream) {
  return impl_->AdmitWithPrefix(id, token_ids, max_new_tokens, stream);
}
Status SparseKVCacheManager::IngestPromptSuffix(RequestId id, int32_t layer, const void* rows,
                                                StreamHandle stream) {
  return impl_->IngestPromptSuffix(id, layer, PromptRows{.entries = rows}, stream);
}

Status SparseKVCacheManager::IngestPromptSuffix(RequestId id, int32_t layer, const PromptRows& rows,
                                                StreamHandle stream) {
  return impl_->IngestPromptSuffix(id, layer, rows, stream);
}
Status SparseKVCacheManager::Fork(RequestId parent, RequestId child, int32_t max_new_tokens,
                                  StreamHandle stream) {
  return impl_->Fork(parent, child, max_new_tokens, stream);
}
StatusOr<int32_t> SparseKVCacheManager::Retain(RequestId id) { return impl_->Retain(id); }
int32_t SparseKVCacheManager::EvictRetained() { return impl_->EvictRetained(); }
bool SparseKVCacheManager::IsRetained(RequestId id) const { return impl_->IsRetained(id); }
Status SparseKVCacheManager::PlanStep(std::span<const RequestId> batch, StreamHandle stream) {
  return impl_->PlanStep(batch, nullptr, stream);
}
Status SparseKVCacheManager::PlanStep(std::span<const RequestId> batch,
                                      std::span<const int32_t> token_ids, StreamHandle stream) {
  return impl_->PlanStep(batch, &token_ids, stream);
}
Status SparseKVCacheManager::PlanStep(std::initializer_list<RequestId> batch, StreamHandle stream) {
  return PlanStep(std::span(batch.begin(), batch.size()), stream);
}
Status SparseKVCacheManager::PlanStep(std::initializer_list<RequestId> batch,
                                      std::initializer_list<int32_t> token_ids,
                                      StreamHandle stream) {
  return PlanStep(std::span(batch.begin(), batch.size()),
                  std::span(token_ids.begin(), token_ids.size()), stream);
}
Status SparseKVCacheManager::AppendToken(int32_t layer, const void* new_rows, StreamHandle stream) {
  return impl_->AppendToken(layer, StepRows{.entries = new_rows}, stream);
}
Status SparseKVCacheManager::AppendToken(int32_t layer, const void* new_rows, const void* new_keys,
                                         StreamHandle stream) {
  return impl_->AppendToken(layer, StepRows{.entries = new_rows, .keys = new_keys}, stream);
}

Status SparseKVCacheManager::AppendToken(int32_t layer, const StepRows& rows, StreamHandle stream) {
  return impl_->AppendToken(layer, rows, stream);
}

StatusOr<DenseEntriesView> SparseKVCacheManager::DenseEntries(int32_t layer) const {
  return impl_->DenseEntries(layer);
}

StatusOr<RawWindowView> SparseKVCacheManager::RawWindow(int32_t layer) const {
  return impl_->RawWindow(layer);
}
Status SparseKVCacheManager::IngestIndexerKeys(RequestId id, int32_t layer, const void* keys,
                                               StreamHandle stream) {
  return impl_->IngestIndexerKeys(id, layer, keys, stream);
}
IndexerKeyView SparseKVCacheManager::IndexerKeys(int32_t layer) const {
  return impl_->IndexerKeys(layer);
}
Status SparseKVCacheManager::ResolveLayer(int32_t layer, const int32_t* topk, int32_t* slots,
                                          uint8_t* fill_mask, StreamHandle stream,
                                          int32_t topk_stride) {
  return impl_->ResolveLayer(layer, topk, slots, fill_mask, stream, topk_stride);
}
Status SparseKVCacheManager::CopyMisses(int32_t layer, StreamHandle stream) {
  return impl_->CopyMisses(layer, stream, 0);
}

Status SparseKVCacheManager::CopyMisses(int32_t layer, StreamHandle stream, int32_t copy_blocks) {
  return impl_->CopyMisses(layer, stream, copy_blocks);
}
Status SparseKVCacheManager::AssembleLayer(int32_t layer, const int32_t* slots, void* assembled,
                                           StreamHandle stream) {
  return impl_->AssembleLayer(layer, slots, assembled, stream);
}
bool SparseKVCacheManager::StepCanMiss() const { return impl_->StepCanMiss(); }

Status SparseKVCacheManager::SkipMissCopy(int32_t layer) { return impl_->SkipMissCopy(layer); }

Status SparseKVCacheManager::CopyMissChunk(int32_t layer, int32_t chunk, StreamHandle stream) {
  return impl_->CopyMissChunk(layer, chunk, stream, 0);
}

Status SparseKVCacheManager::CopyMissChunk(int32_t layer, int32_t chunk, StreamHandle stream,
                                           int32_t copy_blocks) {
  return impl_->CopyMissChunk(layer, chunk, stream, copy_blocks);
}
Status SparseKVCacheManager::ResolvePrefetch(int32_t layer, const int32_t* positions, int32_t count,
                                             StreamHandle stream) {
  return impl_->ResolvePrefetch(layer, positions, count, stream);
}
Status SparseKVCacheManager::CopyPrefetch(int32_t layer, StreamHandle stream) {
  return impl_->CopyPrefetch(layer, stream, 0);
}

Status SparseKVCacheManager::CopyPrefetch(int32_t layer, StreamHandle stream, int32_t copy_blocks) {
  return impl_->CopyPrefetch(layer, stream, copy_blocks);
}
Status SparseKVCacheManager::PrefetchLayer(int32_t layer, const int32_t* positions, int32_t count,
                                           StreamHandle stream) {
  return impl_->PrefetchLayer(layer, positions, count, stream);
}
Status SparseKVCacheManager::FinishStep(StreamHandle stream) { return impl_->FinishStep(stream); }
Status SparseKVCacheManager::FinishReplayedStep() { return impl_->FinishReplayedStep(); }
Status SparseKVCacheManager::InstallExtension(const ExtensionFactory& make) {
  return impl_->InstallExtension(make);
}
std::vector<ManagerExtension*> SparseKVCacheManager::extensions() const {
  return impl_->extensions();
}
StatusOr<CacheStats> SparseKVCacheManager::ReadStats(StreamHandle stream) {
  return impl_->ReadStats(stream);
}
Status SparseKVCacheManager::ResetStats(StreamHandle stream) { return impl_->ResetStats(stream); }
StatusOr<int32_t> SparseKVCacheManager::SequenceLength(RequestId id) const {
  return impl_->SequenceLength(id);
}
StatusOr<std::vector<int32_t>> SparseKVCacheManager::HostPages(RequestId id) const {
  return impl_->HostPages(id);
}
const std::byte* SparseKVCacheManager::HotLayer(int32_t layer) const {
  return impl_->HotLayer(layer);
}
int64_t SparseKVCacheManager::HotLayerRows() const { return impl_->HotLayerRows(); }
int32_t SparseKVCacheManager::batch_size() const { return impl_->batch_size(); }
const CacheOptions& SparseKVCacheManager::options() const { return impl_->options(); }
const HostKVPool& SparseKVCacheManager::host_pool() const { return impl_->pool(); }
Backend& SparseKVCacheManager::backend() const { return impl_->backend(); }

// RunLayer is the split API on one stream: it adds nothing of its own.
Status SparseKVCacheManager::RunLayer(int32_t layer, const int32_t* topk, int32_t* slots,
                                      void* assembled, StreamHandle stream, int32_t topk_stride) {
  SPARSEKV_RETURN_IF_ERROR(ResolveLayer(layer, topk, slots, nullptr, stream, topk_stride));
  SPARSEKV_RETURN_IF_ERROR(CopyMisses(layer, stream));
  if (assembled == nullptr) return Status::Ok();
  return AssembleLayer(layer, slots, assembled, stream);
}

}  // namespace sparsekv
