// The arithmetic of the end-to-end benchmark, free of any device: what each way of holding the KV
// keeps in HBM and host memory per request, the largest batch a budget admits, the batch sizes a
// sweep runs, and the floor a measured step is compared with (docs/benchmark.md). Pure functions,
// unit-tested on the CPU.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "sparsekv/options.h"
#include "sparsekv/status.h"

namespace sparsekv {

// The ways of holding a batch's KV that `sparsekv bench` compares on the GPU.
enum class KVVariant {
  kFullHbm,   // every token of every request resident in HBM (the baseline offloading must beat)
  kSparseKV,  // the manager: host pool + per-request hot cache, misses copied in per step
  kNoCache,   // host pool only: all top-k rows of every layer fetched from the host at every step
  // host pool + per-request HBM page cache: misses fetched as whole pages
  // (tools/sparsekv/bench/page_offload.h)
  kPageOffload,
};
// "full-hbm", "sparsekv", "no-cache", "page-offload"
std::string_view VariantName(KVVariant variant);
StatusOr<KVVariant> ParseVariant(std::string_view name);

// Layers of one kind and shape, for a model whose layers differ (DeepSeek-V4's CSA, HCA and
// window-only layers, GLM-5.3's layers with and without indexer keys; docs/deepseek-v4.md,
// "Sizing").
struct LayerClass {
  LayerKind kind = LayerKind::kOffloaded;
  int32_t layers = 0;
  int32_t entry_tokens = 1;   // r: a request of T tokens holds floor(T / r) entries per layer
  int32_t entry_bytes = 656;  // s: an entry's stride
  int32_t top_k = 0;          // offloaded: entries selected per step
  int32_t keyed_layers = 0;   // of `layers`, those with indexer keys (one key per entry)
  int32_t index_groups = 0;   // offloaded: the groups (replacement states) these layers form
};
// `preset`'s layers by class: layers of one kind, cadence, stride and top-k (0: preset.top_k)
// form one class, in the order of their first layer. Keys: the layers with
// LayerShape::indexer_keys, if the preset has keys. Groups: index_group == the layer itself, or
// every layer where index_group is -1 (one top-k per layer).
std::vector<LayerClass> LayerClassesOf(const ModelPreset& preset);

// The shape of one decoding request.
struct RequestShape {
  int32_t layers = 61;
  int32_t row_bytes = 656;          // KV row per token and layer (also its stride)
  int32_t indexer_key_bytes = 132;  // per token and layer; kept in HBM by every variant
  int32_t top_k = 2048;
  int32_t hot_slots = 4096;          // sparsekv: LRU slots per layer
  int32_t window = 1;                // sparsekv: newest-token slots per layer
  int32_t page_tokens = 64;          // sparsekv: host pool page
  int64_t tokens = 0;                // positions a request holds: prompt + decode headroom
  int32_t offload_page_tokens = 64;  // page-offload: tokens per page it fetches and caches
  // Without classes: the index groups the layers form (sparsekv's hot cache keeps a replacement
  // state per group: IndexGroups::count()); 0: one per layer. GLM-5.3: 21 of 78.
  int32_t index_groups = 0;
  // Without classes: the layers with indexer keys (LayerShape::indexer_keys), of which every
  // variant charges the keys; -1: every layer. GLM-5.3: 21 of 78.
  int32_t keyed_layers = -1;
  // Layers of several kinds (LayerClassesOf); empty: the `layers` layers above, offloaded, a
  // row of row_bytes per token, indexer keys in each, one top-k of top_k each. With classes,
  // layers, row_bytes, indexer_key_bytes' layers and top_k above are not read (the key size is),
  // hot_slots and window apply to each offloaded layer, page_tokens counts entries, and only
  // full-hbm and sparsekv are defined.
  std::vector<LayerClass> classes;
  int32_t raw_window = 0;           // rows of uncompressed history per layer (CacheOptions'), all
  int32_t resident_page_rows = 64;  // R: a resident layer's entries are held in pages of R
};

// Bytes one request costs, with G = index_groups (layers if 0) and keyed = keyed_layers (layers
// if -1). HBM (the variant's KV-related device memory):
//   full-hbm: tokens * (layers * row + keyed * indexer key) + top_k * 4 (row indices)
//   sparsekv: the hot-cache block: layers * (hot_slots + window) * row + G replacement states
//             (HotCache::StateBytesOf, those of the default CacheOptions::eviction: with the
//             clock a slot table, use counts, a hand and a position map of `tokens` entries)
//             + tokens * keyed * indexer key + pages * 4 (page table row)
//             + top_k * (4 * 5 + 1) (slots; two miss lists of host rows and slots, which
//               index groups alternate between; the fill mask of split runs)
//   no-cache: tokens * keyed * indexer key + top_k * row (one layer's staging rows)
//             + top_k * 4 * 2 (host rows, staging indices)
//   page-offload, with Q = offload_page_tokens, pages = ceil(tokens / Q), P = max(1, hot_slots /
//             Q) cached pages and S = min(top_k, pages) staging pages (PageOffloadPages):
//             layers * ((P + 1) * Q * row + P * 4 * 2) (cache + newest page, slot table, LRU)
//             + S * Q * row + S * 4 * 2 (one layer's staging pages and their tables)
//             + tokens * keyed * indexer key + pages * 4 (page table row)
//             + top_k * 4 * 9 (page ids, two slot arrays, overflow ids, rows, two miss lists)
// Host (pinned pool): sparsekv: pages * page_tokens * layers * row, pages = ceil(tokens /
// page_tokens); no-cache: tokens * layers * row; page-offload: pages * Q * layers * row;
// full-hbm: 0.
// The indexer keys are charged but not allocated: the engine owns them.
// With layer classes (docs/deepseek-v4.md, "Sizing"; T = tokens, E = floor(T / r) entries of a
// class, s its entry stride, C = hot_slots, w = window, R = resident_page_rows, Q = page_tokens,
// K = the largest top_k):
//   full-hbm: sum over classes but window-only of layers * E * s + keyed_layers * E * key
//             + raw_window * sum of layers * s + K * 4
//   sparsekv: sum over offloaded: layers * (C + w) * s + HotCache::StateBytes of index_groups
//             (the default eviction's state; the clock's position map holds E entries)
//             + sum over resident: layers * ceil(E / R) * (R * s + 4) (pages and page ids)
//             + raw_window * sum of layers * s (every layer's ring)
//             + sum of keyed_layers * E * key
//             + ceil(E_offloaded / Q) * 4 (page table row) + K * (4 * 5 + 1)
//   host (sparsekv): sum over offloaded: layers * ceil(E / Q) * Q * s.
// Without classes the two agree with the formulas above for a row per token.
struct RequestFootprint {
  int64_t hbm_bytes = 0;
  int64_t host_bytes = 0;
};
RequestFootprint Footprint(KVVariant variant, const RequestShape& shape);

// The page counts of the page-offload variant for one request (formulas above).
struct PageOffloadPages {
  int32_t pages = 0;    // pages of the request's history: ceil(tokens / Q)
  int32_t cached = 0;   // P: LRU pages per layer (the bytes of sparsekv's hot_slots rows)
  int32_t staging = 0;  // S: pages a step may need beyond the cache, per layer in flight
};
PageOffloadPages OffloadPages(const RequestShape& shape);

// The largest batch whose footprint fits both budgets (and `cap`, if cap > 0); 0 if none fits.
int32_t MaxBatch(KVVariant variant, const RequestShape& shape, int64_t hbm_budget_bytes,
                 int64_t host_budget_bytes, int32_t cap);

// The batch sizes of a sweep: 1, 2, 4, ... below max_batch, then max_batch. Empty if
// max_batch < 1.
std::vector<int32_t> SweepBatches(int32_t max_batch);

// Whether the variant's step depends on the top-k's miss rate (sparsekv and page-offload: each
// miss rate is a separate point); full-hbm and no-cache run once per batch.
bool DependsOnMissRate(KVVariant variant);

// A variant's plan at one context. Every request decodes `headroom` tokens over the run (the
// correctness-check steps, then `steps` per swept point); its footprint is charged for
// context + headroom positions, so the budget covers what is allocated.
struct VariantPlan {
  int32_t max_batch = 0;
  std::vector<int32_t> batches;  // the sweep, or {batch} if one was asked for and fits
  int64_t headroom = 0;          // decode tokens reserved per request
  RequestFootprint footprint;    // per request, at context + headroom positions
};
// `shape.tokens` is the context. `rates`: the miss rates swept where DependsOnMissRate (1 for the
// others); `batch` > 0 asks for that one batch size instead of the sweep; `also` (if > 0 and
// within the max batch) is swept too (another variant's max batch, so that both are measured at
// it).
VariantPlan PlanVariant(KVVariant variant, RequestShape shape, int64_t hbm_budget_bytes,
                        int64_t host_budget_bytes, int32_t cap, int32_t rates, int32_t steps,
                        int32_t check_steps, int32_t batch, int32_t also = 0);

// sparsekv with a hot cache sized by the budget (CacheOptions::device_budget_bytes with
// hot_slots = 0, as hybrid residency runs it, the manager keeping the indexer keys in pages of
// resident_page_rows): the batch is the largest that the host budget and `cap` allow and whose
// per-request device state besides the manager's memory (the sparsekv Footprint less its
// hot-cache block and its indexer keys) leaves room for that many blocks of top_k slots and their
// keys; the manager takes the rest of the HBM budget, and the slots per request follow
// (ChooseHotCacheShape).
struct BudgetedHotCache {
  int32_t max_batch = 0;          // 0: not even one request fits
  int32_t hot_slots = 0;          // chosen per request and layer
  int64_t hot_cache_bytes = 0;    // the manager's device_budget_bytes (blocks, pages, keys)
  int64_t per_request_bytes = 0;  // HBM per request besides the manager's memory
};
// `shape.tokens` is the positions a request holds (context + headroom).
BudgetedHotCache PlanBudgetedHotCache(const RequestShape& shape, int64_t hbm_budget_bytes,
                                      int64_t host_budget_bytes, int32_t cap);
// PlanVariant for sparsekv with a budget-sized hot cache: max_batch and the footprint (per
// request: its device state plus its share of the hot cache) from PlanBudgetedHotCache;
// `budgeted` (if not null) receives it.
VariantPlan PlanBudgetedVariant(RequestShape shape, int64_t hbm_budget_bytes,
                                int64_t host_budget_bytes, int32_t cap, int32_t rates,
                                int32_t steps, int32_t check_steps, int32_t batch,
                                BudgetedHotCache* budgeted, int32_t also = 0);

// Bytes a step moves besides what attention and the proxy move:
//   pcie: rows crossing PCIe (host -> HBM fetches, HBM -> host write-back of the new token);
//   hbm:  device-memory traffic of the KV bookkeeping (rows written into the cache or staging,
//         the new row's write, index arrays, sparsekv's slot table and LRU order read and written).
//   full-hbm: pcie 0;  hbm B*L*(row + 2*K*4)
//   sparsekv: pcie misses*row + B*L*row;  hbm misses*row + B*L*(row + 3*K*4 + 4*C*4)
//   no-cache: pcie B*L*(K + 1)*row;  hbm B*L*(K*row + 3*K*4)
//   page-offload: pcie misses*Q*row + B*L*row;
//                 hbm misses*Q*row + B*L*(row + 9*K*4 + 4*P*4 + 2*S*4)
// with B = batch, L = layers, K = top_k, C = hot_slots, misses = rows copied per step (for
// page-offload: pages copied per step, Q rows each; P, S as in OffloadPages).
struct StepTraffic {
  double pcie_bytes = 0;
  double hbm_bytes = 0;
};
StepTraffic Traffic(KVVariant variant, const RequestShape& shape, int32_t batch,
                    double misses_per_step);

// Ceilings measured in the same run: pinned cudaMemcpy host -> device, and device -> device
// (counting bytes read plus written), in GB/s (1e9 B/s).
struct Ceilings {
  double pcie_h2d_gbps = 0;
  double pcie_d2h_gbps = 0;
  double hbm_gbps = 0;
};

// The floor of a step (ms): the attention and proxy times measured at the same batch, plus the
// PCIe bytes at the pinned-memcpy ceiling and the other HBM bytes at the device-copy ceiling:
//   floor = attention + proxy + pcie_bytes / pcie_h2d + hbm_bytes / hbm.
// Attention and proxy enter as measured (they are the same in every variant); the floor is the
// time a perfect implementation of the variant's own data movement would add to them.
double StepFloorMs(const StepTraffic& traffic, const Ceilings& ceilings, double attention_ms,
                   double proxy_ms);

// The step time (ms) the same ceilings allow with perfect overlap: the PCIe transfers hidden
// behind everything else (or the reverse, whichever is longer):
//   ideal = max(attention + proxy + hbm_bytes / hbm, pcie_bytes / pcie_h2d).
// The "ideal bound" of a variant's throughput is max over batches of batch / ideal.
double StepIdealMs(const StepTraffic& traffic, const Ceilings& ceilings, double attention_ms,
                   double proxy_ms);

}  // namespace sparsekv
