// The KV variants the end-to-end benchmark compares (sparsekv/kv_footprint.h), behind one interface
// that the step loop of gpu_bench.cc drives. Each holds the KV of up to max_batch requests of one
// context, with the same synthetic content (gpu_kernels.h FillKVRows), so that attention over any
// of them reads the same bytes for the same token.
//
// A step: Plan (host side, outside the graph), then per layer RunLayer (graph-capturable: fixed
// shapes, no allocation, no synchronisation), then FinishStep. After a replay of a captured step,
// AfterReplay closes it on the host. Attention then reads rows Indices() of Rows(layer).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "cuda_common/cuda_check.h"
#include "cuda_common/device_buffer.h"
#include "sparsekv/attention.h"
#include "sparsekv/backend.h"
#include "sparsekv/kv_footprint.h"
#include "sparsekv/options.h"
#include "sparsekv/status.h"
#include "sparsekv/step_schedule.h"

namespace sparsekv::tools {

using cuda_common::CudaStatus;
using cuda_common::DeviceBuffer;

// The owner DeviceBuffer::Allocate names in its ResourceExhausted errors.
inline constexpr const char* kBenchMemory = "sparsekv bench";

struct VariantSetup {
  RequestShape shape;   // tokens = context + headroom: the positions each request may hold
  int32_t context = 0;  // prompt positions [0, context) hold FillKVRows content
  int32_t max_batch = 0;
  uint64_t seed = 1;
  // sparsekv only: the manager's options start from these (BenchConfig::cache_base), then take
  // the fields below and the shape's.
  CacheOptions cache_base;
  // sparsekv only: the manager's layers (BenchGeometry: shape.layers rows of shape.row_bytes;
  // glm-5.3's named index groups, top-k and indexer keys); empty: uniform layers of the shape.
  KVGeometry geometry;
  // sparsekv only. Layers per shared top-k (CacheOptions::layers_per_index) where the geometry
  // names no groups: the group's first layer resolves, the others only copy.
  int32_t layers_per_index = 1;
  bool sort_misses = true;            // sparsekv only: CacheOptions::sort_misses
  int32_t sort_misses_min_batch = 0;  // sparsekv only: CacheOptions::sort_misses_min_batch
  int32_t copy_blocks = 0;            // sparsekv only: CacheOptions::copy_blocks
  int32_t fused_copy_min_batch = 0;   // sparsekv only: CacheOptions::fused_copy_min_batch
  int32_t prefetch_copy_blocks = 0;   // sparsekv only: CacheOptions::prefetch_copy_blocks
  int32_t copy_chunk_rows = 0;        // sparsekv only: CacheOptions::copy_chunk_rows
  CopyStrategy copy_strategy = CopyStrategy::kLattice;  // sparsekv only
  // sparsekv only, the StepChoice's cross-layer speculative prefetch: each index group's top-k
  // prefetched into the next group's hot cache on the schedule's side stream.
  bool crosslayer_prefetch = false;
  // sparsekv only, the StepChoice's planned copy: -1 off, else on the grid of that many blocks
  // (0: the options' copy grid).
  int32_t planned_copy = -1;
  // sparsekv only: the library's StepSchedule chooses each step's prefetch and chunks (chunks of
  // copy_chunk_rows, 8 if 0); otherwise it runs the choice the two fields above name.
  bool auto_schedule = false;
  // Query tokens per request (--mtp): shape.top_k holds all of a request's queries' entries;
  // sparsekv then shares repeated positions (CacheOptions::share_repeated_positions).
  int32_t queries = 1;
  // sparsekv only, hybrid residency (CacheOptions::hybrid_residency): requests stay resident
  // while the hot cache's budget allows; the hot cache takes device_budget_bytes (with
  // shape.hot_slots = 0, the slots per request are chosen from it).
  bool hybrid = false;
  int64_t device_budget_bytes = 0;
  // sparsekv only, the peer tier (peer_tier.h): every request's prompt rows are also lent by a
  // PeerRegion on this CUDA device and misses on them are read from there; -1: off.
  int32_t peer_device = -1;
  // DeepSeek-V4 (geometry with resident or window-only layers, raw_window > 0): the raw window
  // of every layer (CacheOptions::raw_window) and the entries' format (the attention's).
  int32_t raw_window = 0;
  KVRowFormat format = KVRowFormat::kFp8Row656;
  // DeepSeek-V4: the positions full-hbm's every-entry scope of an HCA layer is sized for (its
  // width: these / r, at least every count the run reaches; the padding past a request's count
  // does not change the attention's bytes); 0: shape.tokens.
  int64_t scope_tokens = 0;
};

// The two scopes SparseEntryAttention reads for some batch rows of a DeepSeek-V4 layer
// (entry_layers.h): the selected entries (a CSA layer's top-k, an HCA layer's every entry; width 0
// for a window-only layer) and the raw window, their indices starting at the first of those rows.
struct EntryScopes {
  AttentionScope selected;
  AttentionScope window;
};

// Lookups of the steps since ResetStats: all top-k entries of all layers, and those fetched from
// host memory.
struct VariantStats {
  double lookups = 0;
  double misses = 0;
  double prefetched = 0;          // rows fetched by prefetches (not counted in lookups or misses)
  int32_t resident_requests = 0;  // sparsekv with hybrid residency: resident now
  // sparsekv through the StepSchedule: the last step's choice and why it was made.
  std::string schedule, schedule_reason;
};

class StepVariant {
 public:
  virtual ~StepVariant() = default;
  virtual KVVariant kind() const = 0;
  // Host side: the next step runs requests [0, batch), whose new tokens take `positions[b]`.
  virtual Status Plan(std::span<const int32_t> positions, cudaStream_t stream) = 0;
  // Run phase of `layer` for `batch` requests (the batch of the last Plan): stores the new rows
  // (new_rows [max_batch, row]) and makes Rows(layer) / Indices() name the top-k rows
  // (topk [max_batch, top_k] positions).
  virtual Status RunLayer(int32_t layer, int32_t batch, const int32_t* topk,
                          const std::byte* new_rows, cudaStream_t stream) = 0;
  // RunLayer, then `attend` over all `batch` rows on `stream`; a variant whose library drives
  // the layer (sparsekv through its StepSchedule) calls `attend` as its rows come in.
  virtual Status RunLayerAndAttend(int32_t layer, int32_t batch, const int32_t* topk,
                                   const std::byte* new_rows, const AttendFn& attend,
                                   cudaStream_t stream) {
    SPARSEKV_RETURN_IF_ERROR(RunLayer(layer, batch, topk, new_rows, stream));
    return attend(layer, 0, batch, stream);
  }
  virtual Status FinishStep(cudaStream_t stream) = 0;
  // After a replay of the step's graph, which took `seconds`.
  virtual Status AfterReplay(double seconds) = 0;
  // Which captured step the planned step needs: steps of one key replay one graph.
  virtual std::string GraphKey() const { return ""; }
  virtual const std::byte* Rows(int32_t layer) const = 0;
  virtual const int32_t* Indices() const = 0;  // [max_batch, top_k]
  // DeepSeek-V4's variants (CreateVariant with a geometry of layer kinds): `layer`'s scopes for
  // batch rows from `first` on, as the last RunLayer (or RunLayerAndAttend) left them; Rows and
  // Indices are then null. Unimplemented for the others.
  virtual StatusOr<EntryScopes> Scopes(int32_t /*layer*/, int32_t /*first*/) const {
    return Unimplemented("StepVariant::Scopes: a variant of offloaded rows only");
  }
  // Host side, before the steps of a batch size: the requests [0, batch) are the live ones
  // (sparsekv with hybrid residency releases the others, as finished requests, and admits new
  // ones when the batch grows: those start again at the context length; it makes the live ones
  // resident where they fit). Synchronises `stream`.
  virtual Status SetLiveBatch(int32_t /*batch*/, cudaStream_t /*stream*/) { return Status::Ok(); }
  virtual Status ResetStats(cudaStream_t stream) = 0;
  virtual StatusOr<VariantStats> ReadStats(cudaStream_t stream) = 0;
};

// The sparsekv variants' manager options that do not depend on the layers: the base options, the
// request shape's top-k, slots, window and page, one hot-cache block per request of max_batch,
// and the copy and schedule settings (a cross-layer prefetch passes a whole top-k row per
// request). The caller sets the geometry and the host pool's capacity.
CacheOptions SparseKVManagerOptions(const VariantSetup& setup);

// Creates `kind` and fills every request's prompt (synchronising `stream` before returning).
// `host` serves the host memory of the offloading variants (the pinned arena). A geometry with
// resident or window-only layers or setup.raw_window > 0 (DeepSeek-V4) takes the entry variants
// (gpu_entry_variants.h): full-hbm and sparsekv only.
StatusOr<std::unique_ptr<StepVariant>> CreateVariant(KVVariant kind, const VariantSetup& setup,
                                                     std::shared_ptr<Backend> host,
                                                     cudaStream_t stream);

}  // namespace sparsekv::tools
