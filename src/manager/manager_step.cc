// SparseKVCacheManager::Impl, part two: the plan and run phases of a decode step (each call
// checked by StepOrder, over StepPlan's buffers), and the statistics read from Statistics.
#include <algorithm>
#include <cassert>
#include <string>
#include <unordered_set>

#include "manager/manager_impl.h"
#include "manager/pool_copy.h"

namespace sparsekv {

using manager_internal::Describe;

Status SparseKVCacheManager::Impl::PlanStep(std::span<const RequestId> batch,
                                            const std::span<const int32_t>* token_ids,
                                            StreamHandle stream) {
  SPARSEKV_RETURN_IF_ERROR(order_.CheckPlan());
  if (token_ids != nullptr && token_ids->size() != batch.size()) {
    return InvalidArgument("PlanStep: " + std::to_string(token_ids->size()) +
                           " token ids for a batch of " + std::to_string(batch.size()));
  }
  const int32_t max_batch = options_.effective_max_batch();
  if (batch.empty() || batch.size() > static_cast<size_t>(max_batch)) {
    return InvalidArgument("PlanStep: batch size " + std::to_string(batch.size()) +
                           " not in [1, max_batch = " + std::to_string(max_batch) + "]");
  }
  // Every check the host can make, over the whole batch, before anything changes.
  std::unordered_set<RequestId> seen;
  for (RequestId id : batch) {
    SPARSEKV_ASSIGN_OR_RETURN(Request * r, Find(id, "PlanStep"));
    if (!seen.insert(id).second) {
      return InvalidArgument("PlanStep: " + Describe(id) + " appears twice in the batch");
    }
    if (!r->on_device()) {
      return FailedPrecondition("PlanStep: " + Describe(id) + " is retracted");
    }
    if (r->ingested_layers != options_.geometry.num_layers()) {
      return FailedPrecondition("PlanStep: " + Describe(id) + " has layers not yet ingested");
    }
    if (keys_.enabled() && r->keys_ingested_layers != keys_.keyed_layers()) {
      return FailedPrecondition("PlanStep: " + Describe(id) +
                                " has layers whose indexer keys are not yet ingested");
    }
    if (r->tokens >= r->reserved_tokens) {
      return OutOfRange("PlanStep: " + Describe(id) + " reached its reserved length (" +
                        std::to_string(r->reserved_tokens) + " tokens)");
    }
  }
  // Then the work that may fail on the device, each part undone if a later one fails, so that a
  // refused step leaves every request as it was; the requests change only once all of it is
  // enqueued. dense_ runs the same checks and changes nothing on an error.
  if (dense_ != nullptr) SPARSEKV_RETURN_IF_ERROR(dense_->PlanStep(batch, stream));
  std::vector<CopyOnWrite> copies;
  Status planned = CopySharedPages(batch, copies, stream);
  if (planned.ok()) planned = FillPlan(batch, stream);
  if (!planned.ok()) {
    UndoCopies(copies, stream);
    if (dense_ != nullptr) dense_->CancelStep(batch);
    return planned;
  }
  for (size_t b = 0; b < batch.size(); ++b) {
    Request& r = requests_.at(batch[b]);
    // Ids are kept per token while complete from token 0 on.
    if (token_ids != nullptr && r.token_ids.size() == static_cast<size_t>(r.tokens)) {
      r.token_ids.push_back((*token_ids)[b]);
    }
    if (EntriesAt(++r.tokens, cadence_).completed == kNoEntry) continue;
    [[maybe_unused]] const int32_t position = r.seq_len++;  // read by the assert below
    if (r.cow_page >= 0) {
      // The page was shared, partially filled, when the request was forked. Copied above if it
      // still is (the table holds the copy; its reference to the shared page is dropped now),
      // else the spare is not needed.
      auto copy = std::find_if(copies.begin(), copies.end(),
                               [&](const CopyOnWrite& c) { return c.owner == r.owner; });
      ledger_->Unref(copy != copies.end() ? copy->shared : r.cow_page);
      if (copy != copies.end()) ++stats_.host().copy_on_write_pages;
      r.cow_page = -1;
    }
    // The invariant copy on write keeps: a request writes only pages no one else references.
    assert(pool_->RefCount(pool_->page_table_row(r.owner)[position / options_.host_page_tokens]) ==
           1);
  }
  plan_.SetBatch(batch);
  extensions_.BeginStep(plan_.batch(), stream);
  plan_.SetCanMiss(extensions_.active() ||
                   std::any_of(batch.begin(), batch.end(),
                               [&](RequestId id) { return !requests_.at(id).resident(); }));
  order_.Open(batch_size());
  stats_.BeginStep();
  return Status::Ok();
}

Status SparseKVCacheManager::Impl::CopySharedPages(std::span<const RequestId> batch,
                                                   std::vector<CopyOnWrite>& copies,
                                                   StreamHandle stream) {
  const int32_t pt = options_.host_page_tokens;
  for (RequestId id : batch) {
    const Request& r = requests_.at(id);
    if (r.cow_page < 0 || EntriesAt(r.tokens + 1, cadence_).completed == kNoEntry) continue;
    const int32_t position = r.seq_len;
    const int32_t index = position / pt;
    const int32_t page = ledger_->SharedPageToCopy(r.owner, index);
    if (page < 0) continue;
    // A request of this batch that copied the page before holds its reference until the step
    // commits; without it, the page may be this request's alone (a fork's parent and child in one
    // batch: the first copies, the other writes in place).
    const auto copied = std::count_if(copies.begin(), copies.end(),
                                      [&](const CopyOnWrite& c) { return c.shared == page; });
    if (pool_->RefCount(page) - copied <= 1) continue;
    // Rows [index * pt, position) of every offloaded layer into the spare, on `stream` before the
    // plan upload, hence before AppendToken forks the write-back of this step's token from it.
    const int32_t rows = position - index * pt;
    for (int32_t l = 0; l < options_.geometry.num_layers(); ++l) {
      if (!Offloaded(l)) continue;
      const int64_t stride = options_.geometry.layers[l].row_stride;
      SPARSEKV_RETURN_IF_ERROR(backend_->CopyAsync(
          pool_->row(l, r.cow_page * pt), pool_->row(l, page * pt), rows * stride, stream));
    }
    // The table holds the copy from here; undone (UndoCopies) if the step is refused.
    pool_->SwapPage(r.owner, index, r.cow_page);
    copies.push_back(CopyOnWrite{r.owner, index, page, r.cow_page});
    SPARSEKV_RETURN_IF_ERROR(UploadPageTable(r, stream));
  }
  return Status::Ok();
}

void SparseKVCacheManager::Impl::UndoCopies(std::span<const CopyOnWrite> copies,
                                            StreamHandle stream) {
  for (const CopyOnWrite& c : copies) {
    pool_->SwapPage(c.owner, c.index, c.shared);
    // The device table is uploaded again from the host's; if that fails too, the device already
    // refuses copies and the error returned is the first one.
    (void)tables_.UploadPageRow(c.owner, pool_->page_table_row(c.owner), stream);
  }
}

Status SparseKVCacheManager::Impl::FillPlan(std::span<const RequestId> batch, StreamHandle stream) {
  const int32_t max_batch = options_.effective_max_batch();
  BatchEntry* entries = plan_.Begin(static_cast<int32_t>(batch.size())).entries;
  for (int32_t b = 0; b < max_batch; ++b) {
    if (b >= static_cast<int32_t>(batch.size())) {
      entries[b] = BatchEntry{-1, 0, 0};
      continue;
    }
    const Request& r = requests_.at(batch[b]);
    // The step's token completes an entry every cadence_ tokens (EntriesAt); only those rows
    // append, at position seq_len.
    int32_t seq_len = r.seq_len;
    if (EntriesAt(r.tokens + 1, cadence_).completed != kNoEntry) {
      const int32_t position = seq_len++;
      plan_.Append(
          b,
          r.resident() ? residency_.ResidentSlot(r, position) : hot_->WindowSlot(r.block, position),
          pool_->HostRow(r.owner, position), keys_.enabled() ? keys_.Word(r, position) : -1);
    }
    entries[b] = BatchEntry{r.block, seq_len, r.owner, r.resident() ? r.owner : kNotResident};
  }
  return plan_.Upload(stream);
}

Status SparseKVCacheManager::Impl::AppendToken(int32_t layer, const StepRows& rows,
                                               StreamHandle stream) {
  SPARSEKV_RETURN_IF_ERROR(order_.CheckLayer(layer, "AppendToken"));
  if (!Offloaded(layer)) return AppendDense(layer, rows, stream);
  const void* new_rows = rows.entries;
  const void* new_keys = rows.keys;
  if (new_rows == nullptr) return InvalidArgument("AppendToken: new_rows is null");
  if (keys_.Keyed(layer) && new_keys == nullptr) {
    return InvalidArgument(
        "AppendToken: new_keys is null (the manager keeps indexer keys of layer " +
        std::to_string(layer) + ")");
  }
  SPARSEKV_RETURN_IF_ERROR(order_.CheckAppend(layer));
  // The raw window first: it checks its pointer, and on an error nothing is written.
  if (dense_ != nullptr) SPARSEKV_RETURN_IF_ERROR(AppendDense(layer, rows, stream));
  const LayerShape shape = options_.geometry.layers[layer];
  const int32_t max_batch = options_.effective_max_batch();
  IndexCopyView to_window{};
  to_window.src = static_cast<const std::byte*>(new_rows);
  to_window.dst = hot_->layer_data(layer);
  to_window.src_index = plan_.append_src_device();
  to_window.dst_index = plan_.append_slot_device();
  to_window.count = plan_.append_count_device();
  to_window.capacity = max_batch;
  to_window.row_bytes = shape.row_stride;
  to_window.src_stride = to_window.dst_stride = shape.row_stride;
  to_window.src_rows = max_batch;
  to_window.dst_rows = hot_->layer_rows();
  to_window.invalid = stats_.invalid_copies();
  // With keys, the row and its key in one operation: they share the append list, and the key
  // words lie in key pages, apart from every window or resident slot.
  if (keys_.Keyed(layer)) {
    const IndexCopyPairView both{
        to_window, keys_.AppendCopy(to_window, shape, new_keys, plan_.append_key_device())};
    SPARSEKV_RETURN_IF_ERROR(backend_->IndexCopyPair(both, stream));
  } else {
    SPARSEKV_RETURN_IF_ERROR(backend_->IndexCopy(to_window, stream));
  }

  // Write-back from the window slot (not from new_rows, which the caller may reuse at once) on
  // the side stream. The slot is next overwritten by the append W steps later, after FinishStep
  // has joined this copy; a resolve can only miss on this token once it has left the window,
  // also after that join.
  IndexCopyView to_host = to_window;
  to_host.src = hot_->layer_data(layer);
  to_host.src_index = to_window.dst_index;
  to_host.src_rows = hot_->layer_rows();
  to_host.dst = pool_->layer_base(layer);
  to_host.dst_index = plan_.append_row_device();
  to_host.dst_rows = pool_->rows();
  SPARSEKV_RETURN_IF_ERROR(backend_->Fork(stream));
  SPARSEKV_RETURN_IF_ERROR(backend_->IndexCopy(to_host, backend_->SideStream()));
  order_.MarkAppended(layer);
  stats_.CountAppend(plan_.append_count(), shape.row_bytes);
  return Status::Ok();
}

IndexerKeyView SparseKVCacheManager::Impl::IndexerKeys(int32_t layer) const {
  return keys_.View(layer, plan_.batch_size_device(), plan_.batch_device());
}

Status SparseKVCacheManager::Impl::ResolveLayer(int32_t layer, const int32_t* topk, int32_t* slots,
                                                uint8_t* fill_mask, StreamHandle stream,
                                                int32_t topk_stride) {
  SPARSEKV_RETURN_IF_ERROR(order_.CheckLayer(layer, "ResolveLayer"));
  SPARSEKV_RETURN_IF_ERROR(CheckOffloaded(layer, "ResolveLayer"));
  SPARSEKV_RETURN_IF_ERROR(order_.CheckResolveLayer(layer));
  if (topk == nullptr || slots == nullptr) {
    return InvalidArgument("ResolveLayer: topk and slots must not be null");
  }
  const int32_t top_k = groups_.LayerTopK(layer);
  if (topk_stride == 0) topk_stride = top_k;
  if (topk_stride < top_k) {
    return InvalidArgument("ResolveLayer: topk_stride " + std::to_string(topk_stride) +
                           " < top_k of layer " + std::to_string(layer) + " (" +
                           std::to_string(top_k) + ")");
  }
  SPARSEKV_RETURN_IF_ERROR(order_.CheckResolveOrder(layer));
  SPARSEKV_RETURN_IF_ERROR(Resolve(layer, topk, top_k, topk_stride, slots, fill_mask,
                                   plan_.StepMissList(layer), stats_.resolve_counters(layer),
                                   /*own_copy=*/true, stream));
  order_.MarkResolved(layer);
  return extensions_.AfterResolve(layer, slots, stream);
}

Status SparseKVCacheManager::Impl::Resolve(int32_t layer, const int32_t* topk, int32_t top_k,
                                           int32_t topk_stride, int32_t* slots, uint8_t* fill_mask,
                                           const MissList& list, ResolveCounters* counters,
                                           bool own_copy, StreamHandle stream) {
  const int32_t max_batch = options_.effective_max_batch();
  ResolveView resolve{};
  resolve.batch_size = plan_.batch_size_device();
  resolve.batch = plan_.batch_device();
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
  resolve.clock_uses = hot_->clock_uses(layer);
  resolve.clock_hand = hot_->clock_hand(layer);
  resolve.position_slot = hot_->position_slot(layer);
  resolve.positions = hot_->replacement().positions;
  resolve.hot_slots = options_.hot_slots;
  resolve.window = options_.window;
  resolve.page_table = tables_.page_table();
  resolve.pages_per_request = pool_->pages_per_owner();
  resolve.page_tokens = options_.host_page_tokens;
  resolve.miss_host_row = list.host_row;
  resolve.miss_slot = list.slot;
  resolve.miss_count = list.count;
  resolve.miss_capacity = own_copy ? plan_.step_list_capacity() : max_batch * top_k;
  resolve.chunk_rows = own_copy ? options_.copy_chunk_rows : 0;
  resolve.chunk_stride = own_copy && options_.copy_chunk_rows > 0 ? plan_.chunk_entries() : 0;
  resolve.counters = counters;
  resolve.fill_mask = fill_mask;
  resolve.sort_misses = options_.sort_misses;
  resolve.sort_min_batch = options_.sort_misses_min_batch;
  resolve.share_duplicates = options_.share_repeated_positions;
  resolve.resident_table = tables_.resident_table();
  resolve.resident_pages = tables_.resident_pages_per_owner();
  resolve.resident_page_rows = hot_->page_rows();
  resolve.block_pages = hot_->block_pages();
  resolve.pages_per_block = hot_->pages_per_block();
  resolve.block_page_rows = hot_->page_rows();
  // A step's resolve may copy its own misses; the list then stays empty. Not where other layers
  // of the group copy from the list.
  if (own_copy && options_.fused_copy_min_batch > 0 && groups_.Size(groups_.Of(layer)) == 1 &&
      !extensions_.active()) {
    const IndexCopyView copy = PoolToHotCopy(*pool_, *hot_, options_.geometry.layers[layer], layer,
                                             list, max_batch * top_k, stats_.invalid_copies());
    resolve.copy_src = copy.src;
    resolve.copy_dst = copy.dst;
    resolve.copy_row_bytes = copy.row_bytes;
    resolve.copy_src_stride = copy.src_stride;
    resolve.copy_dst_stride = copy.dst_stride;
    resolve.copy_src_rows = copy.src_rows;
    resolve.copy_dst_rows = copy.dst_rows;
    resolve.copy_invalid = stats_.invalid_copies();
    resolve.fused_copy_min_batch = options_.fused_copy_min_batch;
  }
  // A resolve with own_copy is the step's, the others are prefetches.
  marks_.Attach(resolve, layer, /*prefetch=*/!own_copy);
  SPARSEKV_RETURN_IF_ERROR(backend_->Resolve(resolve, max_batch, stream));
  return marks_.AfterResolve(layer, /*prefetch=*/!own_copy, stream);
}

namespace {

// A copy grid argument: 0 is the options' grid, a negative one is refused.
Status CheckCopyBlocks(int32_t copy_blocks, const char* op) {
  if (copy_blocks >= 0) return Status::Ok();
  return InvalidArgument(std::string(op) + ": copy_blocks " + std::to_string(copy_blocks) +
                         " is negative (0: the options' grid)");
}

}  // namespace

Status SparseKVCacheManager::Impl::CopyMisses(int32_t layer, StreamHandle stream,
                                              int32_t copy_blocks) {
  SPARSEKV_RETURN_IF_ERROR(order_.CheckLayer(layer, "CopyMisses"));
  SPARSEKV_RETURN_IF_ERROR(CheckCopyBlocks(copy_blocks, "CopyMisses"));
  SPARSEKV_RETURN_IF_ERROR(CheckOffloaded(layer, "CopyMisses"));
  SPARSEKV_RETURN_IF_ERROR(order_.CheckCopyMisses(layer));
  // Every chunk is enqueued before any counts as copied, so that a copy failing part-way leaves
  // the layer uncopied and CopyMisses may be called again (copying the same rows again).
  const int32_t blocks = copy_blocks > 0 ? copy_blocks : options_.copy_blocks;
  for (int32_t c = 0; c < plan_.chunks(); ++c) {
    SPARSEKV_RETURN_IF_ERROR(Copy(layer, plan_.Chunk(plan_.StepMissList(layer), c),
                                  plan_.chunk_entries(), blocks, stream));
  }
  bool copied = false;
  for (int32_t c = 0; c < plan_.chunks(); ++c) copied = order_.MarkChunkCopied(layer, c) || copied;
  return copied ? extensions_.AfterMissCopy(layer, stream) : Status::Ok();
}

Status SparseKVCacheManager::Impl::SkipMissCopy(int32_t layer) {
  SPARSEKV_RETURN_IF_ERROR(order_.CheckLayer(layer, "SkipMissCopy"));
  SPARSEKV_RETURN_IF_ERROR(CheckOffloaded(layer, "SkipMissCopy"));
  if (plan_.can_miss()) {
    return FailedPrecondition("SkipMissCopy: layer " + std::to_string(layer) +
                              ": the step can miss (a request of its batch is in hot-cache mode " +
                              "or an extension is active); CopyMisses copies its misses");
  }
  SPARSEKV_RETURN_IF_ERROR(order_.CheckCopyMisses(layer));
  order_.MarkCopiedWhole(layer);
  return Status::Ok();
}

Status SparseKVCacheManager::Impl::CopyMissChunk(int32_t layer, int32_t chunk, StreamHandle stream,
                                                 int32_t copy_blocks) {
  SPARSEKV_RETURN_IF_ERROR(order_.CheckLayer(layer, "CopyMissChunk"));
  SPARSEKV_RETURN_IF_ERROR(CheckCopyBlocks(copy_blocks, "CopyMissChunk"));
  SPARSEKV_RETURN_IF_ERROR(CheckOffloaded(layer, "CopyMissChunk"));
  SPARSEKV_RETURN_IF_ERROR(order_.CheckCopyMissChunk(layer, chunk));
  return CopyChunk(layer, chunk, copy_blocks, stream);
}

Status SparseKVCacheManager::Impl::CopyChunk(int32_t layer, int32_t c, int32_t copy_blocks,
                                             StreamHandle stream) {
  SPARSEKV_RETURN_IF_ERROR(Copy(layer, plan_.Chunk(plan_.StepMissList(layer), c),
                                plan_.chunk_entries(),
                                copy_blocks > 0 ? copy_blocks : options_.copy_blocks, stream));
  if (!order_.MarkChunkCopied(layer, c)) return Status::Ok();
  return extensions_.AfterMissCopy(layer, stream);
}

Status SparseKVCacheManager::Impl::Copy(int32_t layer, const MissList& list, int32_t capacity,
                                        int32_t max_blocks, StreamHandle stream) {
  // Each extension may hand the next one (and the copy from the pool) a list of its own.
  MissList from_pool = list;
  if (extensions_.active()) {
    SPARSEKV_ASSIGN_OR_RETURN(
        from_pool, extensions_.BeforeCopy(layer, list, capacity, plan_.Lane(list), stream));
  }
  IndexCopyView copy = PoolToHotCopy(*pool_, *hot_, options_.geometry.layers[layer], layer,
                                     from_pool, capacity, stats_.invalid_copies());
  copy.max_blocks = max_blocks;
  copy.strategy = options_.copy_strategy;
  SPARSEKV_RETURN_IF_ERROR(backend_->IndexCopy(copy, stream));
  return extensions_.AfterCopy(layer, stream);
}

Status SparseKVCacheManager::Impl::AssembleLayer(int32_t layer, const int32_t* slots,
                                                 void* assembled, StreamHandle stream) {
  SPARSEKV_RETURN_IF_ERROR(order_.CheckLayer(layer, "AssembleLayer"));
  SPARSEKV_RETURN_IF_ERROR(CheckOffloaded(layer, "AssembleLayer"));
  if (slots == nullptr || assembled == nullptr) {
    return InvalidArgument("AssembleLayer: slots and assembled must not be null");
  }
  SPARSEKV_RETURN_IF_ERROR(order_.CheckAssemble(layer));
  const LayerShape shape = options_.geometry.layers[layer];
  const int32_t max_batch = options_.effective_max_batch();
  AssembleView a{};
  a.batch_size = plan_.batch_size_device();
  a.hot = hot_->layer_data(layer);
  a.hot_rows = hot_->layer_rows();
  a.slots = slots;
  a.out = static_cast<std::byte*>(assembled);
  a.top_k = groups_.LayerTopK(layer);
  a.row_bytes = shape.row_bytes;
  a.stride = shape.row_stride;
  SPARSEKV_RETURN_IF_ERROR(backend_->Assemble(a, max_batch, stream));
  stats_.CountAssemble(plan_.batch().size(), a.top_k, shape.row_bytes);
  return Status::Ok();
}

Status SparseKVCacheManager::Impl::PrefetchLayer(int32_t layer, const int32_t* positions,
                                                 int32_t count, StreamHandle stream) {
  SPARSEKV_RETURN_IF_ERROR(ResolvePrefetch(layer, positions, count, stream));
  return CopyPrefetch(layer, stream, 0);
}

Status SparseKVCacheManager::Impl::ResolvePrefetch(int32_t layer, const int32_t* positions,
                                                   int32_t count, StreamHandle stream) {
  SPARSEKV_RETURN_IF_ERROR(order_.CheckLayer(layer, "PrefetchLayer"));
  SPARSEKV_RETURN_IF_ERROR(CheckOffloaded(layer, "PrefetchLayer"));
  SPARSEKV_RETURN_IF_ERROR(order_.CheckPrefetchLayer(layer));
  if (positions == nullptr) return InvalidArgument("PrefetchLayer: positions is null");
  if (count < 1 || count > options_.max_prefetch) {
    return InvalidArgument("PrefetchLayer: count " + std::to_string(count) + " outside [1, " +
                           std::to_string(options_.max_prefetch) + "] (max_prefetch)");
  }
  SPARSEKV_RETURN_IF_ERROR(order_.CheckResolvePrefetch(layer));
  const MissList& list = plan_.prefetch_list();
  SPARSEKV_RETURN_IF_ERROR(backend_->MemsetAsync(list.count, 0, sizeof(int32_t), stream));
  SPARSEKV_RETURN_IF_ERROR(Resolve(layer, positions, count, count, plan_.prefetch_slots(), nullptr,
                                   list, stats_.prefetch_counters(layer),
                                   /*own_copy=*/false, stream));
  order_.MarkPrefetchResolved(layer);
  plan_.SetPrefetchCount(count);
  return Status::Ok();
}

Status SparseKVCacheManager::Impl::CopyPrefetch(int32_t layer, StreamHandle stream,
                                                int32_t copy_blocks) {
  SPARSEKV_RETURN_IF_ERROR(order_.CheckLayer(layer, "CopyPrefetch"));
  SPARSEKV_RETURN_IF_ERROR(CheckOffloaded(layer, "CopyPrefetch"));
  if (copy_blocks < 0) {
    return InvalidArgument("CopyPrefetch: copy_blocks " + std::to_string(copy_blocks) +
                           " is negative (0: the options' grid)");
  }
  SPARSEKV_RETURN_IF_ERROR(order_.CheckCopyPrefetch(layer));
  if (copy_blocks == 0) {
    copy_blocks =
        options_.prefetch_copy_blocks > 0 ? options_.prefetch_copy_blocks : options_.copy_blocks;
  }
  const int32_t group = groups_.Of(layer);
  for (int32_t l = groups_.First(group); l < groups_.End(group); ++l) {
    SPARSEKV_RETURN_IF_ERROR(
        Copy(l, plan_.prefetch_list(), plan_.prefetch_capacity(), copy_blocks, stream));
  }
  order_.MarkPrefetchCopied();
  return Status::Ok();
}

Status SparseKVCacheManager::Impl::FinishStep(StreamHandle stream) {
  SPARSEKV_RETURN_IF_ERROR(order_.CheckFinish());
  SPARSEKV_RETURN_IF_ERROR(backend_->Join(stream));
  stats_.RecordRunPhase();
  CloseStep();
  return Status::Ok();
}

void SparseKVCacheManager::Impl::CloseStep() {
  // Pages this step filled are complete once its write-back is joined into the main stream,
  // which every later reader of the pool is ordered after.
  for (RequestId id : plan_.batch()) IndexFullPages(requests_.at(id));
  order_.Close();
}

Status SparseKVCacheManager::Impl::FinishReplayedStep() {
  SPARSEKV_RETURN_IF_ERROR(order_.CheckFinishReplayed(stats_.run_phase_recorded()));
  stats_.CountReplayedStep(plan_.batch().size(), plan_.append_count());
  CloseStep();
  return Status::Ok();
}

StatusOr<CacheStats> SparseKVCacheManager::Impl::ReadStats(StreamHandle stream) {
  SPARSEKV_ASSIGN_OR_RETURN(CacheStats s, stats_.Read(stream));
  s.host_pages_total = pool_->total_pages();
  s.host_pages_used = pool_->total_pages() - pool_->free_pages();
  s.hot_blocks_used = hot_->used_blocks();
  s.resident_requests = static_cast<int32_t>(std::count_if(
      requests_.begin(), requests_.end(), [](const auto& it) { return it.second.resident(); }));
  s.device_bytes = device_bytes_ + (dense_ != nullptr ? dense_->bytes() : 0);
  s.pages_shared = pool_->shared_pages();
  s.bytes_saved = pool_->extra_references() * pool_->page_bytes();
  s.retained_conversations = ledger_->retained_conversations();
  s.device_memory = DeviceMemoryByUse();
  s.host_memory = HostMemoryByUse();
  return s;
}

DeviceMemoryUse SparseKVCacheManager::Impl::DeviceMemoryByUse() const {
  const int64_t page_bytes = int64_t{hot_->page_rows()} * entries_.geometry.token_stride_bytes();
  DeviceMemoryUse use;
  for (const auto& [id, r] : requests_) {
    use.resident_rows += static_cast<int64_t>(r.resident_pages.size()) * page_bytes;
    use.indexer_keys += static_cast<int64_t>(r.key_pages.size()) * page_bytes;
  }
  use.hot_cache_rows = int64_t{hot_->used_blocks()} * hot_->pages_per_block() * page_bytes;
  use.free_rows = hot_->free_pages() * page_bytes;
  use.replacement_state = hot_->device_bytes() - hot_->pages() * page_bytes;
  use.tables = tables_.device_bytes();
  use.plan = plan_.device_bytes() + residency_.device_bytes();
  use.counters = stats_.device_bytes() + marks_.device_bytes();
  if (dense_ != nullptr) {
    const DenseMemoryUse dense = dense_->MemoryByUse();
    use.resident_entries = dense.resident_entries;
    use.windows = dense.windows;
    use.tables += dense.tables;
  }
  return use;
}

HostMemoryUse SparseKVCacheManager::Impl::HostMemoryByUse() const {
  const int64_t page_bytes = pool_->page_bytes();
  const PageLedger::RetainedOnly retained = ledger_->RetainedOnlyPages();
  const int64_t used = pool_->total_pages() - pool_->free_pages();
  const int64_t shared = pool_->shared_pages() - retained.shared;
  HostMemoryUse use;
  use.total = pool_->total_pages() * page_bytes;
  use.free_pages = pool_->free_pages() * page_bytes;
  use.retained_pages = retained.pages * page_bytes;
  use.shared_pages = shared * page_bytes;
  use.private_pages = (used - retained.pages - shared) * page_bytes;
  use.node_pool = pool_->is_node_pool();
  for (const auto& [id, entries] : dense_retained_) {
    use.retained_entries += static_cast<int64_t>(entries->host.size());
  }
  return use;
}

Status SparseKVCacheManager::Impl::ResetStats(StreamHandle stream) {
  SPARSEKV_RETURN_IF_ERROR(marks_.Reset(stream));
  return stats_.Reset(stream);
}

StatusOr<int32_t> SparseKVCacheManager::Impl::SequenceLength(RequestId id) const {
  auto it = requests_.find(id);
  if (it == requests_.end()) return NotFound("SequenceLength: " + Describe(id) + " is unknown");
  return it->second.tokens;
}

StatusOr<std::vector<int32_t>> SparseKVCacheManager::Impl::HostPages(RequestId id) const {
  if (const std::vector<int32_t>* pages = ledger_->RetainedPages(id)) return *pages;
  auto it = requests_.find(id);
  if (it == requests_.end()) return NotFound("HostPages: " + Describe(id) + " is unknown");
  const int32_t pages = pool_->ReservedTokens(it->second.owner) / options_.host_page_tokens;
  const std::span<const int32_t> row = pool_->page_table_row(it->second.owner);
  return std::vector<int32_t>(row.begin(), row.begin() + pages);
}

}  // namespace sparsekv
