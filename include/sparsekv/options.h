// Geometry of the KV cache and the options of a SparseKVCacheManager.
//
// Options are plain structs with documented defaults. They are validated once, by
// ValidateOptions() (called by SparseKVCacheManager::Create), which returns a clear error for
// anything inconsistent; after that the library trusts them.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "sparsekv/kernel_views.h"
#include "sparsekv/kv_format.h"
#include "sparsekv/status.h"

namespace sparsekv {

// Where a layer's entries live (docs/deepseek-v4.md, "The design").
enum class LayerKind {
  // In the host pool, with a hot cache of `hot_slots` in HBM, read through a top-k: every layer
  // of DeepSeek-V3.2 and GLM-5, DeepSeek-V4's CSA layers.
  kOffloaded,
  // Every entry in HBM, read whole at every step, never copied: DeepSeek-V4's HCA layers (one
  // entry per 128 tokens; a step reads them all, so a hot cache would have to hold them all).
  kResident,
  // No entries, only the raw window (CacheOptions::raw_window): DeepSeek-V4's window-only layers.
  kWindowOnly,
};
// "kOffloaded", "kResident" or "kWindowOnly": the name error messages give a layer's kind.
const char* LayerKindName(LayerKind kind);

// One attention layer: its rows and where they live. Every field but the row's size defaults to
// what the manager serves today (an offloaded layer with a row per token, the options' top_k, the
// uniform index groups of layers_per_index, indexer keys if the options keep them);
// CheckServedGeometry says which geometries SparseKVCacheManager accepts.
struct LayerShape {
  int32_t row_bytes = 656;   // meaningful bytes per row (DeepSeek-V3.2 fp8: 656; bf16: 1152)
  int32_t row_stride = 656;  // bytes between consecutive rows, >= row_bytes (e.g. 656 -> 704)
  LayerKind kind = LayerKind::kOffloaded;
  // Tokens per entry (r >= 1): the layer gains entry c when token (c + 1) * r - 1 is appended, so
  // a request of n tokens has floor(n / r) entries (EntryCount, kernel_views.h). DeepSeek-V4: 4
  // (CSA) or 128 (HCA); 1 for a row per token. Ignored for kWindowOnly.
  int32_t entry_tokens = 1;
  // Entries per top-k row of an offloaded layer; 0: CacheOptions::top_k. DeepSeek-V4: 512 or
  // 1024. Must be 0 for other kinds.
  int32_t top_k = 0;
  // What the row's bytes are, for attention and the oracle; unset: rows the library never
  // decodes. If set, row_bytes must be KVRowBytes(*format).
  std::optional<KVRowFormat> format = std::nullopt;
  // The layers that share one top-k, named by the group's first layer; -1: from
  // CacheOptions::layers_per_index. GLM-5.3: 0, 1, 2, 2, 2, 2, 6, 6, 6, 6, ... Set on every
  // offloaded layer or on none; -1 on layers of other kinds.
  int32_t index_group = -1;
  // Whether the manager holds this layer's indexer keys (CacheOptions::indexer_key_bytes each,
  // when that is > 0): GLM-5.3 only on the first layer of each group, DeepSeek-V4 only on CSA
  // layers. Offloaded layers only.
  bool indexer_keys = true;
};

struct KVGeometry {
  std::vector<LayerShape> layers;  // one entry per attention layer

  int32_t num_layers() const { return static_cast<int32_t>(layers.size()); }
  // Sum of row_bytes over all layers: the meaningful KV bytes of one token.
  int64_t token_bytes() const;
  // Sum of row_stride over the kOffloaded layers: the bytes one row (an entry of every offloaded
  // layer) occupies in the host pool, and one hot-cache slot over all layers. Resident and
  // window-only layers have no row in either (DenseLayerStore holds them); for a geometry whose
  // every layer is offloaded this is the sum over all layers.
  int64_t token_stride_bytes() const;
  // The offloaded layers' cadence r (their LayerShape::entry_tokens, one for all of them,
  // ValidateOptions): a row of the host pool and a hot-cache slot hold one entry, r tokens, so a
  // host pool of host_capacity_tokens holds host_capacity_tokens / r rows. 1 if no layer is
  // offloaded.
  int32_t offloaded_entry_tokens() const;
  // The row_stride of the first kOffloaded layer (0 if none): with indexer keys, which share
  // the hot cache's pages, every offloaded layer's (ValidateOptions).
  int32_t offloaded_row_stride() const;
  // Whether layer `layer` is kOffloaded: has rows in the host pool and the hot cache.
  // REQUIRES: 0 <= layer < num_layers().
  bool offloaded(int32_t layer) const { return layers[layer].kind == LayerKind::kOffloaded; }

  // Every layer has the same row. row_stride == 0 means row_stride = row_bytes.
  static KVGeometry Uniform(int32_t num_layers, int32_t row_bytes, int32_t row_stride = 0);
};

// A model's shape (docs/workload-shapes.md has the presets and where their figures come from).
struct ModelPreset {
  std::string name;        // one of PresetNames()
  int32_t num_layers = 0;  // attention layers: 61, 78; DeepSeek-V4: 44 or 62 (MTP included)
  int32_t row_bytes = 0;   // the row (entry) of every layer: 656 (fp8) or 1152 (bf16); V4: 584
  int32_t indexer_key_bytes = 0;  // 132 B per entry and keyed layer (128 fp8 + fp32 scale), in HBM
  int32_t top_k = 0;              // 2048; DeepSeek-V4: its offloaded (CSA) layers', 512 or 1024
  // Every layer: its kind, cadence, top-k, index group, keys and format (num_layers entries).
  std::vector<LayerShape> layers;
  int32_t raw_window = 0;  // CacheOptions::raw_window: DeepSeek-V4 128, 0 for the DSA models
  // The standard scenario: the model's weights per GPU of an 8-GPU node (GB, 1e9 B), from which
  // the HBM left for KV follows (141 - weights - 8 on an H200); 0 where the preset does not say
  // (the tools then use DeepSeek-V3.2's 84 GB).
  double weights_per_gpu_gb = 0;

  KVGeometry geometry() const { return KVGeometry{layers}; }
  // Layers of `kind` (of those, `keyed` only: with indexer keys).
  int32_t layers_of(LayerKind kind, bool keyed = false) const;
};
// The names FindPreset knows: "deepseek-v3.2", "glm-5", "deepseek-v4-flash", "deepseek-v4-pro",
// "glm-5.3".
const std::vector<std::string>& PresetNames();
// The preset `name` with rows of `format`. NotFound for a name not in PresetNames();
// InvalidArgument for a format the model does not have (DeepSeek-V4's entries are kFp8Entry584
// or kMxfp4Entry368; the DSA models' rows are kFp8Row656 or kBf16Row1152).
StatusOr<ModelPreset> FindPreset(const std::string& name, KVRowFormat format);
// The preset in its fp8 format: kFp8Row656 for the DSA models, kFp8Entry584 for DeepSeek-V4.
StatusOr<ModelPreset> FindPreset(const std::string& name);

// OK if SparseKVCacheManager serves `options`' layers today: at least one offloaded layer (all
// offloaded layers of one cadence, entry_tokens, as ValidateOptions requires), besides which
// resident and window-only layers and a raw window are served (DeepSeek-V4), as are per-layer
// top_k, explicit index groups and indexer keys on some layers only (GLM-5.3). Unimplemented for
// a geometry with no offloaded layer. Some calls are still refused for geometries with resident
// or window-only layers or a raw window (SparseKVCacheManager, "Layer kinds").
// SparseKVCacheManager::Create calls it after ValidateOptions; tools that drive a manager call it
// on a preset's geometry() and raw_window.
Status CheckServedGeometry(const KVGeometry& geometry, int32_t raw_window);

// How a request's hot slots are replaced (ResolveView in kernel_views.h defines each exactly;
// docs/planning.md has the replayed hit rates that chose the default).
enum class EvictionPolicy {
  kLru,           // least recently used slot first
  kSegmentedLru,  // segmented LRU: slots hit again are protected; new fills are evicted first
  kClock,         // a clock over use counts: a resolve in O(top_k), not O(hot_slots), for the
                  // hit rate of kSegmentedLru
};

struct CacheOptions {
  KVGeometry geometry;

  // ---- Behaviour ----
  // Positions selected per request and layer at every decode step.
  int32_t top_k = 2048;
  // Replaceable hot slots per request and layer, in HBM. Must be >= top_k so that any
  // step's misses always find a victim, and at most kMaxHotSlots (kernel_views.h). 0: chosen from
  // device_budget_bytes (ChooseHotCacheShape in hot_cache.h).
  int32_t hot_slots = 4096;
  // HBM for the hot cache, in bytes (rows and replacement state; the manager's small plan
  // buffers, and with max_prefetch > 0 the prefetch's marks, a byte per slot of every block and
  // index group, come on top). 0: exactly max_requests blocks of hot_slots. Otherwise the hot cache
  // takes as many blocks as fit, at least max_requests, and with hot_slots = 0 each block has the
  // most slots with which max_requests blocks fit: the budget spent on the batch the host pool
  // allows, since slots are the cheapest bandwidth there is.
  int64_t device_budget_bytes = 0;
  // Hybrid residency: a request admitted while the hot cache has room for its whole reservation
  // keeps its whole KV in HBM (resident mode: its top-k map straight to rows, nothing is ever
  // missed or evicted); when an admission needs the room, resident requests are demoted to
  // hot-cache mode (SparseKVCacheManager, "Hybrid residency"). false: every request is in
  // hot-cache mode.
  bool hybrid_residency = false;
  // Indexer keys kept by the manager: bytes per position and layer (DeepSeek-V3.2's indexer: 132,
  // 128 fp8 + an fp32 scale), or 0 for an engine that keeps its own. The manager then holds every
  // live request's keys in its device memory, in pages shared with the KV rows (HotCache), so
  // that HBM moves between keys, resident KV and hot caches as the batch changes, as it would in
  // an engine that keeps everything in HBM. The engine's indexer reads them through
  // SparseKVCacheManager::IndexerKeys; IngestIndexerKeys and AppendToken write them. They live
  // only in HBM: kept through Retract, copied by Fork, ingested again for every prompt position
  // (a shared prefix included). Requires a multiple of 4, and one row_stride, a multiple of 4,
  // for every offloaded layer (the keys share its hot-cache pages; resident and window-only
  // layers may have any stride).
  int32_t indexer_key_bytes = 0;
  // The newest `window` tokens of each request are always resident, in `window` extra slots per
  // request and layer (beyond hot_slots), and are never evicted.
  int32_t window = 1;
  // Tokens of uncompressed history that every layer attends besides its entries (DeepSeek-V4's
  // raw window: 128), held as a ring of raw_window rows of the layer's row_bytes per request and
  // layer; 0: none. Not `window`: that is the newest entries of the same history kept in the hot
  // cache, this is a second history beside the entries.
  int32_t raw_window = 0;
  // Replacement of the hot slots. The clock's resolve does not grow with hot_slots (its state
  // adds 4 bytes per max_context position and block) and it keeps the hit rate of segmented LRU
  // (within 0.11 points on a real model's trace and the calibrated workload), +0.1 to +1.2 points
  // over LRU (docs/resolve.md). Segmented LRU kept +1.2 points over LRU at hot_slots = 2 x top_k
  // on the trace.
  EvictionPolicy eviction = EvictionPolicy::kClock;
  // kSegmentedLru: the protected part holds at most hot_slots * protected_percent / 100 slots
  // (rounded down); in [0, 100].
  int32_t protected_percent = 80;
  // Host pool size in tokens. The pool holds a row (an entry of every offloaded layer,
  // KVGeometry::token_stride_bytes) per KVGeometry::offloaded_entry_tokens() = r tokens:
  // host_capacity_tokens / r rows, in pages of host_page_tokens rows. Required.
  int64_t host_capacity_tokens = 0;
  // Requests that may hold a hot-cache block at once (admitted and not retracted). Required.
  int32_t max_requests = 0;
  // Requests that may hold host pages at once (admitted, retracted ones included).
  // 0 means max_requests; otherwise >= max_requests.
  int32_t max_host_requests = 0;
  // Largest batch of one decode step. 0 means max_requests.
  int32_t max_batch = 0;
  // Largest prompt + generated length of one request. Required.
  int32_t max_context = 0;
  // Host rows are given to requests in pages of this many tokens.
  int32_t host_page_tokens = 64;
  // Consecutive layers that share one top-k (models whose indexer serves several layers,
  // "IndexShare"). Layers [g * n, (g + 1) * n) form index group g (the last group may be
  // shorter); they share one replacement state, so the group's first layer resolves the top-k and
  // every layer of the group copies the same misses into its own rows
  // (SparseKVCacheManager::ResolveLayer / CopyMisses). 1: every layer has its own top-k.
  // Must be 1 where the layers name their groups (LayerShape::index_group).
  int32_t layers_per_index = 1;
  // The number of index groups: from the layers' index_group if they name them, else from
  // layers_per_index (IndexGroups, index_groups.h, has the groups themselves).
  int32_t index_groups() const;
  // The index groups whose layers are kOffloaded: the replacement states the hot cache keeps per
  // block (a group of resident or window-only layers never resolves). index_groups() when every
  // layer is offloaded.
  int32_t offloaded_index_groups() const;
  // A top-k row may repeat a position, and repeats share its slot (instead of being skipped as
  // duplicates). For several query tokens per step (speculative / MTP decoding): concatenate the
  // T tokens' selections into one row of top_k = T * k entries; each missed row is fetched once.
  bool share_repeated_positions = false;

  // ---- Performance ----
  // Sort each request's miss list by host address before copying (translation locality), in
  // steps of at least sort_misses_min_batch requests. Sorting costs the resolve about 6 us per
  // layer at any batch; it pays only once the step's misses are more than the copy keeps in
  // flight at once. Measured on an H200 (32K context, 20% misses, DeepSeek-V3.2 rows): not
  // sorting gains 0.1-0.4 ms per step at batch 1-16 and sorting gains 0.2-0.8 ms at 32-64
  // (bench/results/2026-11-30-overlap, docs/overlap.md). 0: every step; sort_misses = false: never.
  bool sort_misses = true;
  int32_t sort_misses_min_batch = 32;
  // Positions per request and layer that one PrefetchLayer call may take (its device buffers
  // are sized for max_batch * max_prefetch entries). 0: no prefetch. With a prefetch, the
  // resolves also count what became of the prefetched rows (CacheStats::prefetch_useful_rows and
  // the rest, over a byte per hot slot of every block and index group).
  int32_t max_prefetch = 0;
  // Largest grid of the miss and prefetch copies (CopyMisses, PrefetchLayer), in blocks of 256
  // threads; 0: as many as the GPU holds resident (4 per SM). A copy from host memory is bound by
  // PCIe latency and bandwidth, not by SMs: on an H200, 16 blocks copy at 89-99% of the whole
  // GPU's rate and leave the other SMs to the kernels the copy runs beside. Set 16 when copies
  // run ahead on a side stream (a shared indexer's later layers, prefetch): with one top-k per 4
  // layers that hid 60-77% of the transfer time at batch 4-64, against 4-10% on the default grid.
  // Copies on the critical path gain nothing from it below batch 64 (0.1-0.35 ms per step
  // slower), hence the default (bench/results/2026-11-30-overlap-copy-blocks, docs/overlap.md).
  // CUDA only.
  int32_t copy_blocks = 0;
  // The same bound for the prefetch copies alone (PrefetchLayer, CopyPrefetch), which run ahead
  // of their turn beside other work while the miss copies wait on the critical path: e.g. the
  // whole GPU for the miss copies (copy_blocks = 0) and 16 blocks for a cross-layer prefetch.
  // 0: copy_blocks. CUDA only.
  int32_t prefetch_copy_blocks = 0;
  // Rows per page of the device memory with hybrid residency or indexer keys (HotCache): a
  // resident request takes ceil(reserved / resident_page_rows) pages, a hot-cache block
  // ceil((hot_slots + window) / resident_page_rows), a request's indexer keys
  // ceil(reserved / keys per page). Smaller pages waste less at a request's end (at most a page
  // per request) and cost larger page tables. With hybrid_residency or indexer keys: in
  // [1, hot_slots + window].
  int32_t resident_page_rows = 64;

  // In steps of at least this many requests, each request's resolve copies its own misses (the
  // CTA that resolved the row, right after taking the victims), so that early rows' copies overlap
  // later rows' resolves and CopyMisses has nothing left to do; below it the resolve emits the
  // miss list and CopyMisses copies it on the whole grid. 0: never. Only for index groups of one
  // layer (a group's other layers need the list) and steps without an extension (the remote tier
  // reads the list). Measured on an H200 (32K context, 20% misses, 656-B rows; docs/resolve.md):
  // equal at batch 48-64, 4% faster at 80, 17% at 100; in a whole step at batch 59, 4% slower (its
  // resolve holds an SM per request while it copies). CUDA only.
  int32_t fused_copy_min_batch = 80;
  // Batch rows per copy chunk: with R > 0, the misses of rows [c R, (c + 1) R) of a step form
  // chunk c, which CopyMissChunk copies on its own, so that an engine can attend over a chunk's
  // rows while the next chunk is still being copied (a pipelined layer). 0: one miss list.
  int32_t copy_chunk_rows = 0;
  // How CopyMisses and PrefetchLayer move their rows (IndexCopyView::strategy). CUDA only.
  CopyStrategy copy_strategy = CopyStrategy::kLattice;

  int32_t effective_max_batch() const { return max_batch > 0 ? max_batch : max_requests; }
  int32_t effective_max_host_requests() const {
    return max_host_requests > 0 ? max_host_requests : max_requests;
  }
  // Slots per request and layer in the hot cache: hot_slots + window.
  int32_t slots_per_request() const { return hot_slots + window; }
  // kSegmentedLru: the protected part's capacity in slots.
  int32_t protected_capacity() const {
    return static_cast<int32_t>(int64_t{hot_slots} * protected_percent / 100);
  }
};

// Checks every field and their combinations; the message names the field and the rule.
Status ValidateOptions(const CacheOptions& options);

}  // namespace sparsekv
