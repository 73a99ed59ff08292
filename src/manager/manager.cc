#include "sparsekv/manager.h"

#include <algorithm>
#include <cassert>
#include <numeric>
#include <string>
#include <unordered_set>

#include "host_pool/page_ledger.h"
#include "remote/remote_staging.h"
#include "sparsekv/remote_tier.h"

namespace sparsekv {

double LayerStats::hit_rate() const {
  const uint64_t found = hits + window_hits;
  const uint64_t lookups = found + misses;
  return lookups == 0 ? 0.0 : static_cast<double>(found) / static_cast<double>(lookups);
}

// The plan region, uploaded with one copy per step:
//   [batch_size: int32, padded to 16 B][batch: BatchEntry x max_batch]
//   [append_src: int32 x max_batch]   b -> b (row of the caller's new_rows)
//   [append_slot: int32 x max_batch]  window slot of the newest token
//   [append_row: int32 x max_batch]   host row of the newest token
struct SparseKVCacheManager::PlanLayout {
  explicit PlanLayout(int32_t max_batch)
      : batch(16),
        append_src(batch + sizeof(BatchEntry) * max_batch),
        append_slot(append_src + sizeof(int32_t) * max_batch),
        append_row(append_slot + sizeof(int32_t) * max_batch),
        bytes(append_row + sizeof(int32_t) * max_batch) {}
  size_t batch_size = 0;
  size_t batch;
  size_t append_src;
  size_t append_slot;
  size_t append_row;
  size_t bytes;
};

namespace {

template <typename T>
T* At(std::byte* base, size_t offset) {
  return reinterpret_cast<T*>(base + offset);
}

std::string Describe(RequestId id) { return "request " + std::to_string(id); }

}  // namespace

StatusOr<std::unique_ptr<SparseKVCacheManager>> SparseKVCacheManager::Create(
    const CacheOptions& options, std::shared_ptr<Backend> backend) {
  SPARSEKV_RETURN_IF_ERROR(ValidateOptions(options));
  if (backend == nullptr) return InvalidArgument("SparseKVCacheManager: backend is null");
  std::unique_ptr<SparseKVCacheManager> m(
      new SparseKVCacheManager(options, std::move(backend), nullptr));
  SPARSEKV_RETURN_IF_ERROR(m->Allocate());
  return m;
}

StatusOr<std::unique_ptr<SparseKVCacheManager>> SparseKVCacheManager::Create(
    const CacheOptions& options, std::shared_ptr<Backend> backend,
    std::shared_ptr<HostKVPool> pool) {
  SPARSEKV_RETURN_IF_ERROR(ValidateOptions(options));
  if (backend == nullptr) return InvalidArgument("SparseKVCacheManager: backend is null");
  if (pool == nullptr) return InvalidArgument("SparseKVCacheManager: pool is null");
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
  std::unique_ptr<SparseKVCacheManager> m(
      new SparseKVCacheManager(options, std::move(backend), std::move(pool)));
  SPARSEKV_RETURN_IF_ERROR(m->Allocate());
  return m;
}

SparseKVCacheManager::SparseKVCacheManager(const CacheOptions& options,
                                           std::shared_ptr<Backend> backend,
                                           std::shared_ptr<HostKVPool> pool)
    : options_(options),
      backend_(std::move(backend)),
      pool_(std::move(pool)),
      appended_(options.geometry.num_layers()),
      resolved_(options.index_groups()) {}

Status SparseKVCacheManager::Allocate() {
  const CacheOptions& o = options_;
  const int32_t max_batch = o.effective_max_batch();
  if (pool_ == nullptr) {
    SPARSEKV_ASSIGN_OR_RETURN(
        pool_, HostKVPool::Create(o.geometry, o.host_capacity_tokens, o.host_page_tokens,
                                  o.effective_max_host_requests(), o.max_context, backend_.get()));
  }
  ledger_ = std::make_unique<PageLedger>(pool_.get());
  SPARSEKV_ASSIGN_OR_RETURN(
      hot_, HotCache::Create(o.geometry, o.hot_slots, o.window, o.max_requests, backend_.get(),
                             o.layers_per_index));
  device_bytes_ = hot_->device_bytes();

  auto device = [&](size_t bytes) -> StatusOr<void*> {
    SPARSEKV_ASSIGN_OR_RETURN(void* p, backend_->AllocateDevice(bytes));
    SPARSEKV_RETURN_IF_ERROR(backend_->MemsetAsync(p, 0, bytes, nullptr));
    device_bytes_ += static_cast<int64_t>(bytes);
    return p;
  };
  const PlanLayout layout(max_batch);
  plan_host_.assign(layout.bytes, std::byte{0});
  std::iota(At<int32_t>(plan_host_.data(), layout.append_src),
            At<int32_t>(plan_host_.data(), layout.append_src) + max_batch, 0);
  SPARSEKV_ASSIGN_OR_RETURN(void* plan, device(layout.bytes));
  plan_device_ = static_cast<std::byte*>(plan);

  const size_t page_table_bytes = pool_->page_table().size() * sizeof(int32_t);
  SPARSEKV_ASSIGN_OR_RETURN(void* table, device(page_table_bytes));
  page_table_device_ = static_cast<int32_t*>(table);
  SPARSEKV_RETURN_IF_ERROR(
      backend_->MemsetAsync(page_table_device_, 0xff, page_table_bytes, nullptr));

  auto miss_list = [&](size_t entries) -> StatusOr<MissList> {
    MissList list;
    SPARSEKV_ASSIGN_OR_RETURN(void* rows, device(entries * sizeof(int32_t)));
    list.host_row = static_cast<int32_t*>(rows);
    SPARSEKV_ASSIGN_OR_RETURN(void* slots, device(entries * sizeof(int32_t)));
    list.slot = static_cast<int32_t*>(slots);
    SPARSEKV_ASSIGN_OR_RETURN(void* count, device(sizeof(int32_t)));
    list.count = static_cast<int32_t*>(count);
    return list;
  };
  for (MissList& list : miss_lists_) {
    SPARSEKV_ASSIGN_OR_RETURN(list, miss_list(static_cast<size_t>(max_batch) * o.top_k));
  }
  SPARSEKV_ASSIGN_OR_RETURN(void* counters,
                            device(sizeof(ResolveCounters) * 2 * o.geometry.num_layers()));
  counters_ = static_cast<ResolveCounters*>(counters);
  if (o.max_prefetch > 0) {
    const size_t entries = static_cast<size_t>(max_batch) * o.max_prefetch;
    SPARSEKV_ASSIGN_OR_RETURN(prefetch_list_, miss_list(entries));
    SPARSEKV_ASSIGN_OR_RETURN(void* slots, device(entries * sizeof(int32_t)));
    prefetch_slots_ = static_cast<int32_t*>(slots);
  }
  SPARSEKV_ASSIGN_OR_RETURN(void* invalid, device(sizeof(unsigned long long)));
  invalid_copies_ = static_cast<unsigned long long*>(invalid);
  return backend_->Synchronize(nullptr);
}

SparseKVCacheManager::~SparseKVCacheManager() {
  backend_->Synchronize(nullptr).IgnoreError();
  // Gives back what this manager holds, for other managers of a shared pool.
  for (const auto& [id, r] : requests_) {
    pool_->Release(r.owner);
    if (r.cow_page >= 0) pool_->Unref(r.cow_page);
    pool_->ReleaseOwner(r.owner);
  }
  ledger_.reset();  // drops the retained conversations' references
  if (remote_staging_ != nullptr) pool_->Unref(remote_staging_->placeholder_page);
  std::vector<void*> buffers = {plan_device_, page_table_device_, counters_, invalid_copies_,
                                prefetch_slots_};
  for (const MissList& list : miss_lists_) {
    buffers.insert(buffers.end(), {list.host_row, list.slot, list.count});
  }
  buffers.insert(buffers.end(),
                 {prefetch_list_.host_row, prefetch_list_.slot, prefetch_list_.count});
  for (void* p : buffers) {
    if (p != nullptr) backend_->FreeDevice(p);
  }
}

StatusOr<SparseKVCacheManager::Request*> SparseKVCacheManager::Find(RequestId id, const char* op) {
  auto it = requests_.find(id);
  if (it == requests_.end()) {
    return NotFound(std::string(op) + ": " + Describe(id) + " is unknown or released");
  }
  return &it->second;
}

Status SparseKVCacheManager::UploadPageTable(const Request& r, StreamHandle stream) {
  const std::span<const int32_t> row = pool_->page_table_row(r.owner);
  return backend_->CopyAsync(page_table_device_ + static_cast<size_t>(r.owner) * row.size(),
                             row.data(), row.size_bytes(), stream);
}

StatusOr<SparseKVCacheManager::Request*> SparseKVCacheManager::AdmitShared(
    RequestId id, int32_t seq_len, int64_t tokens, std::span<const int32_t> shared,
    int32_t spare_pages, std::vector<int32_t>& spares, StreamHandle stream) {
  if (requests_.contains(id) || ledger_->IsRetained(id)) {
    return AlreadyExists("Admit: " + Describe(id) + " already exists");
  }
  if (tokens > options_.max_context) {
    return OutOfRange("Admit: " + Describe(id) + " needs " + std::to_string(tokens) +
                      " tokens, more than max_context (" + std::to_string(options_.max_context) +
                      ")");
  }
  // Checked here, not only by the pool: a shared pool has owners for every manager, and one
  // manager must not take another's (its retracted requests hold owners without a block).
  if (static_cast<int32_t>(requests_.size()) >= options_.effective_max_host_requests()) {
    return ResourceExhausted("Admit: all " +
                             std::to_string(options_.effective_max_host_requests()) +
                             " host request slots of this manager are in use (max_host_requests)");
  }
  StatusOr<int32_t> owner_or = pool_->AcquireOwner();
  if (!owner_or.ok()) {
    return ResourceExhausted("Admit: all " + std::to_string(pool_->max_owners()) +
                             " host request slots of the host pool are in use "
                             "(max_host_requests)");
  }
  const int32_t owner = *owner_or;
  if (hot_->used_blocks() == hot_->max_blocks()) {
    pool_->ReleaseOwner(owner);
    return ResourceExhausted("Admit: all " + std::to_string(hot_->max_blocks()) +
                             " hot-cache blocks are in use (max_requests)");
  }
  const int32_t pt = options_.host_page_tokens;
  const int64_t fresh = (tokens + pt - 1) / pt - static_cast<int64_t>(shared.size()) + spare_pages;
  // With a shared pool, another manager may take the pages MakeRoom found before Reserve runs;
  // Reserve then fails, all or nothing.
  PageLedger::Evictions evicted;
  Status reserved = ledger_->MakeRoom(fresh, "Admit", evicted);
  host_counters_.evictions += evicted.conversations;
  host_counters_.evicted_pages += evicted.pages;
  if (reserved.ok()) {
    reserved = pool_->Reserve(owner, static_cast<int32_t>(tokens), shared, spare_pages, &spares);
  }
  if (!reserved.ok()) {
    pool_->ReleaseOwner(owner);
    return reserved;
  }
  // A free block was checked above; only the backend's reset copy can still fail.
  StatusOr<int32_t> acquired = hot_->Acquire(stream);
  if (!acquired.ok()) {
    for (int32_t page : spares) ledger_->Unref(page);
    spares.clear();
    ledger_->ReleaseOwnerPages(owner);
    pool_->ReleaseOwner(owner);
    return acquired.status();
  }
  const int32_t block = *acquired;
  // The pool rounds the reservation up to pages; the request may use no more than it asked for.
  Request r{.owner = owner,
            .block = block,
            .seq_len = seq_len,
            .reserved = static_cast<int32_t>(tokens),
            .ingested = std::vector<bool>(options_.geometry.num_layers(), false),
            .ingested_layers = 0};
  SPARSEKV_RETURN_IF_ERROR(UploadPageTable(r, stream));
  return &requests_.emplace(id, std::move(r)).first->second;
}

Status SparseKVCacheManager::Admit(RequestId id, int32_t prompt_len, int32_t max_new_tokens,
                                   StreamHandle stream) {
  if (prompt_len < 1 || max_new_tokens < 0) {
    return InvalidArgument("Admit: prompt_len must be >= 1 and max_new_tokens >= 0");
  }
  std::vector<int32_t> no_spares;
  return AdmitShared(id, prompt_len, int64_t{prompt_len} + max_new_tokens, {}, 0, no_spares, stream)
      .status();
}

StatusOr<int32_t> SparseKVCacheManager::AdmitWithPrefix(RequestId id,
                                                        std::span<const int32_t> token_ids,
                                                        int32_t max_new_tokens,
                                                        StreamHandle stream) {
  if (token_ids.empty() || max_new_tokens < 0) {
    return InvalidArgument("AdmitWithPrefix: token_ids must not be empty and max_new_tokens >= 0");
  }
  if (token_ids.size() > static_cast<size_t>(options_.max_context)) {
    return OutOfRange("AdmitWithPrefix: " + Describe(id) + " has " +
                      std::to_string(token_ids.size()) + " prompt tokens, more than max_context");
  }
  const int32_t prompt_len = static_cast<int32_t>(token_ids.size());
  const int32_t pt = options_.host_page_tokens;
  // At least the last prompt token is ingested: the engine computes its KV with its logits.
  const std::vector<int32_t> matched = ledger_->Match(token_ids, (prompt_len - 1) / pt);
  // Pinned while admission may evict, so that the prefix it found is not freed under it.
  for (int32_t page : matched) pool_->AddRef(page);
  std::vector<int32_t> no_spares;
  StatusOr<Request*> r = AdmitShared(id, prompt_len, int64_t{prompt_len} + max_new_tokens, matched,
                                     0, no_spares, stream);
  for (int32_t page : matched) ledger_->Unref(page);
  if (!r.ok()) return r.status();
  const int32_t cached = static_cast<int32_t>(matched.size()) * pt;
  (*r)->cached = cached;
  (*r)->token_ids.assign(token_ids.begin(), token_ids.end());
  (*r)->indexed_pages = static_cast<int32_t>(matched.size());
  ledger_->Touch(matched);  // the conversations holding the prefix are in use again
  host_counters_.prefix_lookup_tokens += prompt_len;
  host_counters_.prefix_hit_tokens += cached;
  return cached;
}

Status SparseKVCacheManager::Fork(RequestId parent, RequestId child, int32_t max_new_tokens,
                                  StreamHandle stream) {
  SPARSEKV_ASSIGN_OR_RETURN(Request * p, Find(parent, "Fork"));
  if (max_new_tokens < 0) return InvalidArgument("Fork: max_new_tokens must be >= 0");
  if (remote_ != nullptr && remote_->IsBound(parent)) {
    return FailedPrecondition("Fork: " + Describe(parent) + " is remote-backed");
  }
  if (p->ingested_layers != options_.geometry.num_layers()) {
    return FailedPrecondition("Fork: " + Describe(parent) + " has layers not yet ingested");
  }
  if (step_open_ && std::find(batch_.begin(), batch_.end(), parent) != batch_.end()) {
    return FailedPrecondition("Fork: " + Describe(parent) + " is in the open step");
  }
  const int32_t pt = options_.host_page_tokens;
  const int32_t seq_len = p->seq_len;
  const std::span<const int32_t> table = pool_->page_table_row(p->owner);
  const std::span<const int32_t> shared = table.first((seq_len + pt - 1) / pt);
  // A shared, partially filled last page must be copied by each holder that appends into it
  // while another still holds it: one spare for the child, and one for the parent unless it has
  // one already (from an earlier fork) or cannot append any more.
  const bool partial = seq_len % pt != 0;
  const bool child_spare = partial && max_new_tokens > 0;
  const bool parent_spare = partial && p->seq_len < p->reserved && p->cow_page < 0;
  std::vector<int32_t> spares;
  SPARSEKV_ASSIGN_OR_RETURN(
      Request * c, AdmitShared(child, seq_len, int64_t{seq_len} + max_new_tokens, shared,
                               int32_t{child_spare} + int32_t{parent_spare}, spares, stream));
  if (child_spare) c->cow_page = spares[0];
  if (parent_spare) p->cow_page = spares.back();
  c->cached = seq_len;
  c->ingested.assign(options_.geometry.num_layers(), true);
  c->ingested_layers = options_.geometry.num_layers();
  c->token_ids = p->token_ids;
  c->indexed_pages = p->indexed_pages;
  for (int32_t l = 0; l < options_.geometry.num_layers(); ++l) {
    SPARSEKV_RETURN_IF_ERROR(LoadWindow(*c, l, nullptr, 0, stream));
  }
  return Status::Ok();
}

Status SparseKVCacheManager::LoadWindow(const Request& r, int32_t layer, const void* rows,
                                        int32_t first, StreamHandle stream) {
  // Window positions [max(0, seq_len - W), seq_len). `rows` holds positions from `first` on
  // (or is null); earlier positions are read from the host pool.
  const int32_t stride = options_.geometry.layers[layer].row_stride;
  for (int32_t p = std::max(0, r.seq_len - options_.window); p < r.seq_len; ++p) {
    const std::byte* src =
        rows != nullptr && p >= first
            ? static_cast<const std::byte*>(rows) + static_cast<int64_t>(p - first) * stride
            : pool_->row(layer, pool_->HostRow(r.owner, p));
    std::byte* dst =
        hot_->layer_data(layer) + static_cast<int64_t>(hot_->WindowSlot(r.block, p)) * stride;
    SPARSEKV_RETURN_IF_ERROR(backend_->CopyAsync(dst, src, stride, stream));
    host_counters_.bytes_host_to_device += options_.geometry.layers[layer].row_bytes;
  }
  return Status::Ok();
}

Status SparseKVCacheManager::IngestPrompt(RequestId id, int32_t layer, const void* rows,
                                          StreamHandle stream) {
  return Ingest(id, layer, rows, 0, "IngestPrompt", stream);
}

Status SparseKVCacheManager::IngestPromptSuffix(RequestId id, int32_t layer, const void* rows,
                                                StreamHandle stream) {
  SPARSEKV_ASSIGN_OR_RETURN(Request * r, Find(id, "IngestPromptSuffix"));
  return Ingest(id, layer, rows, r->cached, "IngestPromptSuffix", stream);
}

Status SparseKVCacheManager::Ingest(RequestId id, int32_t layer, const void* rows,
                                    int32_t rows_first, const char* op, StreamHandle stream) {
  SPARSEKV_ASSIGN_OR_RETURN(Request * r, Find(id, op));
  if (layer < 0 || layer >= options_.geometry.num_layers()) {
    return InvalidArgument(std::string(op) + ": layer " + std::to_string(layer) + " out of range");
  }
  if (rows == nullptr) return InvalidArgument(std::string(op) + ": rows is null");
  if (r->ingested[layer]) {
    return AlreadyExists(std::string(op) + ": layer " + std::to_string(layer) + " of " +
                         Describe(id) + " was already ingested (stored KV is never overwritten)");
  }
  if (r->block < 0) {
    return FailedPrecondition(std::string(op) + ": " + Describe(id) + " is retracted");
  }
  const LayerShape shape = options_.geometry.layers[layer];
  const int32_t pt = options_.host_page_tokens;
  const auto* src = static_cast<const std::byte*>(rows);
  // Positions [cached, seq_len) lie in the request's private pages (cached is a page multiple);
  // the shared ones are never written. One copy per run of positions that share a host page.
  for (int32_t p = r->cached; p < r->seq_len;) {
    const int32_t n = std::min(r->seq_len - p, pt - p % pt);
    SPARSEKV_RETURN_IF_ERROR(
        backend_->CopyAsync(pool_->row(layer, pool_->HostRow(r->owner, p)),
                            src + static_cast<int64_t>(p - rows_first) * shape.row_stride,
                            static_cast<size_t>(n) * shape.row_stride, stream));
    p += n;
  }
  SPARSEKV_RETURN_IF_ERROR(LoadWindow(*r, layer, rows, rows_first, stream));
  r->ingested[layer] = true;
  ++r->ingested_layers;
  host_counters_.bytes_ingested += static_cast<uint64_t>(r->seq_len - r->cached) * shape.row_bytes;
  if (r->ingested_layers == options_.geometry.num_layers()) IndexFullPages(*r);
  return Status::Ok();
}

void SparseKVCacheManager::IndexFullPages(Request& r) {
  const int32_t pt = options_.host_page_tokens;
  const std::span<const int32_t> table = pool_->page_table_row(r.owner);
  const std::span<const int32_t> ids = r.token_ids;
  const int32_t full = static_cast<int32_t>(std::min<size_t>(r.seq_len, ids.size()) / pt);
  for (; r.indexed_pages < full; ++r.indexed_pages) {
    const int32_t i = r.indexed_pages;
    // Fails only if an identical copy of the page is indexed already (two requests computed the
    // same prefix independently): lookups find that copy, and the pages after this one could not
    // be reached through it, so indexing stops here.
    if (!ledger_->Index(i == 0 ? -1 : table[i - 1], table[i], ids.subspan(i * pt, pt))) return;
  }
}

void SparseKVCacheManager::Forget(RequestId id, Request& r) {
  if (remote_ != nullptr) remote_->Unbind(id);
  if (r.block >= 0) hot_->Release(r.block);
  ledger_->ReleaseOwnerPages(r.owner);
  if (r.cow_page >= 0) ledger_->Unref(r.cow_page);
  pool_->ReleaseOwner(r.owner);
  requests_.erase(id);
}

Status SparseKVCacheManager::Release(RequestId id) {
  if (ledger_->Drop(id) >= 0) return Status::Ok();
  SPARSEKV_ASSIGN_OR_RETURN(Request * r, Find(id, "Release"));
  if (step_open_ && std::find(batch_.begin(), batch_.end(), id) != batch_.end()) {
    return FailedPrecondition("Release: " + Describe(id) + " is in the open step");
  }
  Forget(id, *r);
  return Status::Ok();
}

StatusOr<int32_t> SparseKVCacheManager::Retain(RequestId id) {
  SPARSEKV_ASSIGN_OR_RETURN(Request * r, Find(id, "Retain"));
  if (step_open_ && std::find(batch_.begin(), batch_.end(), id) != batch_.end()) {
    return FailedPrecondition("Retain: " + Describe(id) + " is in the open step");
  }
  // The indexed pages: full, complete in every layer, reachable by lookups. The rest (a partial
  // last page, unused reservation, pages without known ids) could never be shared again.
  const std::span<const int32_t> table = pool_->page_table_row(r->owner);
  std::vector<int32_t> pages(table.begin(), table.begin() + r->indexed_pages);
  if (pages.empty()) {
    Forget(id, *r);
    return 0;
  }
  const int32_t tokens = static_cast<int32_t>(pages.size()) * options_.host_page_tokens;
  ledger_->Retain(id, std::move(pages));  // before Forget drops the request's references
  Forget(id, *r);
  return tokens;
}

int32_t SparseKVCacheManager::EvictRetained() { return ledger_->DropAll(); }

Status SparseKVCacheManager::Retract(RequestId id) {
  SPARSEKV_ASSIGN_OR_RETURN(Request * r, Find(id, "Retract"));
  if (r->block < 0) return FailedPrecondition("Retract: " + Describe(id) + " is retracted");
  if (step_open_ && std::find(batch_.begin(), batch_.end(), id) != batch_.end()) {
    return FailedPrecondition("Retract: " + Describe(id) + " is in the open step");
  }
  hot_->Release(r->block);
  r->block = -1;
  return Status::Ok();
}

Status SparseKVCacheManager::Resume(RequestId id, StreamHandle stream) {
  SPARSEKV_ASSIGN_OR_RETURN(Request * r, Find(id, "Resume"));
  if (r->block >= 0) return FailedPrecondition("Resume: " + Describe(id) + " is not retracted");
  SPARSEKV_ASSIGN_OR_RETURN(r->block, hot_->Acquire(stream));
  // Layers not yet ingested get their window at ingestion.
  for (int32_t l = 0; l < options_.geometry.num_layers(); ++l) {
    if (r->ingested[l]) SPARSEKV_RETURN_IF_ERROR(LoadWindow(*r, l, nullptr, 0, stream));
  }
  return Status::Ok();
}

Status SparseKVCacheManager::PrepareAppend(Request& r, int32_t position, StreamHandle stream) {
  const int32_t pt = options_.host_page_tokens;
  const int32_t index = position / pt;
  if (r.cow_page >= 0) {
    // The page holding `position` was shared, partially filled, when the request was forked.
    const int32_t page = ledger_->SharedPageToCopy(r.owner, index, r.cow_page);
    if (page >= 0) {
      // Copy rows [index * pt, position) of every layer into the spare, on `stream` before the
      // plan upload, hence before AppendToken forks the write-back of this step's token from it.
      const int32_t rows = position - index * pt;
      for (int32_t l = 0; l < options_.geometry.num_layers(); ++l) {
        const int64_t stride = options_.geometry.layers[l].row_stride;
        SPARSEKV_RETURN_IF_ERROR(backend_->CopyAsync(
            pool_->row(l, r.cow_page * pt), pool_->row(l, page * pt), rows * stride, stream));
      }
      ledger_->ReplaceWithCopy(r.owner, index, r.cow_page);
      SPARSEKV_RETURN_IF_ERROR(UploadPageTable(r, stream));
      ++host_counters_.copy_on_write_pages;
    }
    r.cow_page = -1;
  }
  // The invariant copy on write keeps: a request writes only pages no one else references.
  assert(pool_->RefCount(pool_->page_table_row(r.owner)[index]) == 1);
  return Status::Ok();
}

Status SparseKVCacheManager::PlanStep(std::span<const RequestId> batch, StreamHandle stream) {
  return PlanStep(batch, {}, stream);
}

Status SparseKVCacheManager::PlanStep(std::span<const RequestId> batch,
                                      std::span<const int32_t> token_ids, StreamHandle stream) {
  if (step_open_) return FailedPrecondition("PlanStep: the previous step was not finished");
  if (!token_ids.empty() && token_ids.size() != batch.size()) {
    return InvalidArgument("PlanStep: " + std::to_string(token_ids.size()) +
                           " token ids for a batch of " + std::to_string(batch.size()));
  }
  const int32_t max_batch = options_.effective_max_batch();
  if (batch.empty() || batch.size() > static_cast<size_t>(max_batch)) {
    return InvalidArgument("PlanStep: batch size " + std::to_string(batch.size()) +
                           " not in [1, max_batch = " + std::to_string(max_batch) + "]");
  }
  std::unordered_set<RequestId> seen;
  for (RequestId id : batch) {
    SPARSEKV_ASSIGN_OR_RETURN(Request * r, Find(id, "PlanStep"));
    if (!seen.insert(id).second) {
      return InvalidArgument("PlanStep: " + Describe(id) + " appears twice in the batch");
    }
    if (r->block < 0) return FailedPrecondition("PlanStep: " + Describe(id) + " is retracted");
    if (r->ingested_layers != options_.geometry.num_layers()) {
      return FailedPrecondition("PlanStep: " + Describe(id) + " has layers not yet ingested");
    }
    if (r->seq_len >= r->reserved) {
      return OutOfRange("PlanStep: " + Describe(id) + " reached its reserved length (" +
                        std::to_string(r->reserved) + " tokens)");
    }
  }
  const PlanLayout layout(max_batch);
  std::byte* plan = plan_host_.data();
  *At<int32_t>(plan, layout.batch_size) = static_cast<int32_t>(batch.size());
  auto* entries = At<BatchEntry>(plan, layout.batch);
  auto* append_slot = At<int32_t>(plan, layout.append_slot);
  auto* append_row = At<int32_t>(plan, layout.append_row);
  for (int32_t b = 0; b < max_batch; ++b) {
    if (b >= static_cast<int32_t>(batch.size())) {
      entries[b] = BatchEntry{-1, 0, 0};
      append_slot[b] = append_row[b] = -1;
      continue;
    }
    Request& r = requests_.at(batch[b]);
    const int32_t position = r.seq_len++;
    SPARSEKV_RETURN_IF_ERROR(PrepareAppend(r, position, stream));
    if (r.token_ids.size() == static_cast<size_t>(position) && !token_ids.empty()) {
      r.token_ids.push_back(token_ids[b]);
    }
    entries[b] = BatchEntry{r.block, r.seq_len, r.owner};
    append_slot[b] = hot_->WindowSlot(r.block, position);
    append_row[b] = pool_->HostRow(r.owner, position);
  }
  batch_.assign(batch.begin(), batch.end());
  step_open_ = true;
  std::fill(appended_.begin(), appended_.end(), false);
  std::fill(resolved_.begin(), resolved_.end(), false);
  open_bytes_to_host_per_request_ = open_bytes_assembled_per_request_ = 0;
  return backend_->CopyAsync(plan_device_, plan, layout.bytes, stream);
}

Status SparseKVCacheManager::AppendToken(int32_t layer, const void* new_rows, StreamHandle stream) {
  if (!step_open_) return FailedPrecondition("AppendToken: no step is planned");
  if (layer < 0 || layer >= options_.geometry.num_layers()) {
    return InvalidArgument("AppendToken: layer " + std::to_string(layer) + " out of range");
  }
  if (new_rows == nullptr) return InvalidArgument("AppendToken: new_rows is null");
  if (appended_[layer]) {
    return FailedPrecondition("AppendToken: layer " + std::to_string(layer) +
                              " was already appended in this step");
  }
  const LayerShape shape = options_.geometry.layers[layer];
  const PlanLayout layout(options_.effective_max_batch());
  const int32_t max_batch = options_.effective_max_batch();
  IndexCopyView to_window{};
  to_window.src = static_cast<const std::byte*>(new_rows);
  to_window.dst = hot_->layer_data(layer);
  to_window.src_index = At<int32_t>(plan_device_, layout.append_src);
  to_window.dst_index = At<int32_t>(plan_device_, layout.append_slot);
  to_window.count = At<int32_t>(plan_device_, layout.batch_size);
  to_window.capacity = max_batch;
  to_window.row_bytes = shape.row_stride;
  to_window.src_stride = to_window.dst_stride = shape.row_stride;
  to_window.src_rows = max_batch;
  to_window.dst_rows = hot_->layer_rows();
  to_window.invalid = invalid_copies_;
  SPARSEKV_RETURN_IF_ERROR(backend_->IndexCopy(to_window, stream));

  // Write-back from the window slot (not from new_rows, which the caller may reuse at once) on
  // the side stream. The slot is next overwritten by the append W steps later, after FinishStep
  // has joined this copy; a resolve can only miss on this token once it has left the window,
  // also after that join.
  IndexCopyView to_host = to_window;
  to_host.src = hot_->layer_data(layer);
  to_host.src_index = to_window.dst_index;
  to_host.src_rows = hot_->layer_rows();
  to_host.dst = pool_->layer_base(layer);
  to_host.dst_index = At<int32_t>(plan_device_, layout.append_row);
  to_host.dst_rows = pool_->rows();
  SPARSEKV_RETURN_IF_ERROR(backend_->Fork(stream));
  SPARSEKV_RETURN_IF_ERROR(backend_->IndexCopy(to_host, backend_->SideStream()));
  appended_[layer] = true;
  open_bytes_to_host_per_request_ += shape.row_bytes;
  host_counters_.bytes_device_to_host += batch_.size() * static_cast<uint64_t>(shape.row_bytes);
  return Status::Ok();
}

Status SparseKVCacheManager::RunLayer(int32_t layer, const int32_t* topk, int32_t* slots,
                                      void* assembled, StreamHandle stream, int32_t topk_stride) {
  SPARSEKV_RETURN_IF_ERROR(ResolveLayer(layer, topk, slots, nullptr, stream, topk_stride));
  SPARSEKV_RETURN_IF_ERROR(CopyMisses(layer, stream));
  if (assembled == nullptr) return Status::Ok();
  return AssembleLayer(layer, slots, assembled, stream);
}

Status SparseKVCacheManager::CheckLayer(int32_t layer, const char* op) const {
  if (!step_open_) return FailedPrecondition(std::string(op) + ": no step is planned");
  if (layer < 0 || layer >= options_.geometry.num_layers()) {
    return InvalidArgument(std::string(op) + ": layer " + std::to_string(layer) + " out of range");
  }
  return Status::Ok();
}

Status SparseKVCacheManager::ResolveLayer(int32_t layer, const int32_t* topk, int32_t* slots,
                                          uint8_t* fill_mask, StreamHandle stream,
                                          int32_t topk_stride) {
  SPARSEKV_RETURN_IF_ERROR(CheckLayer(layer, "ResolveLayer"));
  if (layer % options_.layers_per_index != 0) {
    return FailedPrecondition("ResolveLayer: layer " + std::to_string(layer) +
                              " shares the top-k of layer " +
                              std::to_string(layer - layer % options_.layers_per_index) +
                              " (layers_per_index); that layer resolves for it");
  }
  if (!appended_[layer]) {
    return FailedPrecondition("ResolveLayer: AppendToken(" + std::to_string(layer) +
                              ") must come first in the step");
  }
  if (topk == nullptr || slots == nullptr) {
    return InvalidArgument("ResolveLayer: topk and slots must not be null");
  }
  if (topk_stride == 0) topk_stride = options_.top_k;
  if (topk_stride < options_.top_k) return InvalidArgument("ResolveLayer: topk_stride < top_k");
  const MissList& list = miss_lists_[MissListOf(layer)];
  SPARSEKV_RETURN_IF_ERROR(Resolve(layer, topk, options_.top_k, topk_stride, slots, fill_mask, list,
                                   counters_ + layer, stream));
  resolved_[layer / options_.layers_per_index] = true;
  remote_slots_[MissListOf(layer)] = slots;
  return BlankFailedRemoteSlots(layer, stream);
}

Status SparseKVCacheManager::Resolve(int32_t layer, const int32_t* topk, int32_t top_k,
                                     int32_t topk_stride, int32_t* slots, uint8_t* fill_mask,
                                     const MissList& list, ResolveCounters* counters,
                                     StreamHandle stream) {
  const int32_t max_batch = options_.effective_max_batch();
  const PlanLayout layout(max_batch);
  SPARSEKV_RETURN_IF_ERROR(backend_->MemsetAsync(list.count, 0, sizeof(int32_t), stream));
  ResolveView resolve{};
  resolve.batch_size = At<int32_t>(plan_device_, layout.batch_size);
  resolve.batch = At<BatchEntry>(plan_device_, layout.batch);
  resolve.topk = topk;
  resolve.top_k = top_k;
  resolve.topk_stride = topk_stride;
  resolve.slots_out = slots;
  resolve.slot_token = hot_->slot_token(layer);
  resolve.lru_order = hot_->lru_order(layer);
  if (options_.eviction == EvictionPolicy::kSegmentedLru) {
    resolve.lru_protected = hot_->lru_protected(layer);
    resolve.protected_capacity = options_.protected_capacity();
  }
  resolve.hot_slots = options_.hot_slots;
  resolve.window = options_.window;
  resolve.page_table = page_table_device_;
  resolve.pages_per_request = pool_->pages_per_owner();
  resolve.page_tokens = options_.host_page_tokens;
  resolve.miss_host_row = list.host_row;
  resolve.miss_slot = list.slot;
  resolve.miss_count = list.count;
  resolve.miss_capacity = max_batch * top_k;
  resolve.counters = counters;
  resolve.fill_mask = fill_mask;
  resolve.sort_misses = options_.sort_misses;
  resolve.sort_min_batch = options_.sort_misses_min_batch;
  resolve.share_duplicates = options_.share_repeated_positions;
  return backend_->Resolve(resolve, max_batch, stream);
}

Status SparseKVCacheManager::CopyMisses(int32_t layer, StreamHandle stream) {
  SPARSEKV_RETURN_IF_ERROR(CheckLayer(layer, "CopyMisses"));
  if (!resolved_[layer / options_.layers_per_index]) {
    return FailedPrecondition("CopyMisses: the top-k of layer " + std::to_string(layer) +
                              "'s index group was not resolved in this step");
  }
  SPARSEKV_RETURN_IF_ERROR(Copy(layer, miss_lists_[MissListOf(layer)],
                                options_.effective_max_batch() * options_.top_k, stream));
  return BlankFailedRemoteSlots(layer, stream);
}

Status SparseKVCacheManager::Copy(int32_t layer, const MissList& list, int32_t capacity,
                                  StreamHandle stream) {
  SPARSEKV_RETURN_IF_ERROR(FetchRemoteRows(layer, list, capacity, stream));
  const LayerShape shape = options_.geometry.layers[layer];
  IndexCopyView copy{};
  copy.src = pool_->layer_base(layer);
  copy.dst = hot_->layer_data(layer);
  copy.src_index = list.host_row;
  copy.dst_index = list.slot;
  copy.count = list.count;
  copy.capacity = capacity;
  copy.row_bytes = shape.row_bytes;
  copy.src_stride = copy.dst_stride = shape.row_stride;
  copy.src_rows = pool_->rows();
  copy.dst_rows = hot_->layer_rows();
  copy.invalid = invalid_copies_;
  copy.max_blocks = options_.copy_blocks;
  SPARSEKV_RETURN_IF_ERROR(backend_->IndexCopy(copy, stream));
  return CopyStagedRemoteRows(layer, stream);
}

Status SparseKVCacheManager::AssembleLayer(int32_t layer, const int32_t* slots, void* assembled,
                                           StreamHandle stream) {
  SPARSEKV_RETURN_IF_ERROR(CheckLayer(layer, "AssembleLayer"));
  if (slots == nullptr || assembled == nullptr) {
    return InvalidArgument("AssembleLayer: slots and assembled must not be null");
  }
  const LayerShape shape = options_.geometry.layers[layer];
  const int32_t max_batch = options_.effective_max_batch();
  const PlanLayout layout(max_batch);
  AssembleView a{};
  a.batch_size = At<int32_t>(plan_device_, layout.batch_size);
  a.hot = hot_->layer_data(layer);
  a.hot_rows = hot_->layer_rows();
  a.slots = slots;
  a.out = static_cast<std::byte*>(assembled);
  a.top_k = options_.top_k;
  a.row_bytes = shape.row_bytes;
  a.stride = shape.row_stride;
  SPARSEKV_RETURN_IF_ERROR(backend_->Assemble(a, max_batch, stream));
  open_bytes_assembled_per_request_ += static_cast<uint64_t>(options_.top_k) * shape.row_bytes;
  host_counters_.bytes_assembled +=
      batch_.size() * static_cast<uint64_t>(options_.top_k) * shape.row_bytes;
  return Status::Ok();
}

Status SparseKVCacheManager::PrefetchLayer(int32_t layer, const int32_t* positions, int32_t count,
                                           StreamHandle stream) {
  SPARSEKV_RETURN_IF_ERROR(CheckLayer(layer, "PrefetchLayer"));
  if (layer % options_.layers_per_index != 0) {
    return FailedPrecondition("PrefetchLayer: layer " + std::to_string(layer) +
                              " is not the first of its index group");
  }
  if (positions == nullptr) return InvalidArgument("PrefetchLayer: positions is null");
  if (count < 1 || count > options_.max_prefetch) {
    return InvalidArgument("PrefetchLayer: count " + std::to_string(count) + " outside [1, " +
                           std::to_string(options_.max_prefetch) + "] (max_prefetch)");
  }
  SPARSEKV_RETURN_IF_ERROR(Resolve(layer, positions, count, count, prefetch_slots_, nullptr,
                                   prefetch_list_,
                                   counters_ + options_.geometry.num_layers() + layer, stream));
  const int32_t capacity = options_.effective_max_batch() * count;
  const int32_t last = std::min(layer + options_.layers_per_index, options_.geometry.num_layers());
  for (int32_t l = layer; l < last; ++l) {
    SPARSEKV_RETURN_IF_ERROR(Copy(l, prefetch_list_, capacity, stream));
  }
  return Status::Ok();
}

Status SparseKVCacheManager::FinishStep(StreamHandle stream) {
  if (!step_open_) return FailedPrecondition("FinishStep: no step is planned");
  for (int32_t l = 0; l < options_.geometry.num_layers(); ++l) {
    if (!appended_[l]) {
      return FailedPrecondition("FinishStep: layer " + std::to_string(l) +
                                " has no AppendToken in this step");
    }
  }
  SPARSEKV_RETURN_IF_ERROR(backend_->Join(stream));
  step_bytes_to_host_per_request_ = open_bytes_to_host_per_request_;
  step_bytes_assembled_per_request_ = open_bytes_assembled_per_request_;
  CloseStep();
  return Status::Ok();
}

void SparseKVCacheManager::CloseStep() {
  // Pages this step filled are complete once its write-back is joined into the main stream,
  // which every later reader of the pool is ordered after.
  for (RequestId id : batch_) IndexFullPages(requests_.at(id));
  step_open_ = false;
}

Status SparseKVCacheManager::FinishReplayedStep() {
  if (!step_open_) return FailedPrecondition("FinishReplayedStep: no step is planned");
  if (step_bytes_to_host_per_request_ == 0) {
    return FailedPrecondition("FinishReplayedStep: no complete run phase was ever recorded");
  }
  host_counters_.bytes_device_to_host += batch_.size() * step_bytes_to_host_per_request_;
  host_counters_.bytes_assembled += batch_.size() * step_bytes_assembled_per_request_;
  CloseStep();
  return Status::Ok();
}

StatusOr<CacheStats> SparseKVCacheManager::ReadStats(StreamHandle stream) {
  const int32_t layers = options_.geometry.num_layers();
  std::vector<ResolveCounters> counters(2 * layers);
  unsigned long long invalid = 0;
  SPARSEKV_RETURN_IF_ERROR(backend_->Synchronize(stream));
  SPARSEKV_RETURN_IF_ERROR(backend_->CopyAsync(counters.data(), counters_,
                                               sizeof(ResolveCounters) * 2 * layers, stream));
  SPARSEKV_RETURN_IF_ERROR(backend_->CopyAsync(&invalid, invalid_copies_, sizeof(invalid), stream));
  SPARSEKV_RETURN_IF_ERROR(backend_->Synchronize(stream));

  CacheStats s;
  static_cast<HostCounters&>(s) = host_counters_;  // bytes_host_to_device gains the copies
  for (int32_t l = 0; l < layers; ++l) {
    // A layer that shares its group's top-k copies what the group's first layer resolved.
    const ResolveCounters& c = counters[l - l % options_.layers_per_index];
    LayerStats ls{c.hits, c.window_hits, c.misses, c.padding, c.duplicates, c.out_of_range};
    s.layers.push_back(ls);
    s.total.hits += ls.hits;
    s.total.window_hits += ls.window_hits;
    s.total.misses += ls.misses;
    s.total.padding += ls.padding;
    s.total.duplicates += ls.duplicates;
    s.total.out_of_range += ls.out_of_range;
    s.bytes_host_to_device += ls.misses * options_.geometry.layers[l].row_bytes;
  }
  for (int32_t l = 0; l < layers; ++l) {
    const ResolveCounters& p = counters[layers + l - l % options_.layers_per_index];
    if (l % options_.layers_per_index == 0) {
      s.prefetch_lookups += p.hits + p.window_hits + p.misses;
      s.prefetch_rows += p.misses;
    }
    s.bytes_host_to_device += p.misses * options_.geometry.layers[l].row_bytes;
  }
  s.invalid_copy_entries = invalid;
  s.host_pages_total = pool_->total_pages();
  s.host_pages_used = pool_->total_pages() - pool_->free_pages();
  s.hot_blocks_used = hot_->used_blocks();
  s.device_bytes = device_bytes_;
  s.pages_shared = pool_->shared_pages();
  s.bytes_saved = pool_->extra_references() * pool_->page_bytes();
  s.retained_conversations = ledger_->retained_conversations();
  return s;
}

Status SparseKVCacheManager::ResetStats(StreamHandle stream) {
  SPARSEKV_RETURN_IF_ERROR(backend_->MemsetAsync(
      counters_, 0, sizeof(ResolveCounters) * 2 * options_.geometry.num_layers(), stream));
  SPARSEKV_RETURN_IF_ERROR(
      backend_->MemsetAsync(invalid_copies_, 0, sizeof(unsigned long long), stream));
  host_counters_ = {};
  return backend_->Synchronize(stream);
}

StatusOr<int32_t> SparseKVCacheManager::SequenceLength(RequestId id) const {
  auto it = requests_.find(id);
  if (it == requests_.end()) return NotFound("SequenceLength: " + Describe(id) + " is unknown");
  return it->second.seq_len;
}

StatusOr<std::vector<int32_t>> SparseKVCacheManager::HostPages(RequestId id) const {
  if (const std::vector<int32_t>* pages = ledger_->RetainedPages(id)) return *pages;
  auto it = requests_.find(id);
  if (it == requests_.end()) return NotFound("HostPages: " + Describe(id) + " is unknown");
  const int32_t pages = pool_->ReservedTokens(it->second.owner) / options_.host_page_tokens;
  const std::span<const int32_t> row = pool_->page_table_row(it->second.owner);
  return std::vector<int32_t>(row.begin(), row.begin() + pages);
}

bool SparseKVCacheManager::IsRetained(RequestId id) const { return ledger_->IsRetained(id); }

const std::byte* SparseKVCacheManager::HotLayer(int32_t layer) const {
  return hot_->layer_data(layer);
}

}  // namespace sparsekv
