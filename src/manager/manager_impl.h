// SparseKVCacheManager::Impl: the manager's state and the code behind its public API.
//
// Parts and who owns what:
//   pool_     HostKVPool: every request's KV history (possibly shared with other managers).
//   ledger_   PageLedger: the prefix index, retained conversations, copy-on-write bookkeeping.
//   hot_      HotCache: a block of hot slots plus the window per hot-cache request, in device
//             memory; with hybrid residency its free blocks also hold resident requests' pages.
//   residency_ Residency: where each request's rows live on the device (a block or resident
//             pages), demotion and promotion, and the loads from the host pool they need
//             (residency.h).
//   requests_ the live requests (RequestState, request_state.h): owner (page-table row), block,
//             lengths, ingest state.
//   order_    StepOrder: whether a step is open and what its run phase has done; every call out
//             of order is refused there (step_order.h).
//   plan_     StepPlan: the plan region (host mirror and device copy), the step's batch, the two
//             step miss lists (index groups alternate between them) and the prefetch list
//             (step_plan.h).
//   tables_   DeviceTables: the device page table, residency table and key table, a row per
//             owner (device_tables.h).
//   keys_     IndexerKeyPages: where each request's indexer keys lie in the device memory, and
//             the copies that fill them (indexer_key_pages.h).
//   stats_    Statistics: the host counters, the device resolve and copy counters, and the
//             bytes a replayed step counts (statistics.h).
//   marks_    PrefetchMarks: which hot-cache slots a prefetch filled and no resolve has hit yet,
//             behind the prefetch's precision and recall (prefetch_marks.h).
//   dense_    DenseLayerStore (with resident or window-only layers or a raw window): the resident
//             layers' entries and every layer's raw window of the requests on the device
//             (dense_layer_store.h); the other parts keep a row per offloaded entry of those
//             layers too, unused.
//   extensions_ ExtensionChain: the installed ManagerExtensions (the remote tier's, the peer
//             tier's), in installation order; each one's per-layer hooks run only in steps it
//             declared itself active for at PlanStep (extension_chain.h).
//
// manager.cc creates it and forwards the public API; Impl's own code is lifecycle and
// composition, in three files: manager_impl.cc (creation, request lifecycle, prefix sharing,
// indexer keys, the extension host), manager_step.cc (the decode step's calls, each checked
// by order_ and run over plan_, tables_ and the hot cache) and manager_dense.cc (the layer kinds:
// what dense_ holds, and the refusals of calls it does not serve).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "manager/dense_layer_store.h"
#include "manager/device_tables.h"
#include "manager/extension_chain.h"
#include "manager/indexer_key_pages.h"
#include "manager/page_ledger.h"
#include "manager/prefetch_marks.h"
#include "manager/request_state.h"
#include "manager/residency.h"
#include "manager/statistics.h"
#include "manager/step_order.h"
#include "manager/step_plan.h"
#include "sparsekv/index_groups.h"
#include "sparsekv/manager.h"
#include "sparsekv/manager_extension.h"

namespace sparsekv {

class SparseKVCacheManager::Impl final : public ExtensionHost {
 public:
  Impl(const CacheOptions& options, std::shared_ptr<Backend> backend,
       std::shared_ptr<HostKVPool> pool);
  ~Impl();
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;
  // Creates the host pool unless one was given, and the device state.
  Status Allocate();

  // The public API (manager.h documents it).
  Status Admit(RequestId id, int32_t prompt_len, int32_t max_new_tokens, StreamHandle stream);
  Status IngestPrompt(RequestId id, int32_t layer, const PromptRows& rows, StreamHandle stream);
  Status Release(RequestId id);
  Status Retract(RequestId id);
  Status Resume(RequestId id, StreamHandle stream);
  Status Promote(RequestId id, StreamHandle stream);
  bool IsResident(RequestId id) const {
    auto it = requests_.find(id);
    return it != requests_.end() && it->second.resident();
  }
  StatusOr<int32_t> AdmitWithPrefix(RequestId id, std::span<const int32_t> token_ids,
                                    int32_t max_new_tokens, StreamHandle stream);
  Status IngestPromptSuffix(RequestId id, int32_t layer, const PromptRows& rows,
                            StreamHandle stream);
  Status Fork(RequestId parent, RequestId child, int32_t max_new_tokens, StreamHandle stream);
  Status AdmitSealedPrompt(RequestId id, int32_t owner, uint64_t seal, int32_t max_new_tokens,
                           StreamHandle stream);
  StatusOr<int32_t> Retain(RequestId id);
  int32_t EvictRetained();
  bool IsRetained(RequestId id) const { return ledger_->IsRetained(id); }

  // `token_ids` is null for a step planned without ids.
  Status PlanStep(std::span<const RequestId> batch, const std::span<const int32_t>* token_ids,
                  StreamHandle stream);
  Status AppendToken(int32_t layer, const StepRows& rows, StreamHandle stream);
  StatusOr<DenseEntriesView> DenseEntries(int32_t layer) const;
  StatusOr<RawWindowView> RawWindow(int32_t layer) const;
  Status IngestIndexerKeys(RequestId id, int32_t layer, const void* keys, StreamHandle stream);
  IndexerKeyView IndexerKeys(int32_t layer) const;
  Status ResolveLayer(int32_t layer, const int32_t* topk, int32_t* slots, uint8_t* fill_mask,
                      StreamHandle stream, int32_t topk_stride);
  // copy_blocks 0: the options' grid (copy_blocks).
  Status CopyMisses(int32_t layer, StreamHandle stream, int32_t copy_blocks);
  Status CopyMissChunk(int32_t layer, int32_t chunk, StreamHandle stream, int32_t copy_blocks);
  bool StepCanMiss() const { return plan_.can_miss(); }
  Status SkipMissCopy(int32_t layer);
  Status AssembleLayer(int32_t layer, const int32_t* slots, void* assembled, StreamHandle stream);
  Status PrefetchLayer(int32_t layer, const int32_t* positions, int32_t count, StreamHandle stream);
  Status ResolvePrefetch(int32_t layer, const int32_t* positions, int32_t count,
                         StreamHandle stream);
  // CacheStats::device_memory and host_memory, now.
  DeviceMemoryUse DeviceMemoryByUse() const;
  HostMemoryUse HostMemoryByUse() const;
  // copy_blocks 0: the options' grid for prefetch copies.
  Status CopyPrefetch(int32_t layer, StreamHandle stream, int32_t copy_blocks);
  Status FinishStep(StreamHandle stream);
  Status FinishReplayedStep();

  Status InstallExtension(const ExtensionFactory& make);
  std::vector<ManagerExtension*> extensions() const { return extensions_.all(); }

  StatusOr<CacheStats> ReadStats(StreamHandle stream);
  Status ResetStats(StreamHandle stream);
  StatusOr<int32_t> SequenceLength(RequestId id) const;
  // Unimplemented for `op` at a cadence above one token per entry or with layers dense_ holds
  // (sealed prompts and extensions address pages by token and know only the host pool), else OK.
  Status CheckCadenceOne(const char* op) const;
  StatusOr<std::vector<int32_t>> HostPages(RequestId id) const;
  const std::byte* HotLayer(int32_t layer) const { return hot_->layer_data(layer); }
  int64_t HotLayerRows() const { return hot_->layer_rows(); }
  int32_t batch_size() const { return plan_.batch_size(); }

  // ExtensionHost (manager_extension.h).
  const CacheOptions& options() const override { return options_; }
  Backend& backend() const override { return *backend_; }
  HostKVPool& pool() const override { return *pool_; }
  const HotCache& hot_cache() const override { return *hot_; }
  std::span<const RequestId> batch() const override { return plan_.batch(); }
  int32_t BlockOf(RequestId id) const override { return requests_.at(id).block; }
  int32_t OwnerOf(RequestId id) const override { return requests_.at(id).owner; }
  int32_t LengthOf(RequestId id) const override { return requests_.at(id).seq_len; }
  bool IsLive(RequestId id) const override { return requests_.contains(id); }
  unsigned long long* invalid_copy_counter() const override { return stats_.invalid_copies(); }
  int32_t miss_list_lanes() const override { return plan_.lanes(); }
  int32_t miss_list_lane_capacity() const override { return plan_.lane_capacity(); }
  Status AdmitWithPages(RequestId id, int32_t prompt_len, int32_t max_new_tokens,
                        std::span<const int32_t> shared, StreamHandle stream) override;
  Status CompleteLayer(RequestId id, int32_t layer, StreamHandle stream) override;
  void Drop(RequestId id) override { Forget(id, requests_.at(id)); }

 private:
  using Request = RequestState;

  // ---- Lifecycle (manager_impl.cc) ----
  StatusOr<Request*> Find(RequestId id, const char* op);
  Status UploadPageTable(const Request& r, StreamHandle stream);
  // Admission shared by Admit, AdmitWithPrefix, Fork, AdmitSealedPrompt and AdmitWithPages:
  // checks, makes room, reserves the entries of `tokens` tokens (at least one) with `shared` as
  // the first pages plus `spare_pages`
  // private pages (returned in `spares`), and places the request on the device
  // (Residency::PlaceOnDevice). REQUIRES: the caller holds a reference to every page of `shared`.
  StatusOr<Request*> AdmitShared(RequestId id, int32_t prompt_tokens, int64_t tokens,
                                 std::span<const int32_t> shared, int32_t spare_pages,
                                 std::vector<int32_t>& spares, bool may_be_resident,
                                 StreamHandle stream);
  // Gives back the request's device memory: its block, resident pages and indexer keys.
  void ReleaseDevice(Request& r);
  // Frees what a live request holds (device memory, page references, spare) and forgets it.
  void Forget(RequestId id, Request& r);
  // `window_rows`: the layer's raw-window rows for dense_ (null without them).
  Status Ingest(RequestId id, int32_t layer, const void* rows, const void* window_rows,
                int32_t rows_first, const char* op, StreamHandle stream);
  // Indexes the request's full pages whose token ids are known and KV is complete.
  void IndexFullPages(Request& r);

  // The open step's batch; empty while no step is open.
  std::span<const RequestId> OpenBatch() const {
    return order_.open() ? plan_.batch() : std::span<const RequestId>{};
  }
  bool InOpenStep(RequestId id) const { return order_.open() && plan_.Contains(id); }

  // ---- Layer kinds (manager_dense.cc) ----
  // Creates dense_ if the geometry needs it, and carves its share out of the hot cache's budget
  // (entries_.device_budget_bytes).
  Status AllocateDense();
  // InvalidArgument naming `layer`'s kind if it is not offloaded (`op` has no top-k for it).
  // REQUIRES: layer in range.
  Status CheckOffloaded(int32_t layer, const char* op) const;
  bool Offloaded(int32_t layer) const { return options_.geometry.offloaded(layer); }
  // dense_'s part of Retract and Resume (no-ops without dense_).
  Status RetractDense(RequestId id);
  Status ResumeDense(RequestId id, StreamHandle stream);
  // A retained conversation's resident entries: the host copy of its part of dense_ (what
  // DenseLayerStore::Retract wrote) and the tokens it reserved (the copy's layout).
  struct RetainedEntries {
    std::vector<std::byte> host;
    int64_t reserved_tokens = 0;
  };
  bool HasResidentLayers() const;
  // dense_'s part of Retain: with resident layers, keeps a host copy of the request's memory in
  // dense_retained_ (taken now, or the one Retract took); a no-op otherwise.
  Status RetainDense(RequestId id, const Request& r);
  // dense_'s part of AdmitWithPrefix: with resident layers, cuts `matched` (a prefix match) to
  // the longest prefix whose last page a retained conversation with a host copy holds, and
  // returns that copy (null if there is none: `matched` is then empty). Without resident layers
  // `matched` stays whole and the result is null.
  std::shared_ptr<const RetainedEntries> PrefixEntries(std::vector<int32_t>& matched) const;
  // Forgets the host copies of conversations the ledger no longer retains (evicted).
  void DropEvictedEntries();
  // dense_'s part of a resident or window-only layer's AppendToken, and of an offloaded one's.
  Status AppendDense(int32_t layer, const StepRows& rows, StreamHandle stream);

  // ---- Step (manager_step.cc) ----
  // A copy on write PlanStep made: entry `index` of `owner`'s table holds `spare` (the copy) in
  // place of `shared`, whose reference the step drops once it commits.
  struct CopyOnWrite {
    int32_t owner;
    int32_t index;
    int32_t shared;
    int32_t spare;
  };
  // PlanStep's parts that may fail on the device, before any request changes: copies the shared
  // page each request of `batch` appends into (if it still is shared) into its spare, puts the
  // spare in its table and uploads the table, adding each copy to `copies`.
  Status CopySharedPages(std::span<const RequestId> batch, std::vector<CopyOnWrite>& copies,
                         StreamHandle stream);
  // Puts the shared pages of `copies` back in their tables (a refused step).
  void UndoCopies(std::span<const CopyOnWrite> copies, StreamHandle stream);
  // Writes the plan of `batch` (each request one token longer than it is) and uploads it.
  Status FillPlan(std::span<const RequestId> batch, StreamHandle stream);
  // Ends the open step (after its write-back is joined): indexes the pages it filled.
  void CloseStep();
  // Resolves [max_batch, top_k] positions against `layer`'s replacement state into `list`; with
  // `own_copy` (a step's resolve) the rows may copy their own misses instead
  // (CacheOptions::fused_copy_min_batch).
  Status Resolve(int32_t layer, const int32_t* topk, int32_t top_k, int32_t topk_stride,
                 int32_t* slots, uint8_t* fill_mask, const MissList& list,
                 ResolveCounters* counters, bool own_copy, StreamHandle stream);
  // Copies `list` (of `capacity` entries) from the host pool into `layer`'s rows on a grid of at
  // most `max_blocks` blocks (0: the whole GPU), between the active extensions' BeforeCopy and
  // AfterCopy.
  Status Copy(int32_t layer, const MissList& list, int32_t capacity, int32_t max_blocks,
              StreamHandle stream);
  // Copies `layer`'s chunk c and marks the layer copied once every chunk of the batch is.
  Status CopyChunk(int32_t layer, int32_t c, int32_t copy_blocks, StreamHandle stream);

  CacheOptions options_;
  // The offloaded layers' cadence r (LayerShape::entry_tokens), and the options in entry units,
  // which the parts are sized and addressed in: a request of n tokens holds floor(n / r) entries,
  // a row of the host pool and a slot of the hot cache each; max_context and
  // host_capacity_tokens count entries (at r = 1, options_ itself). In entries_, every layer is
  // an offloaded layer of cadence r (the parts know no other kind) and raw_window is 0.
  const int32_t cadence_;
  CacheOptions entries_;
  // Which layers share a top-k, and each group's top-k.
  const IndexGroups groups_;
  std::shared_ptr<Backend> backend_;
  std::shared_ptr<HostKVPool> pool_;
  std::unique_ptr<HotCache> hot_;
  std::unordered_map<RequestId, Request> requests_;
  std::unique_ptr<PageLedger> ledger_;
  // The installed extensions, and those active in the open step.
  ExtensionChain extensions_;

  // The step: what its plan phase wrote (the plan region, the batch, the miss lists), and
  // whether it is open and what its run phase has done (every order the API forbids is refused
  // there).
  StepPlan plan_;
  StepOrder order_;

  // The device page, residency and key tables.
  DeviceTables tables_;
  // Where the indexer keys live, and the copies that fill them.
  IndexerKeyPages keys_;

  int64_t device_bytes_ = 0;  // of the hot cache and every part

  // The host and device counters, and the bytes a replayed step counts.
  Statistics stats_;
  // The prefetched slots not yet hit, per index group (with a prefetch configured).
  PrefetchMarks marks_;

  // Placement on the device, demotion and promotion, and the loads they need.
  Residency residency_;

  // Resident entries and raw windows; null when the geometry has neither. A retracted request's
  // part of it waits in dense_retracted_ (DenseLayerStore::Retract's host copy).
  std::unique_ptr<DenseLayerStore> dense_;
  std::unordered_map<RequestId, std::vector<std::byte>> dense_retracted_;
  // The retained conversations' resident entries (with resident layers), by conversation; an
  // admission that shares a prefix holds the copy it restores from while it may evict.
  std::unordered_map<RequestId, std::shared_ptr<const RetainedEntries>> dense_retained_;
};

}  // namespace sparsekv
