// SparseKVCacheManager: the request lifecycle and the per-step entry points of sparsekv.
//
// Every request's complete KV history lives in the HostKVPool; a small HotCache block per request
// lives in device memory. At every decode step and layer, the engine's top-k positions are
// resolved against the hot cache: hits are used in place, misses are copied in from the host pool,
// and the caller gets, per top-k entry, a layer-wide slot of the hot cache (see hot_cache.h).
//
// A decode step has two phases:
//   plan (host side, between steps; may allocate and synchronise):
//     PlanStep(batch, stream) -> fixes the batch composition and the newest token of every
//     request, and writes them into fixed device buffers.
//   run (device side; enqueues only: no allocation, no host synchronisation, no shape that
//   depends on data, so that it can be captured into a CUDA graph once and replayed), every
//   call on the same stream:
//     for each layer: AppendToken(layer, new_rows, stream), then
//     RunLayer(layer, topk, slots, assembled, stream); then FinishStep(stream).
//     (A resident or window-only layer, DeepSeek-V4's, is only appended, with StepRows; its
//     attention reads DenseEntries / RawWindow. See Create, "Layer kinds".)
// Run-phase calls in an order that would read or copy the wrong rows are refused with
// FailedPrecondition and change nothing (each call says which orders it refuses); what only the
// device could check (stream ordering, the contents of device buffers) is not checked.
// A graph captured over the run phase stays valid for every later step whose batch has at most
// max_batch requests: the batch size and table are read from device memory at run time. (A run
// phase that calls SkipMissCopy is valid only for steps that cannot miss: see there.)
//
// Hybrid residency (CacheOptions::hybrid_residency): a request admitted while the hot cache has
// room for its whole reservation is resident: every row of its history is in HBM (in resident
// pages carved from the hot cache's blocks), its top-k map straight to rows and nothing is ever
// missed, evicted or copied in. When an admission needs a hot-cache block that no free memory
// holds, resident requests are demoted to hot-cache mode, the one holding the most pages first
// (ties: the lowest id): the host pool already holds their whole history, so demotion copies
// nothing out; their new block is seeded from the pool with their most recent rows (the window
// and the hot_cache slots before it). Resident and hot-cache requests mix freely in one step and
// one captured graph (the batch table says which is which). Promote() brings a request back.
// Forked children, requests admitted from a sealed prompt, remote-backed requests and requests
// resumed without room are in hot-cache mode. See docs/residency.md.
//
// Host pages are reference-counted and may be shared between requests (a common prompt, the next
// turn of a conversation, forked branches) and retained conversations that have no device state;
// see "Shared prefixes and retained conversations" below and docs/prefix-sharing.md. The hot
// cache stays private per request: sharing changes nothing in the run phase.
//
// Node-level sharing: several managers (one per GPU of a machine) may share one HostKVPool
// (HostKVPool::CreateShared, Create with a pool). Each keeps its own hot cache, device page
// table, prefix index and retained conversations and takes its page-table rows (owners) from the
// pool; pages are never shared between managers, so that nothing one stores is ever overwritten
// by another. See docs/scale-out.md.
//
// Thread safety: not thread-safe. One thread drives a manager (managers sharing a pool may be
// driven by different threads at once); its run-phase calls must be
// enqueued on one stream (the side stream for write-back is internal), and so must the lifecycle
// calls that take a stream, because they read and copy host pages that earlier steps wrote.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <span>
#include <vector>

#include "sparsekv/backend.h"
#include "sparsekv/host_kv_pool.h"
#include "sparsekv/hot_cache.h"
#include "sparsekv/kernel_views.h"
#include "sparsekv/manager_extension.h"
#include "sparsekv/node_pool.h"
#include "sparsekv/options.h"
#include "sparsekv/status.h"
#include "sparsekv/types.h"

namespace sparsekv {

// Statistics since creation or the last ResetStats(). Formulas are in the comments.
struct LayerStats {
  uint64_t hits = 0;           // top-k positions found in an LRU slot
  uint64_t window_hits = 0;    // top-k positions served by the newest-token window
  uint64_t misses = 0;         // top-k positions copied from the host pool
  uint64_t padding = 0;        // -1 entries
  uint64_t duplicates = 0;     // repeated positions within one top-k row (skipped)
  uint64_t out_of_range = 0;   // positions outside [0, seq_len) (skipped)
  uint64_t resident_hits = 0;  // top-k positions of resident requests (hybrid residency)
  // hit_rate = (hits + window_hits + resident_hits) / (that + misses); 0 if no lookups.
  double hit_rate() const;
};

// The counters the manager accumulates on the host. CacheStats holds them as they are (ReadStats
// copies the struct, ResetStats sets it to {}): a new counter is a field here and the line that
// adds to it.
struct HostCounters {
  // Rows loaded into HBM outside the run phase, * row_bytes: the window rows of a hot-cache
  // request at ingest, resume, fork and sealed admission; every row of a resident request's
  // prompt at ingest (from the caller's rows) and at resume (from the host pool, only for the
  // layers ingested so far); the rows demotion and promotion load. CacheStats::
  // bytes_host_to_device adds the miss and prefetch copies (device counters) to it.
  uint64_t bytes_host_to_device = 0;
  // bytes_device_to_host = appended tokens * row_bytes (write-back of the newest token).
  uint64_t bytes_device_to_host = 0;
  // bytes_assembled = assembled rows * row_bytes (device to device).
  uint64_t bytes_assembled = 0;
  // bytes_ingested = prompt rows * row_bytes written into the host pool.
  uint64_t bytes_ingested = 0;

  // Prefix sharing. A page's holders are the page tables of live requests and the retained
  // conversations that reference it (copy-on-write spares are private pages).
  uint64_t prefix_lookup_tokens = 0;  // prompt tokens of successful AdmitWithPrefix calls
  uint64_t prefix_hit_tokens = 0;     // of those, tokens found in the pool (not ingested)
  uint64_t copy_on_write_pages = 0;   // shared, partially filled pages copied before an append
  // Retained conversations evicted (least recently used first) to make room for an admission,
  // and the pages those evictions freed (a page that another holder still references is not).
  uint64_t evictions = 0;
  uint64_t evicted_pages = 0;

  // Hybrid residency: resident requests demoted to hot-cache mode to make room for an
  // admission, and hot-cache requests promoted (Promote). Rows a demotion loads into the new
  // block and a promotion loads into resident pages count in bytes_host_to_device.
  uint64_t demotions = 0;
  uint64_t promotions = 0;
};

// The device memory a manager holds, by use, now, in bytes; the parts add up to
// CacheStats::device_bytes. The hot cache's memory is pages of resident_page_rows rows in every
// layer, which move between resident requests, hot-cache blocks and indexer keys.
struct DeviceMemoryUse {
  int64_t resident_rows = 0;      // pages of resident requests (hybrid residency)
  int64_t hot_cache_rows = 0;     // pages of the hot-cache blocks in use
  int64_t indexer_keys = 0;       // pages of indexer keys
  int64_t free_rows = 0;          // pages no one holds
  int64_t replacement_state = 0;  // every block's LRU state and page list (fixed)
  int64_t tables = 0;             // the page, residency and key tables (fixed)
  int64_t plan = 0;      // the plan region, miss, prefetch and residency load lists (fixed)
  int64_t counters = 0;  // the device statistics counters (fixed)
  // Resident layers' entries (LayerKind::kResident) of the requests on the device.
  int64_t resident_entries = 0;
  // Raw windows (CacheOptions::raw_window) of every layer of the requests on the device.
  int64_t windows = 0;
  int64_t sum() const {
    return resident_rows + hot_cache_rows + indexer_keys + free_rows + replacement_state + tables +
           plan + counters + resident_entries + windows;
  }
};

// The host pool by use, now, in bytes of pages (host_page_tokens * token_stride_bytes each, over
// the offloaded layers); the
// parts add up to total. Of the whole pool when it is shared with other managers or processes
// (their pages count as private or shared as their holders make them).
struct HostMemoryUse {
  int64_t total = 0;
  int64_t private_pages = 0;   // one holder that is not a retained conversation of this manager
  int64_t shared_pages = 0;    // more than one holder (shared prefixes, forks), not only retained
  int64_t retained_pages = 0;  // held only by this manager's retained conversations (evictable)
  int64_t free_pages = 0;
  bool node_pool = false;  // the pool is a node pool: its memory is a shared-memory segment
  // Outside the pool, so in neither total nor sum(): the host copies this manager keeps of its
  // retained conversations' part of the resident layers' store (DeepSeek-V4; 0 without resident
  // layers): retained_entries = sum over retained conversations of the bytes the store held for
  // them, sum over resident layers of pages * page_rows * row_stride plus, with a raw window,
  // sum over layers of raw_window * row_stride (DenseLayerStore's layout).
  int64_t retained_entries = 0;
  int64_t sum() const { return private_pages + shared_pages + retained_pages + free_pages; }
};

// Statistics since creation or the last ResetStats(): the host counters, the device counters
// (read at ReadStats) and gauges marked "now".
struct CacheStats : HostCounters {
  std::vector<LayerStats> layers;  // one per layer
  LayerStats total;                // sum over layers
  // bytes_host_to_device (above) = sum over layers of misses * row_bytes, plus prefetched rows *
  // row_bytes, plus window rows loaded at ingest and resume.
  uint64_t invalid_copy_entries = 0;  // IndexCopy entries skipped as out of bounds
  int32_t host_pages_used = 0;        // now: of the whole pool, also when it is shared
  int32_t host_pages_total = 0;
  int32_t hot_blocks_used = 0;    // now: blocks in hot-cache mode
  int32_t resident_requests = 0;  // now: requests in resident mode (hybrid residency)
  // Device memory held by the manager: hot cache, replacement state, page table, plan buffers,
  // and (resident or window-only layers, a raw window) the resident entries and raw windows of
  // the requests on the device now, which come and go with them, and their tables.
  int64_t device_bytes = 0;
  DeviceMemoryUse device_memory;  // now: device_bytes by use
  HostMemoryUse host_memory;      // now: the host pool by use

  int32_t pages_shared = 0;  // now: pages with more than one holder (whole pool)
  // now: bytes_saved = sum over pages of (holders - 1) * page_tokens * token_stride_bytes, the
  // page copies that private histories would store in addition.
  int64_t bytes_saved = 0;
  int32_t retained_conversations = 0;  // now

  // Prefetch (PrefetchLayer), counted once per index group: positions looked up, and of those
  // the rows fetched (not resident). Their bytes are in bytes_host_to_device.
  uint64_t prefetch_lookups = 0;
  uint64_t prefetch_rows = 0;
  // What became of the prefetched rows, counted on the device with a prefetch configured
  // (CacheOptions::max_prefetch > 0; ResolveView::prefetch_mark in kernel_views.h), once per index
  // group like prefetch_rows, and the same under every eviction policy:
  //   prefetch_useful_rows = prefetched rows that a step's resolve (ResolveLayer) hit before any
  //                          resolve took their slot;
  //   prefetch_wasted_rows = prefetched rows whose slot a resolve or a later prefetch took before
  //                          any step's resolve hit it;
  //   prefetch_missed_rows = misses of the step resolves that followed a prefetch of their group
  //                          (one since the group's previous step resolve): the rows the group
  //                          needed that the prefetch did not bring.
  // prefetch_rows >= useful + wasted: the rest are prefetched rows not yet hit or evicted, rows
  // of requests that left the hot cache (released, retracted, made resident) before a hit, and
  // positions a prefetch found no free slot for. ResetStats clears the marks, so that a row
  // prefetched before it counts in neither.
  uint64_t prefetch_useful_rows = 0;
  uint64_t prefetch_wasted_rows = 0;
  uint64_t prefetch_missed_rows = 0;
  // prefetch_precision = prefetch_useful_rows / prefetch_rows (0 with no prefetched row): the
  // share of the rows fetched ahead that a resolve used.
  double prefetch_precision() const {
    return prefetch_rows == 0 ? 0.0 : static_cast<double>(prefetch_useful_rows) / prefetch_rows;
  }
  // prefetch_recall = prefetch_useful_rows / (prefetch_useful_rows + prefetch_missed_rows) (0 when
  // both are 0): of the rows that prefetched groups' resolves needed from the host, the share the
  // prefetch had already brought (the replay's "hidden fraction", docs/prefetch.md).
  double prefetch_recall() const {
    const uint64_t needed = prefetch_useful_rows + prefetch_missed_rows;
    return needed == 0 ? 0.0 : static_cast<double>(prefetch_useful_rows) / needed;
  }
};

// One layer's rows of a decode step, for AppendToken. Each is [max_batch, row_stride(layer)]
// (keys: [max_batch, indexer_key_bytes]), row b for the b-th request of the batch, in host or
// device memory, read on the stream of the call.
struct StepRows {
  // The entry the step's token completes (LayerShape::entry_tokens): an offloaded or resident
  // layer's; only the rows of requests that complete an entry in this step are read. Not read
  // for a window-only layer.
  const void* entries = nullptr;
  // The indexer keys of that entry, for a layer that keeps keys (else not read).
  const void* keys = nullptr;
  // The step's token's raw row, into the layer's raw window; required when raw_window > 0.
  const void* window = nullptr;
};

// One layer's prompt rows for IngestPrompt, in host or device memory, valid until the stream
// reaches the copies.
struct PromptRows {
  // [floor(prompt_len / r), row_stride(layer)]: the prompt's entries of an offloaded or resident
  // layer of cadence r (null if it has none; not read for a window-only layer).
  const void* entries = nullptr;
  // [min(prompt_len, raw_window), row_stride(layer)]: the prompt's newest raw rows, oldest first;
  // required when raw_window > 0.
  const void* window = nullptr;
};

class SparseKVCacheManager {
 public:
  // Validates `options` (ValidateOptions) and allocates the host pool, the hot cache and the fixed
  // device buffers of the run phase. An offloaded layer's top-k (LayerShape::top_k),
  // its index group (LayerShape::index_group, or layers_per_index) and whether it keeps indexer
  // keys (LayerShape::indexer_keys) may differ per layer, as GLM-5.3's do: a group resolves its
  // own top-k once, on its first layer, and only keyed layers take and show keys. All offloaded
  // layers gain an entry every LayerShape::entry_tokens = r tokens (1: a row per token): the
  // manager then counts entries (Admit says where), sizes the host pool and its max_context in
  // entries (host_capacity_tokens / r rows), and refuses with Unimplemented, at r > 1,
  // AdmitSealedPrompt, InstallExtension and a shared pool (they address or size pages in
  // tokens). Prefix sharing and retained conversations are served: a host page of
  // host_page_tokens entries covers r * host_page_tokens tokens, whose ids key it.
  //
  // Layer kinds (DeepSeek-V4): resident layers (LayerKind::kResident, their own cadence) keep
  // every entry in device memory, and with raw_window > 0 every layer keeps a ring of its newest
  // raw_window raw rows; both live in a store of their own (per request, reserved at admission
  // for the request's reserved tokens), read through DenseEntries and RawWindow. Window-only
  // layers (kWindowOnly) hold their raw window only. Such layers are appended (AppendToken with
  // StepRows) and ingested (IngestPrompt with PromptRows) like the others but never resolved:
  // ResolveLayer, RunLayer, CopyMisses, CopyMissChunk, AssembleLayer and the prefetch calls
  // refuse them with InvalidArgument naming the kind. With device_budget_bytes > 0, the store's
  // share (max_requests requests of max_context tokens, and its tables) is carved out of the
  // budget before the hot cache is sized; the store's memory does not move to and from the hot
  // cache. The host pool and the hot cache hold rows (and replacement state) for the offloaded
  // layers only (KVGeometry::token_stride_bytes), with the model's layer indices. With such layers
  // or a raw window, AdmitSealedPrompt, InstallExtension and a shared pool are refused with
  // Unimplemented; AdmitWithPrefix and Retain are served (they say how). A geometry with no
  // offloaded layer is refused (CheckServedGeometry in options.h).
  static StatusOr<std::unique_ptr<SparseKVCacheManager>> Create(const CacheOptions& options,
                                                                std::shared_ptr<Backend> backend);
  // As above, with the host pool `pool` shared with other managers (HostKVPool::CreateShared, or
  // a node pool shared with other processes: node_pool.h) instead of a pool of its own. The
  // pool's geometry, page size, capacity and max_context must match `options` (InvalidArgument
  // otherwise), and a CUDA manager's pool must have been allocated (a node pool: attached) with a
  // CUDA backend (InvalidArgument otherwise). options.max_host_requests bounds this manager's
  // live requests (retracted ones included), and the pool's owners those of all its managers
  // together, so that no manager takes another's share of owners. The device page table has a
  // row per owner of the pool. Admissions evict only this manager's retained conversations and fail
  // with ResourceExhausted, changing nothing, if the pool is short of pages that other managers
  // hold (one that loses a race for pages to another manager may have evicted some of its own
  // retained conversations first). Under CUDA, the pool's host memory must be portable (any
  // HostMemoryKind but kCudaVmm). The destructor releases what the manager holds in the pool.
  static StatusOr<std::unique_ptr<SparseKVCacheManager>> Create(const CacheOptions& options,
                                                                std::shared_ptr<Backend> backend,
                                                                std::shared_ptr<HostKVPool> pool);
  ~SparseKVCacheManager();
  SparseKVCacheManager(const SparseKVCacheManager&) = delete;
  SparseKVCacheManager& operator=(const SparseKVCacheManager&) = delete;

  // ---- Lifecycle (host side) ----

  // Reserves host pages for prompt_len + max_new_tokens tokens and a hot-cache block. With
  // layers of entry_tokens r (LayerShape), a request of n tokens holds floor(n / r) entries: the
  // host pages, the hot cache, the batch table (BatchEntry::seq_len), the top-k and the indexer
  // keys count entries, and SequenceLength counts tokens.
  // AlreadyExists for a known id (live or retained); OutOfRange if the length exceeds
  // max_context; ResourceExhausted if the hot cache or the pool's owners are all in use, or the
  // host pool is full even after evicting every retained conversation (nothing changes then).
  Status Admit(RequestId id, int32_t prompt_len, int32_t max_new_tokens, StreamHandle stream);
  // Writes the prompt KV of one layer into the host pool and its newest `window` rows into the
  // hot cache. `rows` is [floor(prompt_len / entry_tokens), row_stride(layer)] (the prompt's
  // entries; null if it has none) in host or device memory and must stay
  // valid until `stream` reaches the copies; rows of positions found by AdmitWithPrefix are
  // skipped (the pool's shared copy is kept). Every layer must be ingested before the request
  // joins a step. Errors: NotFound unless the request is live (admitted, not released);
  // InvalidArgument for a bad layer or null rows; AlreadyExists for a layer ingested already;
  // FailedPrecondition for a retracted request.
  Status IngestPrompt(RequestId id, int32_t layer, const void* rows, StreamHandle stream);
  // The same with the layer's raw-window rows beside its entries (required with a raw window, and
  // the only form that ingests a resident or window-only layer's rows; see PromptRows). Also
  // InvalidArgument for a null pointer that has rows to give.
  Status IngestPrompt(RequestId id, int32_t layer, const PromptRows& rows, StreamHandle stream);
  // Frees the request's host pages (drops its references to shared ones) and hot-cache block, or
  // drops the retained conversation `id`. NotFound for an unknown or released id.
  // FailedPrecondition for a request of the open step. REQUIRES (not checked: stream ordering): no
  // enqueued step that includes the request is still running on the device.
  Status Release(RequestId id);
  // Gives back the request's hot-cache block but keeps its history in the host pool, to free HBM
  // under pressure. A retracted request cannot join a step until Resume(). With resident entries
  // or raw windows (Create, "Layer kinds"), those are copied to host memory the manager keeps, on
  // the default stream, and the call waits for the copy. REQUIRES (not checked: stream ordering):
  // no enqueued work on another stream still writes them (synchronise the steps' stream first).
  Status Retract(RequestId id);
  // Takes a hot-cache block again (ResourceExhausted if none is free) and reloads the window;
  // with hybrid residency, makes the request resident if its pages fit, loading its whole
  // history from the host pool, or demotes resident requests for a block as Admit does.
  Status Resume(RequestId id, StreamHandle stream);

  // ---- Indexer keys (CacheOptions::indexer_key_bytes > 0) ----
  //
  // The manager keeps every live request's indexer keys in its device memory, in pages it shares
  // with the KV rows, so that memory moves between keys, resident KV and hot caches as the batch
  // changes. Keys live only in HBM: a retracted request keeps them, a forked child gets a copy of
  // its parent's, and a request admitted with a shared prefix is given all its prompt's keys.

  // Writes the prompt's indexer keys of one layer. `keys` is [prompt entries, indexer_key_bytes]
  // (one key per entry: per token at entry_tokens 1; null if the prompt holds no entry) in
  // host or device memory, every prompt position (a shared prefix's too), and must stay valid
  // until `stream` reaches the copies. Every keyed layer's keys (LayerShape::indexer_keys: all
  // layers by default, GLM-5.3's groups' first layers) must be ingested before the request joins
  // a step (a forked child has its parent's). Errors: FailedPrecondition without indexer keys;
  // NotFound unless the request is live; InvalidArgument for a bad layer, a layer without keys or
  // null keys; AlreadyExists for a layer ingested already.
  Status IngestIndexerKeys(RequestId id, int32_t layer, const void* keys, StreamHandle stream);
  // Where an indexer kernel reads the keys of `layer` (device memory) for the planned step's
  // batch; the view stays valid for the manager's lifetime (captured graphs may keep it), while
  // the pages it names change with admissions, between steps. With indexer_key_bytes = 0, or for
  // a layer without keys, every pointer is null.
  IndexerKeyView IndexerKeys(int32_t layer) const;

  // ---- Hybrid residency (host side, between steps) ----

  // Makes a hot-cache request resident again: takes its pages, loads its whole history from the
  // host pool on `stream` and gives back its block. Errors: NotFound; FailedPrecondition without
  // hybrid_residency, for a retracted or remote-backed request, one in the open step, one
  // resident already, or one whose prompt is not yet ingested in every layer (its history is
  // not complete in the pool); ResourceExhausted if its pages are not free (nothing is demoted
  // for it).
  Status Promote(RequestId id, StreamHandle stream);
  // Whether `id` is a live request in resident mode.
  bool IsResident(RequestId id) const;

  // ---- Shared prefixes and retained conversations (host side) ----
  //
  // Full host pages are indexed by the token ids they hold (a hash chain over pages, verified on
  // every hit), once their KV is complete in every layer. Admissions share the pages of the
  // longest indexed prefix; a request appending into a page it shares first copies it (copy on
  // write), so that nothing another holder references is ever overwritten. Admissions (Admit,
  // AdmitWithPrefix, Fork) that find the pool short of pages evict retained conversations, least
  // recently used first, and fail with ResourceExhausted (evicting nothing) only if evicting all
  // of them would not make room.

  // Admit for a prompt of token_ids.size() tokens whose longest prefix of full pages already in
  // the pool is shared instead of stored again. Returns `cached`, the prompt tokens [0, cached)
  // found (a multiple of the tokens a page covers, host_page_tokens * entry_tokens; less than the
  // prompt length; 0 on a miss); only the entries of [cached, prompt_len) are ingested, with
  // IngestPromptSuffix (or IngestPrompt). A prefix that was evicted is a miss, never stale.
  // With resident layers (Create, "Layer kinds"), a prefix is shared only as far as a retained
  // conversation holds it (the one holding its last page): that conversation's host copy of its
  // resident entries gives the new request the prefix's floor(cached / r) entries of each
  // resident layer, at admission; a prefix that only live requests hold is not shared. The raw
  // windows always come from the caller's ingestion (PromptRows::window: the prompt's newest
  // rows). Errors as Admit; nothing changes on error.
  StatusOr<int32_t> AdmitWithPrefix(RequestId id, std::span<const int32_t> token_ids,
                                    int32_t max_new_tokens, StreamHandle stream);
  // IngestPrompt for a request admitted with AdmitWithPrefix: `rows` is
  // [floor((prompt_len - cached) / entry_tokens), row_stride(layer)], the entries of
  // tokens [cached, prompt_len); null if there are none. (IngestPrompt takes all the prompt's
  // entries and skips the cached ones.)
  Status IngestPromptSuffix(RequestId id, int32_t layer, const void* rows, StreamHandle stream);
  // The same with the layer's raw-window rows (required with a raw window, and the only form
  // for a resident or window-only layer): `rows.entries` holds the entries past the prefix, of
  // an offloaded layer as above and of a resident layer of cadence r its entries
  // [floor(cached / r), floor(prompt_len / r)) (the ones before were restored at admission);
  // `rows.window` the prompt's newest min(prompt_len, raw_window) raw rows, as IngestPrompt.
  Status IngestPromptSuffix(RequestId id, int32_t layer, const PromptRows& rows,
                            StreamHandle stream);
  // Admits `child` with all of `parent`'s history (KV and token ids) shared, and room for
  // max_new_tokens more: an agent branch. The child gets its own hot-cache block, whose window is
  // loaded from the pool on `stream`; it can join a step at once. A partially filled last page
  // stays shared until the first of them appends into it; the copy it will need is reserved now,
  // so appends never fail for lack of pages. The parent may be retracted (its history is in the
  // pool, its indexer keys in HBM). Errors: NotFound (parent), AlreadyExists (child),
  // FailedPrecondition (parent not fully ingested or in the open step), OutOfRange
  // (parent length + max_new_tokens > max_context), ResourceExhausted as Admit.
  Status Fork(RequestId parent, RequestId child, int32_t max_new_tokens, StreamHandle stream);
  // Admits `id` with the prompt that owner `owner` of this manager's host pool sealed as `seal`
  // (HostKVPool::Seal: by a writer in this process or, in a node pool, in another one; see
  // node_pool.h), and room for max_new_tokens more. The request's page table takes the sealed
  // pages (one reference each: they outlive the writer's release) and its prompt is complete in
  // every layer at once: nothing is ingested or copied but the window into the hot cache, on
  // `stream`; it can join a step at once and runs as any request does. A partially filled last
  // page stays shared until the request appends into it (copy on write; the spare is reserved
  // now). The request is in hot-cache mode (as forked children are). Errors: NotFound if the
  // seal has ended (released, sealed again, or its writer died and was reclaimed); InvalidArgument
  // for a bad owner or max_new_tokens < 0; as Admit otherwise. Nothing changes on error.
  Status AdmitSealedPrompt(RequestId id, int32_t owner, uint64_t seal, int32_t max_new_tokens,
                           StreamHandle stream);
  // Ends a request like Release, but keeps the full pages of its history whose token ids are
  // known (the ids of every token their entries cover) in the pool as the retained conversation
  // `id`: no device state, still indexed, so that
  // a later AdmitWithPrefix (the next turn) shares them. Returns the tokens retained (0: nothing
  // was, as for Release). Release(id) drops the conversation; eviction may drop it at any time.
  // With resident layers, the request's resident entries are kept too, in host memory the
  // manager holds until the conversation is released or evicted (the copy Retract takes, taken
  // now unless the request is retracted; the call waits for it, as Retract does, with the same
  // REQUIRES). Errors: NotFound, FailedPrecondition (in the open step).
  StatusOr<int32_t> Retain(RequestId id);
  // Evicts every retained conversation; returns how many there were.
  int32_t EvictRetained();
  bool IsRetained(RequestId id) const;

  // ---- Plan (host side, between steps) ----

  // Fixes the next step's batch: each request gains one token (its position is the request's
  // current length), whose KV the run phase appends. Errors: empty or oversized batch,
  // duplicate, unknown, retracted or not fully ingested requests, a request at its reserved
  // length, or a previous step not finished; and the backend's error for a copy that fails on
  // the device. Every check is made for the whole batch before anything changes, and the device
  // work (copies on write, page-table rows, the plan upload) is undone if a later part fails, so
  // that a refused step changes nothing: every request's length, pages and token ids, the
  // statistics and the memory figures are as before, and no step is open. Enqueues the upload of
  // the plan on `stream`, after the copy on write of any shared page a request appends into.
  Status PlanStep(std::span<const RequestId> batch, StreamHandle stream);
  // As above, and token_ids[b] is the id of the token whose KV batch[b] appends in this step
  // (InvalidArgument unless token_ids.size() == batch.size()). A request whose ids are known from
  // position 0 on (AdmitWithPrefix, Fork) keeps them, so that its pages can be shared once full;
  // a step planned without ids ends that for the requests of its batch.
  Status PlanStep(std::span<const RequestId> batch, std::span<const int32_t> token_ids,
                  StreamHandle stream);
  // The same with braced lists (`PlanStep({1, 2}, stream)`), which a span does not take.
  Status PlanStep(std::initializer_list<RequestId> batch, StreamHandle stream);
  Status PlanStep(std::initializer_list<RequestId> batch, std::initializer_list<int32_t> token_ids,
                  StreamHandle stream);

  // ---- Run (device side; graph-capturable) ----

  // Stores the newest token's KV of `layer` for every request of the step: into its window slot
  // (in place) and, on a side stream, into the host pool (write-back). `new_rows` is
  // [max_batch, row_stride(layer)], row b for the b-th request of the batch. With indexer keys
  // in `layer` (indexer_key_bytes > 0 and LayerShape::indexer_keys), `new_keys` ([max_batch,
  // indexer_key_bytes]) holds the newest token's keys, stored next to the others (it is ignored
  // otherwise). Must precede RunLayer(layer) in the step. Errors: FailedPrecondition outside a
  // step or for a layer appended already; InvalidArgument for a bad layer, null new_rows, or
  // null new_keys for a layer with keys.
  Status AppendToken(int32_t layer, const void* new_rows, StreamHandle stream);
  Status AppendToken(int32_t layer, const void* new_rows, const void* new_keys,
                     StreamHandle stream);
  // The same with the step's raw-window rows (StepRows): the form for a geometry with a raw
  // window or resident or window-only layers. A resident layer's entries go to its device pages
  // (DenseEntries), every layer's window row to its raw window (RawWindow); an offloaded layer's
  // entries as above. InvalidArgument also for a null `window` with raw_window > 0 or null
  // `entries` for a resident layer.
  Status AppendToken(int32_t layer, const StepRows& rows, StreamHandle stream);
  // Views of the planned step (kernel_views.h), valid until the next PlanStep: a resident layer's
  // entries of every batch row (DenseEntriesView::Count(b) = floor(tokens / r)), and any layer's
  // raw window (RawWindowView::Valid(b) = min(tokens, raw_window) rows, oldest first), read in
  // place in device memory. Rows appended in the step are there once `stream` reaches that
  // AppendToken. FailedPrecondition without resident layers or a raw window (RawWindow: without
  // a raw window); InvalidArgument for a layer out of range or, for DenseEntries, not resident.
  StatusOr<DenseEntriesView> DenseEntries(int32_t layer) const;
  StatusOr<RawWindowView> RawWindow(int32_t layer) const;
  // Resolves `topk` ([max_batch, topk_stride] int32 positions, -1 = padding; rows past the
  // batch are ignored) against the hot cache of `layer`, copies the misses in, and writes
  // `slots` ([max_batch, top_k] int32 layer-wide slots, -1 = skipped entry). If `assembled` is
  // not null, also gathers the selected rows into it ([max_batch, top_k, row_stride(layer)];
  // skipped entries are zero rows). top_k is the layer's own (LayerShape::top_k, else
  // CacheOptions::top_k: IndexGroups::LayerTopK); topk_stride 0 means top_k.
  // RunLayer is ResolveLayer + CopyMisses + AssembleLayer (if `assembled` is not null) on one
  // stream, with their errors; in an index group of several layers (layers_per_index > 1 or
  // LayerShape::index_group), only for the group's first layer, and the group's other layers call
  // CopyMisses (and AssembleLayer) themselves.
  Status RunLayer(int32_t layer, const int32_t* topk, int32_t* slots, void* assembled,
                  StreamHandle stream, int32_t topk_stride = 0);

  // The parts of RunLayer, for engines that overlap the miss copy with other work.
  //
  // ResolveLayer resolves `topk` for `layer`'s index group (IndexGroups, index_groups.h)
  // and writes `slots` as RunLayer does, and if `fill_mask` is not null, fill_mask[b * top_k + k]
  // = 1 where the row of slots[b, k] arrives with the group's miss copy, else 0 ([max_batch,
  // top_k] uint8, device memory). Rows with fill_mask 0 are readable once `stream` reaches the
  // resolve; the others once CopyMisses(layer) has run. The slots are layer-wide and the same
  // for every layer of the group, each indexing its own HotLayer.
  // Index groups resolve once each and in order within a step, and group g + 2 only after every
  // layer of group g has had its CopyMisses (it reuses group g's miss list). Errors:
  // FailedPrecondition outside a step, for a layer that is not the first of its group or not
  // appended in this step, a group resolved already, one whose previous group is not resolved,
  // or group g + 2 before group g's copies; InvalidArgument for a bad layer, null topk or slots,
  // or 0 < topk_stride < top_k. Not checked: the contents of topk (any value is accepted;
  // entries out of range are skipped).
  Status ResolveLayer(int32_t layer, const int32_t* topk, int32_t* slots, uint8_t* fill_mask,
                      StreamHandle stream, int32_t topk_stride = 0);
  // Copies the misses of the ResolveLayer of `layer`'s group in this step into `layer`'s rows, on
  // `stream`, which must be ordered after that resolve. Once per layer and step, in any order;
  // a layer need not be appended first (a layer's copy may run ahead of its turn, e.g. all of a
  // group's copies right after its resolve, on a side stream). Errors: FailedPrecondition outside
  // a step, before the group's resolve in this step, or for a layer copied already (group g + 2's
  // resolve, which reuses the miss list, waits for every copy of group g, so the list a first
  // copy reads is always its own group's); InvalidArgument for a bad layer. A copy that fails on
  // the device leaves the layer uncopied (CopyMisses may be called again).
  // REQUIRES (not checked: stream ordering): every copy of group g is complete on the device
  // before the resolve of group g + 2 runs.
  Status CopyMisses(int32_t layer, StreamHandle stream);
  // CopyMisses on a grid of `copy_blocks` thread blocks (> 0; CUDA only, the CPU backend ignores
  // it) instead of CacheOptions::copy_blocks', e.g. copies that run beside other layers' work
  // (step_schedule.h's planned copy); 0: the options' grid. InvalidArgument below 0.
  Status CopyMisses(int32_t layer, StreamHandle stream, int32_t copy_blocks);
  // With copy_chunk_rows = R: copies the misses of batch rows [chunk R, (chunk + 1) R) of the
  // resolve of `layer`'s group, on `stream`, so that attention over those rows may start before
  // the other chunks are copied. A layer is copied whole (CopyMisses) or by chunks, once each; it
  // counts as copied (for FinishStep and the list's reuse by group g + 2) once every chunk that
  // holds a row of the batch (chunk < ceil(batch / R)) is. Errors as CopyMisses, and
  // FailedPrecondition without copy_chunk_rows, InvalidArgument for a chunk outside
  // [0, ceil(max_batch / R)).
  Status CopyMissChunk(int32_t layer, int32_t chunk, StreamHandle stream);
  // CopyMissChunk on a grid of `copy_blocks` thread blocks, as CopyMisses above.
  Status CopyMissChunk(int32_t layer, int32_t chunk, StreamHandle stream, int32_t copy_blocks);
  // Whether the planned step's resolves can find a miss: false when every request of its batch is
  // resident and no extension is active in it (no miss list entry can be made). Host side, from
  // PlanStep on.
  bool StepCanMiss() const;
  // In a step that cannot miss (StepCanMiss() false), counts `layer` as copied, as CopyMisses
  // would, without enqueuing anything: CopyMisses would launch a copy of an empty list. This is a
  // decision of the host recorded in the run phase: a graph captured with SkipMissCopy replays
  // correctly only for steps that cannot miss either, so an engine keys those graphs apart
  // (StepSchedule does: such a step's choice is StepChoice::resident). Errors: as CopyMisses, and
  // FailedPrecondition in a step that can miss (nothing is marked).
  Status SkipMissCopy(int32_t layer);
  // Gathers the rows of `slots` ([max_batch, top_k], as ResolveLayer wrote them) of `layer`
  // into `assembled` ([max_batch, top_k, row_stride(layer)]; skipped entries are zero rows).
  // May run before CopyMisses(layer) (then only the rows with fill 0 are meaningful) and more
  // than once. Errors: FailedPrecondition outside a step, before the group's resolve in this step
  // or before AppendToken(layer); InvalidArgument for a bad layer or null pointers. Not checked:
  // that `slots` holds what this step's resolve wrote.
  Status AssembleLayer(int32_t layer, const int32_t* slots, void* assembled, StreamHandle stream);

  // Cross-step prefetch: brings `positions` ([max_batch, count] int32 per request of the step's
  // batch, -1 = padding; out-of-range and repeated entries are skipped) into the hot cache of
  // `layer`'s index group for a later step, as a resolve of them would (they become the most
  // recently used; rows not resident take LRU victims and are copied on `stream`). Counted in
  // CacheStats::prefetch_*, not in the layer's hit and miss counts. It may run before the group's
  // resolve in the step, or after it once every layer of the group has had its CopyMisses.
  // Errors: FailedPrecondition outside a step, for a layer that is not the first of its group, or
  // after the group's resolve but before all of its copies; InvalidArgument for a bad layer, null
  // positions or count outside [1, max_prefetch].
  // REQUIRES (not checked: stream ordering): `stream` is ordered after every read of this group's
  // rows in the step (a victim may be a row the step used), and the group's next resolve is
  // ordered after this call's copies.
  Status PrefetchLayer(int32_t layer, const int32_t* positions, int32_t count, StreamHandle stream);
  // The parts of PrefetchLayer, for engines that copy on another stream than they resolve on:
  // ResolvePrefetch decides (on `stream`) which of `positions` become resident and where, as
  // PrefetchLayer does, with the same checks; CopyPrefetch copies those rows into every layer of
  // the group on its own stream. One prefetch is pending at a time: ResolvePrefetch refuses
  // (FailedPrecondition) while an earlier one has no CopyPrefetch, CopyPrefetch without one
  // pending. REQUIRES (not checked: stream ordering): the copy's stream is ordered after the
  // resolve, and the group's later reads of those rows (its attention) and its later miss copies
  // (CopyMisses: a victim may be a prefetched slot) are ordered after the copy.
  Status ResolvePrefetch(int32_t layer, const int32_t* positions, int32_t count,
                         StreamHandle stream);
  Status CopyPrefetch(int32_t layer, StreamHandle stream);
  // CopyPrefetch on a grid of `copy_blocks` thread blocks (> 0; CUDA only, the CPU backend
  // ignores it) instead of CacheOptions::prefetch_copy_blocks', e.g. a schedule measuring which
  // grid pays (step_schedule.h); 0: the options' grid. InvalidArgument below 0.
  Status CopyPrefetch(int32_t layer, StreamHandle stream, int32_t copy_blocks);
  // Ends the step: joins the write-back side stream into `stream`. FailedPrecondition (the step
  // stays open) outside a step, or unless every layer was appended, every index group resolved and
  // every layer copied in it.
  Status FinishStep(StreamHandle stream);
  // Host side, after replaying a captured run phase for a step planned with PlanStep: closes the
  // step as the captured calls did at capture time (they are not re-executed on the host) and
  // applies their byte accounting to the new batch. FailedPrecondition outside a step, if no
  // complete run phase (one that FinishStep ended) was ever recorded, if AppendToken ran on the
  // host in this step (that step ends with FinishStep), or if a prefetch the host resolved in
  // this step has no CopyPrefetch; a refusal counts nothing and leaves the step open. REQUIRES
  // (not checked: the host cannot see a graph): the graph was captured from a complete run phase
  // of this manager and has been launched.
  Status FinishReplayedStep();

  // ---- Extensions (manager_extension.h) ----
  //
  // An extension stands in for some miss rows: the remote tier's (remote_tier.h:
  // AttachRemoteTier installs it) reads rows over a transport, the peer tier's (peer_tier.h:
  // AttachPeerTier) from another GPU's memory. A manager may have several; their hooks run in
  // installation order. An extension's per-layer hooks run only in steps whose batch it declares
  // active at PlanStep; a step no extension is active in is unchanged and graph-capturable.

  // Installs the extension `make` returns (given this manager's ExtensionHost) after those
  // installed before; `make`'s error otherwise. FailedPrecondition while a step is open. The
  // manager owns it.
  Status InstallExtension(const ExtensionFactory& make);
  // The installed extensions, in installation order.
  std::vector<ManagerExtension*> extensions() const;

  // ---- Introspection ----

  // Synchronises `stream` and reads the device counters.
  StatusOr<CacheStats> ReadStats(StreamHandle stream);
  // Synchronises `stream` and zeroes every counter.
  Status ResetStats(StreamHandle stream);
  // Tokens with KV of a known request; NotFound otherwise.
  StatusOr<int32_t> SequenceLength(RequestId id) const;
  // The host pages of a live request or retained conversation, in position order (page i holds
  // positions [i * host_page_tokens, (i + 1) * host_page_tokens)); NotFound otherwise.
  StatusOr<std::vector<int32_t>> HostPages(RequestId id) const;
  // Layer `layer` of the hot cache, [HotLayerRows(), row_stride(layer)]: what the slots returned
  // by RunLayer index. Null for a resident or window-only layer, which has no rows there.
  const std::byte* HotLayer(int32_t layer) const;
  // Rows of every HotLayer: blocks * (hot_slots + window), the blocks being max_requests, or as
  // many as device_budget_bytes holds (ChooseHotCacheShape).
  int64_t HotLayerRows() const;
  int32_t batch_size() const;
  // The options, with hot_slots as chosen (ChooseHotCacheShape) when it was 0.
  const CacheOptions& options() const;
  const HostKVPool& host_pool() const;
  Backend& backend() const;

 private:
  class Impl;
  explicit SparseKVCacheManager(std::unique_ptr<Impl> impl);

  std::unique_ptr<Impl> impl_;  // the state and the code: src/manager/manager_impl.h
};

// SparseKVCacheManager::AdmitSealedPrompt(id, prompt.owner, prompt.seal, max_new_tokens,
// stream): admits `id` with its prompt in the pages `prompt` sealed in the manager's host pool
// (by this or another process; node_pool.h); nothing is copied but the window into the hot cache.
// NotFound if the seal has ended (released, or its writer died): recompute the request.
inline Status AdmitFromNodePool(SparseKVCacheManager& manager, RequestId id,
                                const NodePoolPrompt& prompt, int32_t max_new_tokens,
                                StreamHandle stream) {
  return manager.AdmitSealedPrompt(id, prompt.owner, prompt.seal, max_new_tokens, stream);
}

}  // namespace sparsekv
