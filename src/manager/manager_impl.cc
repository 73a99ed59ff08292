// SparseKVCacheManager::Impl, part one: creation of the parts, the request lifecycle, prefix
// sharing and retained conversations, indexer keys, and the host the manager offers its
// extensions.
#include "manager/manager_impl.h"

#include <algorithm>
#include <string>

namespace sparsekv {

using manager_internal::Describe;

namespace {

// `o` in entry units (manager_impl.h, entries_): every layer at the offloaded layers' cadence,
// no raw window. The other layers keep their kind, so that the host pool and the hot cache give
// them no rows and no replacement state.
CacheOptions EntryOptions(const CacheOptions& o) {
  const int32_t r = o.geometry.offloaded_entry_tokens();
  CacheOptions e = o;
  e.max_context = std::max(1, o.max_context / r);
  e.host_capacity_tokens = o.host_capacity_tokens / r;
  e.raw_window = 0;
  for (LayerShape& l : e.geometry.layers) {
    if (l.kind == LayerKind::kOffloaded) continue;
    l.entry_tokens = r;
    l.indexer_keys = false;
  }
  return e;
}

// Per layer: not offloaded (StepOrder::Shape::dense).
std::vector<bool> DenseLayers(const CacheOptions& o) {
  std::vector<bool> dense;
  for (const LayerShape& l : o.geometry.layers) dense.push_back(l.kind != LayerKind::kOffloaded);
  return dense;
}

}  // namespace

SparseKVCacheManager::Impl::Impl(const CacheOptions& options, std::shared_ptr<Backend> backend,
                                 std::shared_ptr<HostKVPool> pool)
    : options_(options),
      cadence_(options.geometry.offloaded_entry_tokens()),
      entries_(EntryOptions(options)),
      groups_(options),
      backend_(std::move(backend)),
      pool_(std::move(pool)),
      plan_(entries_, *backend_),
      order_({.layers = options.geometry.num_layers(),
              .max_batch = options.effective_max_batch(),
              .copy_chunk_rows = options.copy_chunk_rows,
              .dense = DenseLayers(options)},
             groups_),
      tables_(*backend_),
      keys_(entries_, *backend_),
      stats_(entries_, *backend_),
      marks_(entries_, groups_, *backend_),
      residency_(entries_, *backend_, requests_, stats_.host()) {}

Status SparseKVCacheManager::Impl::Allocate() {
  const CacheOptions& o = entries_;
  if (pool_ == nullptr) {
    SPARSEKV_ASSIGN_OR_RETURN(
        pool_, HostKVPool::Create(o.geometry, o.host_capacity_tokens, o.host_page_tokens,
                                  o.effective_max_host_requests(), o.max_context, backend_.get()));
  }
  // A page of host_page_tokens entries covers cadence_ times as many tokens, whose ids key it.
  ledger_ = std::make_unique<PageLedger>(pool_.get(), o.host_page_tokens * cadence_);
  SPARSEKV_RETURN_IF_ERROR(AllocateDense());  // its share of the budget first
  SPARSEKV_ASSIGN_OR_RETURN(const HotCacheShape shape, ChooseHotCacheShape(o));
  options_.hot_slots = entries_.hot_slots = shape.hot_slots;
  SPARSEKV_RETURN_IF_ERROR(ValidateOptions(options_));  // the chosen slots against the rest
  SPARSEKV_ASSIGN_OR_RETURN(
      hot_, HotCache::Create(o.geometry, o.hot_slots, o.window, shape.blocks, shape.pages,
                             shape.page_rows, backend_.get(), groups_, ReplacementOf(o)));
  keys_.Attach(*hot_, tables_, shape.keys_per_page);

  SPARSEKV_RETURN_IF_ERROR(plan_.Allocate());
  SPARSEKV_RETURN_IF_ERROR(stats_.Allocate());
  SPARSEKV_RETURN_IF_ERROR(marks_.Allocate(shape.blocks, o.hot_slots));
  hot_->AttachSlotBytes(marks_.marks());  // before any block is acquired
  SPARSEKV_RETURN_IF_ERROR(residency_.Allocate(*pool_, *hot_, tables_, stats_.invalid_copies()));
  const int64_t positions = int64_t{pool_->pages_per_owner()} * o.host_page_tokens;
  SPARSEKV_RETURN_IF_ERROR(tables_.Allocate(
      {.max_owners = pool_->max_owners(),
       .pages_per_owner = pool_->pages_per_owner(),
       .resident_pages_per_owner =
           o.hybrid_residency ? static_cast<int32_t>(residency_.ResidentPagesFor(positions)) : 0,
       .key_pages_per_owner = static_cast<int32_t>(keys_.PagesFor(positions))}));
  device_bytes_ = hot_->device_bytes() + plan_.device_bytes() + tables_.device_bytes() +
                  residency_.device_bytes() + stats_.device_bytes() + marks_.device_bytes();
  return backend_->Synchronize(nullptr);
}

SparseKVCacheManager::Impl::~Impl() {
  backend_->Synchronize(nullptr).IgnoreError();
  // Gives back what this manager holds, for other managers of a shared pool.
  for (const auto& [id, r] : requests_) {
    pool_->Release(r.owner);
    if (r.cow_page >= 0) pool_->Unref(r.cow_page);
    pool_->ReleaseOwner(r.owner);
  }
  ledger_.reset();  // drops the retained conversations' references
  // While the pool, the hot cache and the backend still exist; the last installed first. The
  // parts free their device buffers after.
  extensions_.Clear();
}

StatusOr<SparseKVCacheManager::Impl::Request*> SparseKVCacheManager::Impl::Find(RequestId id,
                                                                                const char* op) {
  auto it = requests_.find(id);
  if (it == requests_.end()) {
    return NotFound(std::string(op) + ": " + Describe(id) + " is unknown or released");
  }
  return &it->second;
}

Status SparseKVCacheManager::Impl::UploadPageTable(const Request& r, StreamHandle stream) {
  return tables_.UploadPageRow(r.owner, pool_->page_table_row(r.owner), stream);
}

StatusOr<SparseKVCacheManager::Impl::Request*> SparseKVCacheManager::Impl::AdmitShared(
    RequestId id, int32_t prompt_tokens, int64_t tokens, std::span<const int32_t> shared,
    int32_t spare_pages, std::vector<int32_t>& spares, bool may_be_resident, StreamHandle stream) {
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
  // In entries from here on; at least one, so that a resident request holds a page.
  const int32_t seq_len = prompt_tokens / cadence_;
  const int64_t entries = std::max<int64_t>(tokens / cadence_, 1);
  const int64_t key_pages = keys_.PagesFor(entries);
  if (!residency_.CanPlace(entries, may_be_resident, key_pages, OpenBatch())) {
    pool_->ReleaseOwner(owner);
    return ResourceExhausted(
        residency_.OnDeviceRequests() >= options_.max_requests
            ? "Admit: all " + std::to_string(options_.max_requests) +
                  " device places are in use (max_requests)"
            : "Admit: the device memory is full (" + std::to_string(hot_->free_pages()) +
                  " free pages, and demoting resident requests frees too few)");
  }
  const int32_t pt = options_.host_page_tokens;
  const int64_t fresh = (entries + pt - 1) / pt - static_cast<int64_t>(shared.size()) + spare_pages;
  // With a shared pool, another manager may take the pages MakeRoom found before Reserve runs;
  // Reserve then fails, all or nothing.
  PageLedger::Evictions evicted;
  Status reserved = ledger_->MakeRoom(fresh, "Admit", evicted);
  if (evicted.conversations > 0) DropEvictedEntries();
  stats_.host().evictions += evicted.conversations;
  stats_.host().evicted_pages += evicted.pages;
  if (reserved.ok()) {
    reserved = pool_->Reserve(owner, static_cast<int32_t>(entries), shared, spare_pages, &spares);
  }
  if (!reserved.ok()) {
    pool_->ReleaseOwner(owner);
    return reserved;
  }
  // The pool rounds the reservation up to pages; the request may use no more than it asked for.
  Request r{.owner = owner,
            .block = -1,
            .seq_len = seq_len,
            .reserved = static_cast<int32_t>(entries),
            .ingested = std::vector<bool>(options_.geometry.num_layers(), false),
            .ingested_layers = 0,
            .may_be_resident = may_be_resident,
            .keys_ingested = std::vector<bool>(options_.geometry.num_layers(), false),
            .tokens = prompt_tokens,
            .reserved_tokens = static_cast<int32_t>(tokens)};
  // Room was checked above; a demotion that fails after all, or the backend's copies, can still.
  if (Status placed = residency_.PlaceOnDevice(r, key_pages, OpenBatch(), stream); !placed.ok()) {
    ReleaseDevice(r);
    for (int32_t page : spares) ledger_->Unref(page);
    spares.clear();
    ledger_->ReleaseOwnerPages(owner);
    pool_->ReleaseOwner(owner);
    return placed;
  }
  SPARSEKV_RETURN_IF_ERROR(UploadPageTable(r, stream));

  return &requests_.emplace(id, std::move(r)).first->second;
}

Status SparseKVCacheManager::Impl::Admit(RequestId id, int32_t prompt_len, int32_t max_new_tokens,
                                         StreamHandle stream) {
  if (prompt_len < 1 || max_new_tokens < 0) {
    return InvalidArgument("Admit: prompt_len must be >= 1 and max_new_tokens >= 0");
  }
  std::vector<int32_t> no_spares;
  SPARSEKV_ASSIGN_OR_RETURN(Request * r,
                            AdmitShared(id, prompt_len, int64_t{prompt_len} + max_new_tokens, {}, 0,
                                        no_spares, true, stream));
  if (dense_ == nullptr) return Status::Ok();
  Status held = dense_->Admit(id, prompt_len, r->reserved_tokens, stream);
  if (!held.ok()) Forget(id, *r);  // all or nothing
  return held;
}

StatusOr<int32_t> SparseKVCacheManager::Impl::AdmitWithPrefix(RequestId id,
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
  // A page holds host_page_tokens entries, which cover page_tokens tokens.
  const int32_t page_tokens = options_.host_page_tokens * cadence_;
  // At least the last prompt token is left out: the engine computes its KV with its logits (at
  // entry_tokens > 1 its entry, if it completes one, is ingested).
  std::vector<int32_t> matched = ledger_->Match(token_ids, (prompt_len - 1) / page_tokens);
  // With resident layers, only as much as a retained conversation's copy of them holds.
  const std::shared_ptr<const RetainedEntries> entries = PrefixEntries(matched);
  // Pinned while admission may evict, so that the prefix it found is not freed under it.
  for (int32_t page : matched) pool_->AddRef(page);
  std::vector<int32_t> no_spares;
  StatusOr<Request*> r = AdmitShared(id, prompt_len, int64_t{prompt_len} + max_new_tokens, matched,
                                     0, no_spares, true, stream);
  for (int32_t page : matched) ledger_->Unref(page);
  if (!r.ok()) return r.status();
  // In tokens for the caller, in entries for the request.
  const int32_t cached = static_cast<int32_t>(matched.size()) * page_tokens;
  if (dense_ != nullptr) {
    // All or nothing, as Admit; the prefix's resident entries come from the copy, the rest and
    // the raw windows from the caller's ingestion.
    Status held = dense_->Admit(id, prompt_len, (*r)->reserved_tokens, stream);
    if (held.ok() && entries != nullptr) {
      held = dense_->RestoreEntries(id, entries->host.data(),
                                    static_cast<int64_t>(entries->host.size()),
                                    entries->reserved_tokens, cached, stream);
    }
    if (!held.ok()) {
      Forget(id, **r);
      return held;
    }
  }
  const int32_t cached_entries = static_cast<int32_t>(matched.size()) * options_.host_page_tokens;
  // A resident request holds its shared prefix in its own pages too (from the pool, complete in
  // every layer); ingestion brings the rest.
  if ((*r)->resident() && cached_entries > 0) {
    SPARSEKV_RETURN_IF_ERROR(residency_.LoadResident(**r, 0, cached_entries, stream));
  }
  (*r)->cached = cached_entries;
  (*r)->token_ids.assign(token_ids.begin(), token_ids.end());
  (*r)->indexed_pages = static_cast<int32_t>(matched.size());
  ledger_->Touch(matched);  // the conversations holding the prefix are in use again
  stats_.host().prefix_lookup_tokens += prompt_len;
  stats_.host().prefix_hit_tokens += cached;
  return cached;
}

Status SparseKVCacheManager::Impl::Fork(RequestId parent, RequestId child, int32_t max_new_tokens,
                                        StreamHandle stream) {
  SPARSEKV_ASSIGN_OR_RETURN(Request * p, Find(parent, "Fork"));
  if (max_new_tokens < 0) return InvalidArgument("Fork: max_new_tokens must be >= 0");
  SPARSEKV_RETURN_IF_ERROR(extensions_.CheckFork(parent));
  if (p->ingested_layers != options_.geometry.num_layers()) {
    return FailedPrecondition("Fork: " + Describe(parent) + " has layers not yet ingested");
  }
  if (InOpenStep(parent)) {
    return FailedPrecondition("Fork: " + Describe(parent) + " is in the open step");
  }
  if (dense_ != nullptr && !p->on_device()) {
    return FailedPrecondition("Fork: " + Describe(parent) +
                              " is retracted (its resident entries and raw windows are not on "
                              "the device)");
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
      Request * c, AdmitShared(child, p->tokens, int64_t{p->tokens} + max_new_tokens, shared,
                               int32_t{child_spare} + int32_t{parent_spare}, spares,
                               /*may_be_resident=*/false, stream));
  if (dense_ != nullptr) {
    if (Status held = dense_->Fork(parent, child, c->reserved_tokens, stream); !held.ok()) {
      for (int32_t page : spares) ledger_->Unref(page);
      Forget(child, *c);
      return held;
    }
  }
  if (child_spare) c->cow_page = spares[0];
  if (parent_spare) p->cow_page = spares.back();
  c->cached = seq_len;
  c->ingested.assign(options_.geometry.num_layers(), true);
  c->ingested_layers = options_.geometry.num_layers();
  c->token_ids = p->token_ids;
  c->indexed_pages = p->indexed_pages;
  if (keys_.enabled()) SPARSEKV_RETURN_IF_ERROR(keys_.Copy(*p, *c, stream));
  return residency_.LoadIngestedWindows(*c, stream);
}

Status SparseKVCacheManager::Impl::IngestIndexerKeys(RequestId id, int32_t layer, const void* keys,
                                                     StreamHandle stream) {
  SPARSEKV_RETURN_IF_ERROR(keys_.CheckEnabled());
  SPARSEKV_ASSIGN_OR_RETURN(Request * r, Find(id, "IngestIndexerKeys"));
  return keys_.Ingest(id, *r, layer, keys, stream);
}

Status SparseKVCacheManager::Impl::AdmitSealedPrompt(RequestId id, int32_t owner, uint64_t seal,
                                                     int32_t max_new_tokens, StreamHandle stream) {
  SPARSEKV_RETURN_IF_ERROR(CheckCadenceOne("AdmitSealedPrompt"));
  if (max_new_tokens < 0) return InvalidArgument("AdmitSealedPrompt: max_new_tokens must be >= 0");
  if (requests_.contains(id) || ledger_->IsRetained(id)) {
    return AlreadyExists("AdmitSealedPrompt: " + Describe(id) + " already exists");
  }
  // Our own references, held while admission may evict and then dropped: the request's table
  // takes references of its own.
  SPARSEKV_ASSIGN_OR_RETURN(HostKVPool::SealedPages sealed, pool_->ShareSealed(owner, seal));
  const int32_t prompt_len = sealed.tokens;
  // As a fork: a shared, partially filled last page is copied by the first append into it.
  const bool spare = prompt_len % options_.host_page_tokens != 0 && max_new_tokens > 0;
  std::vector<int32_t> spares;
  StatusOr<Request*> r =
      AdmitShared(id, prompt_len, int64_t{prompt_len} + max_new_tokens, sealed.pages,
                  int32_t{spare}, spares, /*may_be_resident=*/false, stream);
  for (int32_t page : sealed.pages) ledger_->Unref(page);
  if (!r.ok()) return r.status();
  if (spare) (*r)->cow_page = spares[0];
  (*r)->cached = prompt_len;
  (*r)->ingested.assign(options_.geometry.num_layers(), true);
  (*r)->ingested_layers = options_.geometry.num_layers();
  return residency_.LoadIngestedWindows(**r, stream);
}

Status SparseKVCacheManager::Impl::IngestPrompt(RequestId id, int32_t layer, const PromptRows& rows,
                                                StreamHandle stream) {
  return Ingest(id, layer, rows.entries, rows.window, 0, "IngestPrompt", stream);
}

Status SparseKVCacheManager::Impl::IngestPromptSuffix(RequestId id, int32_t layer,
                                                      const PromptRows& rows, StreamHandle stream) {
  SPARSEKV_ASSIGN_OR_RETURN(Request * r, Find(id, "IngestPromptSuffix"));
  return Ingest(id, layer, rows.entries, rows.window, r->cached, "IngestPromptSuffix", stream);
}

Status SparseKVCacheManager::Impl::Ingest(RequestId id, int32_t layer, const void* rows,
                                          const void* window_rows, int32_t rows_first,
                                          const char* op, StreamHandle stream) {
  SPARSEKV_ASSIGN_OR_RETURN(Request * r, Find(id, op));
  if (layer < 0 || layer >= options_.geometry.num_layers()) {
    return InvalidArgument(std::string(op) + ": layer " + std::to_string(layer) + " out of range");
  }
  // A prompt shorter than an entry (entry_tokens > 1) has no rows to give.
  if (Offloaded(layer) && rows == nullptr && r->seq_len > r->cached) {
    return InvalidArgument(std::string(op) + ": rows is null");
  }
  if (r->ingested[layer]) {
    return AlreadyExists(std::string(op) + ": layer " + std::to_string(layer) + " of " +
                         Describe(id) + " was already ingested (stored KV is never overwritten)");
  }
  if (!r->on_device()) {
    return FailedPrecondition(std::string(op) + ": " + Describe(id) + " is retracted");
  }
  if (dense_ != nullptr) {
    // A shared prefix's resident entries are in place already (AdmitWithPrefix restored them):
    // only those past it are written, and whole-prompt rows are read from the first of them.
    const int32_t kept = r->cached * cadence_;
    const auto* entry_rows = static_cast<const std::byte*>(Offloaded(layer) ? nullptr : rows);
    if (entry_rows != nullptr && rows_first == 0) {
      const LayerShape& shape = options_.geometry.layers[layer];
      entry_rows += static_cast<int64_t>(kept / shape.entry_tokens) * shape.row_stride;
    }
    // First: it checks its own pointers, and on an error nothing is written.
    SPARSEKV_RETURN_IF_ERROR(
        dense_->IngestPrompt(id, layer, entry_rows, window_rows, stream, kept));
  }
  if (!Offloaded(layer)) {
    r->ingested[layer] = true;
    ++r->ingested_layers;
    if (r->ingested_layers == options_.geometry.num_layers()) IndexFullPages(*r);
    return Status::Ok();
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
  if (r->resident()) {
    SPARSEKV_RETURN_IF_ERROR(
        residency_.CopyToResident(*r, layer, rows, rows_first, r->cached, stream));
  } else {
    SPARSEKV_RETURN_IF_ERROR(residency_.LoadWindow(*r, layer, rows, rows_first, stream));
  }
  r->ingested[layer] = true;
  ++r->ingested_layers;
  stats_.host().bytes_ingested += static_cast<uint64_t>(r->seq_len - r->cached) * shape.row_bytes;
  if (r->ingested_layers == options_.geometry.num_layers()) IndexFullPages(*r);
  return Status::Ok();
}

void SparseKVCacheManager::Impl::IndexFullPages(Request& r) {
  const int32_t pt = options_.host_page_tokens;
  const int32_t page_tokens = pt * cadence_;
  const std::span<const int32_t> table = pool_->page_table_row(r.owner);
  const std::span<const int32_t> ids = r.token_ids;
  // A page is full once it holds pt entries, and keyed once the ids of every token its entries
  // cover are known.
  const int32_t full =
      static_cast<int32_t>(std::min<size_t>(r.seq_len, ids.size() / cadence_) / pt);
  for (; r.indexed_pages < full; ++r.indexed_pages) {
    const int32_t i = r.indexed_pages;
    // Fails only if an identical copy of the page is indexed already (two requests computed the
    // same prefix independently): lookups find that copy, and the pages after this one could not
    // be reached through it, so indexing stops here.
    if (!ledger_->Index(i == 0 ? -1 : table[i - 1], table[i],
                        ids.subspan(static_cast<size_t>(i) * page_tokens, page_tokens))) {
      return;
    }
  }
}

void SparseKVCacheManager::Impl::ReleaseDevice(Request& r) {
  if (r.block >= 0) hot_->Release(r.block);
  hot_->ReleasePages(r.resident_pages);
  hot_->ReleasePages(r.key_pages);
  r.block = -1;
  r.resident_pages.clear();
  r.key_pages.clear();
}

void SparseKVCacheManager::Impl::Forget(RequestId id, Request& r) {
  extensions_.OnDrop(id);
  if (dense_ != nullptr) {
    dense_->Release(id).IgnoreError();  // NotFound: never held (an admission it refused)
    dense_retracted_.erase(id);
  }
  ReleaseDevice(r);
  ledger_->ReleaseOwnerPages(r.owner);
  if (r.cow_page >= 0) ledger_->Unref(r.cow_page);
  pool_->ReleaseOwner(r.owner);
  requests_.erase(id);
}

Status SparseKVCacheManager::Impl::Release(RequestId id) {
  if (ledger_->Drop(id) >= 0) {
    dense_retained_.erase(id);
    return Status::Ok();
  }
  SPARSEKV_ASSIGN_OR_RETURN(Request * r, Find(id, "Release"));
  if (InOpenStep(id)) {
    return FailedPrecondition("Release: " + Describe(id) + " is in the open step");
  }
  Forget(id, *r);
  return Status::Ok();
}

int32_t SparseKVCacheManager::Impl::EvictRetained() {
  const int32_t evicted = ledger_->DropAll();
  dense_retained_.clear();
  return evicted;
}

StatusOr<int32_t> SparseKVCacheManager::Impl::Retain(RequestId id) {
  SPARSEKV_ASSIGN_OR_RETURN(Request * r, Find(id, "Retain"));
  if (InOpenStep(id)) {
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
  const int32_t tokens = static_cast<int32_t>(pages.size()) * options_.host_page_tokens * cadence_;
  SPARSEKV_RETURN_IF_ERROR(RetainDense(id, *r));
  ledger_->Retain(id, std::move(pages));  // before Forget drops the request's references
  Forget(id, *r);
  return tokens;
}

Status SparseKVCacheManager::Impl::Retract(RequestId id) {
  SPARSEKV_ASSIGN_OR_RETURN(Request * r, Find(id, "Retract"));
  if (!r->on_device()) return FailedPrecondition("Retract: " + Describe(id) + " is retracted");
  if (InOpenStep(id)) {
    return FailedPrecondition("Retract: " + Describe(id) + " is in the open step");
  }
  SPARSEKV_RETURN_IF_ERROR(RetractDense(id));
  if (r->resident()) {
    hot_->ReleasePages(r->resident_pages);
    r->resident_pages.clear();
  } else {
    hot_->Release(r->block);
    r->block = -1;
  }
  return Status::Ok();
}

Status SparseKVCacheManager::Impl::Resume(RequestId id, StreamHandle stream) {
  SPARSEKV_ASSIGN_OR_RETURN(Request * r, Find(id, "Resume"));
  if (r->on_device()) return FailedPrecondition("Resume: " + Describe(id) + " is not retracted");
  if (!residency_.CanPlace(r->reserved, r->may_be_resident, 0, OpenBatch())) {
    return ResourceExhausted("Resume: no device room for " + Describe(id) +
                             " (max_requests = " + std::to_string(options_.max_requests) + ", " +
                             std::to_string(hot_->free_pages()) + " free pages)");
  }
  SPARSEKV_RETURN_IF_ERROR(ResumeDense(id, stream));
  if (Status placed = residency_.PlaceOnDevice(*r, 0, OpenBatch(), stream); !placed.ok()) {
    RetractDense(id).IgnoreError();  // back as it was
    return placed;
  }
  if (!r->resident()) return residency_.LoadIngestedWindows(*r, stream);
  if (r->ingested_layers == options_.geometry.num_layers()) {
    return residency_.LoadResident(*r, 0, r->seq_len, stream);
  }
  // Still being ingested: the pool holds the shared prefix in every layer and the rest only in
  // the ingested layers; a layer not yet ingested gets the rest at its ingestion.
  if (r->cached > 0) SPARSEKV_RETURN_IF_ERROR(residency_.LoadResident(*r, 0, r->cached, stream));
  for (int32_t l = 0; l < options_.geometry.num_layers(); ++l) {
    if (r->ingested[l] && Offloaded(l)) {
      SPARSEKV_RETURN_IF_ERROR(residency_.PoolToResident(*r, l, stream));
    }
  }
  return Status::Ok();
}

Status SparseKVCacheManager::Impl::Promote(RequestId id, StreamHandle stream) {
  SPARSEKV_ASSIGN_OR_RETURN(Request * r, Find(id, "Promote"));
  return residency_.Promote(id, *r, OpenBatch(), stream);
}

// ---- Extension ----

Status SparseKVCacheManager::Impl::InstallExtension(const ExtensionFactory& make) {
  SPARSEKV_RETURN_IF_ERROR(order_.CheckInstallExtension());
  SPARSEKV_RETURN_IF_ERROR(CheckCadenceOne("InstallExtension"));
  return extensions_.Install(make, *this);
}

Status SparseKVCacheManager::Impl::CheckCadenceOne(const char* op) const {
  if (dense_ != nullptr) {
    return Unimplemented(std::string(op) +
                         ": the geometry has resident or window-only layers or a raw_window, and "
                         "sealed prompts and extensions know only the host pool's offloaded rows "
                         "(docs/deepseek-v4.md)");
  }
  if (cadence_ == 1) return Status::Ok();
  return Unimplemented(std::string(op) + ": the layers gain an entry every " +
                       std::to_string(cadence_) +
                       " tokens (entry_tokens), and sealed prompts and extensions are served only "
                       "at one entry per token (docs/deepseek-v4.md)");
}

Status SparseKVCacheManager::Impl::AdmitWithPages(RequestId id, int32_t prompt_len,
                                                  int32_t max_new_tokens,
                                                  std::span<const int32_t> shared,
                                                  StreamHandle stream) {
  std::vector<int32_t> no_spares;
  SPARSEKV_ASSIGN_OR_RETURN(
      Request * r, AdmitShared(id, prompt_len, int64_t{prompt_len} + max_new_tokens, shared, 0,
                               no_spares, /*may_be_resident=*/false, stream));
  // Never ingested, never written.
  r->cached = static_cast<int32_t>(shared.size()) * options_.host_page_tokens;
  return Status::Ok();
}

Status SparseKVCacheManager::Impl::CompleteLayer(RequestId id, int32_t layer, StreamHandle stream) {
  SPARSEKV_ASSIGN_OR_RETURN(Request * found, Find(id, "CompleteLayer"));
  Request& r = *found;
  if (layer < 0 || layer >= options_.geometry.num_layers()) {
    return InvalidArgument("CompleteLayer: layer " + std::to_string(layer) + " out of range");
  }
  if (r.ingested[layer]) {
    return AlreadyExists("CompleteLayer: layer " + std::to_string(layer) + " of " + Describe(id) +
                         " is complete already");
  }
  if (!r.on_device()) {
    return FailedPrecondition("CompleteLayer: " + Describe(id) + " is retracted");
  }
  SPARSEKV_RETURN_IF_ERROR(residency_.LoadWindow(r, layer, nullptr, 0, stream));
  r.ingested[layer] = true;
  ++r.ingested_layers;
  return Status::Ok();
}

}  // namespace sparsekv
