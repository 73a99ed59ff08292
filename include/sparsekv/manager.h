// SparseKVCacheManager: the request lifecycle and the per-step entry points of sparsekv.
//
// Every request's complete KV history lives in the HostKVPool; a small HotCache block per request
// lives in device memory. At every decode step and layer, the engine's top-k positions are
// resolved against the hot cache: hits are used in place, misses are copied in from the host pool,
// and the caller gets, per top-k entry, a layer-wide slot of the hot cache (see hot_cache.h).
//
// A decode step has two phases:
//   plan (host side, between steps; may allocate and synchronise):
//     PlanStep(batch) -> fixes the batch composition and the newest token of every request, and
//     writes them into fixed device buffers.
//   run (device side; enqueues only: no allocation, no host synchronisation, no shape that
//   depends on data, so that it can be captured into a CUDA graph once and replayed):
//     for each layer: AppendToken(layer, new_rows), then RunLayer(layer, topk, slots, ...);
//     then FinishStep().
// A graph captured over the run phase stays valid for every later step whose batch has at most
// max_batch requests: the batch size and table are read from device memory at run time.
//
// Thread safety: not thread-safe. One thread drives a manager; its run-phase calls must be
// enqueued on one stream (the side stream for write-back is internal).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "sparsekv/backend.h"
#include "sparsekv/host_kv_pool.h"
#include "sparsekv/hot_cache.h"
#include "sparsekv/options.h"
#include "sparsekv/status.h"

namespace sparsekv {

using RequestId = uint64_t;

// Statistics since creation or the last ResetStats(). Formulas are in the comments.
struct LayerStats {
  uint64_t hits = 0;          // top-k positions found in an LRU slot
  uint64_t window_hits = 0;   // top-k positions served by the newest-token window
  uint64_t misses = 0;        // top-k positions copied from the host pool
  uint64_t padding = 0;       // -1 entries
  uint64_t duplicates = 0;    // repeated positions within one top-k row (skipped)
  uint64_t out_of_range = 0;  // positions outside [0, seq_len) (skipped)
  // hit_rate = (hits + window_hits) / (hits + window_hits + misses); 0 if no lookups.
  double hit_rate() const;
};

struct CacheStats {
  std::vector<LayerStats> layers;  // one per layer
  LayerStats total;                // sum over layers
  // bytes_host_to_device = sum over layers of misses * row_bytes, plus window rows loaded at
  // ingest and resume.
  uint64_t bytes_host_to_device = 0;
  // bytes_device_to_host = appended tokens * row_bytes (write-back of the newest token).
  uint64_t bytes_device_to_host = 0;
  // bytes_assembled = assembled rows * row_bytes (device to device).
  uint64_t bytes_assembled = 0;
  // bytes_ingested = prompt rows * row_bytes written into the host pool.
  uint64_t bytes_ingested = 0;
  uint64_t invalid_copy_entries = 0;  // IndexCopy entries skipped as out of bounds
  int32_t host_pages_used = 0;
  int32_t host_pages_total = 0;
  int32_t hot_blocks_used = 0;
  // Device memory held by the manager: hot cache, replacement state, page table, plan buffers.
  int64_t device_bytes = 0;
};

class SparseKVCacheManager {
 public:
  // Validates `options` (ValidateOptions) and allocates the host pool, the hot cache and the fixed
  // device buffers of the run phase.
  static StatusOr<std::unique_ptr<SparseKVCacheManager>> Create(const CacheOptions& options,
                                                                std::shared_ptr<Backend> backend);
  ~SparseKVCacheManager();
  SparseKVCacheManager(const SparseKVCacheManager&) = delete;
  SparseKVCacheManager& operator=(const SparseKVCacheManager&) = delete;

  // ---- Lifecycle (host side) ----

  // Reserves host pages for prompt_len + max_new_tokens positions and a hot-cache block.
  // AlreadyExists for a known id; OutOfRange if the length exceeds max_context;
  // ResourceExhausted if the host pool or the hot cache is full (nothing changes then).
  Status Admit(RequestId id, int32_t prompt_len, int32_t max_new_tokens, StreamHandle stream);
  // Writes the prompt KV of one layer into the host pool and its newest `window` rows into the
  // hot cache. `rows` is [prompt_len, row_stride(layer)] in host or device memory and must stay
  // valid until `stream` reaches the copies. Every layer must be ingested before the request
  // joins a step. REQUIRES: the request is admitted and not released.
  Status IngestPrompt(RequestId id, int32_t layer, const void* rows, StreamHandle stream);
  // Frees the request's host pages and hot-cache block. NotFound for an unknown or released id.
  // REQUIRES: no enqueued step that includes the request is still running.
  Status Release(RequestId id);
  // Gives back the request's hot-cache block but keeps its history in the host pool, to free HBM
  // under pressure. A retracted request cannot join a step until Resume().
  Status Retract(RequestId id);
  // Takes a hot-cache block again (ResourceExhausted if none is free) and reloads the window.
  Status Resume(RequestId id, StreamHandle stream);

  // ---- Plan (host side, between steps) ----

  // Fixes the next step's batch: each request gains one token (its position is the request's
  // current length), whose KV the run phase appends. Errors: empty or oversized batch,
  // duplicate, unknown, retracted or not fully ingested requests, a request at its reserved
  // length, or a previous step not finished. Enqueues the upload of the plan on `stream`.
  Status PlanStep(std::span<const RequestId> batch, StreamHandle stream);

  // ---- Run (device side; graph-capturable) ----

  // Stores the newest token's KV of `layer` for every request of the step: into its window slot
  // (in place) and, on a side stream, into the host pool (write-back). `new_rows` is
  // [max_batch, row_stride(layer)], row b for the b-th request of the batch. Must precede
  // RunLayer(layer) in the step.
  Status AppendToken(int32_t layer, const void* new_rows, StreamHandle stream);
  // Resolves `topk` ([max_batch, topk_stride] int32 positions, -1 = padding; rows past the
  // batch are ignored) against the hot cache of `layer`, copies the misses in, and writes
  // `slots` ([max_batch, top_k] int32 layer-wide slots, -1 = skipped entry). If `assembled` is
  // not null, also gathers the selected rows into it ([max_batch, top_k, row_stride(layer)];
  // skipped entries are zero rows). topk_stride 0 means top_k.
  Status RunLayer(int32_t layer, const int32_t* topk, int32_t* slots, void* assembled,
                  StreamHandle stream, int32_t topk_stride = 0);
  // Ends the step: joins the write-back side stream into `stream`.
  Status FinishStep(StreamHandle stream);
  // Host side, after replaying a captured run phase for a step planned with PlanStep: closes the
  // step as the captured calls did at capture time (they are not re-executed on the host) and
  // applies their byte accounting to the new batch. REQUIRES: the graph was captured from a
  // complete run phase of this manager (every layer appended, FinishStep) and has been launched.
  Status FinishReplayedStep();

  // ---- Introspection ----

  // Synchronises `stream` and reads the device counters.
  StatusOr<CacheStats> ReadStats(StreamHandle stream);
  // Synchronises `stream` and zeroes every counter.
  Status ResetStats(StreamHandle stream);
  // Tokens with KV of a known request; NotFound otherwise.
  StatusOr<int32_t> SequenceLength(RequestId id) const;
  // Layer `layer` of the hot cache, [max_requests * (hot_slots + window), row_stride(layer)]:
  // what the slots returned by RunLayer index.
  const std::byte* HotLayer(int32_t layer) const;
  int32_t batch_size() const { return static_cast<int32_t>(batch_.size()); }
  const CacheOptions& options() const { return options_; }
  const HostKVPool& host_pool() const { return *pool_; }
  Backend& backend() const { return *backend_; }

 private:
  struct Request {
    int32_t owner;         // row in the host pool's page table
    int32_t block;         // hot-cache block, -1 while retracted
    int32_t seq_len;       // tokens with KV
    int32_t reserved;      // tokens reserved in the host pool
    std::vector<bool> ingested;  // per layer
    int32_t ingested_layers;
  };
  // The fixed device buffers of the run phase. Everything the plan phase writes is in one
  // contiguous region (`plan`), uploaded with one copy.
  struct PlanLayout;

  SparseKVCacheManager(const CacheOptions& options, std::shared_ptr<Backend> backend);
  Status Allocate();
  StatusOr<Request*> Find(RequestId id, const char* op);
  Status UploadPageTable(const Request& r, StreamHandle stream);
  Status LoadWindow(const Request& r, int32_t layer, const void* rows, int32_t first,
                    StreamHandle stream);

  CacheOptions options_;
  std::shared_ptr<Backend> backend_;
  std::unique_ptr<HostKVPool> pool_;
  std::unique_ptr<HotCache> hot_;
  std::unordered_map<RequestId, Request> requests_;
  std::vector<int32_t> free_owners_;

  // Device buffers.
  std::byte* plan_device_ = nullptr;  // see PlanLayout
  int32_t* page_table_device_ = nullptr;  // [max_requests, pages_per_request]
  int32_t* miss_host_row_ = nullptr;      // [max_batch * top_k]
  int32_t* miss_slot_ = nullptr;          // [max_batch * top_k]
  int32_t* miss_count_ = nullptr;         // scalar
  ResolveCounters* counters_ = nullptr;   // [layers]
  unsigned long long* invalid_copies_ = nullptr;  // scalar
  int64_t device_bytes_ = 0;

  // Host mirror of the plan and step state.
  std::vector<std::byte> plan_host_;
  std::vector<RequestId> batch_;
  bool step_open_ = false;
  std::vector<bool> appended_;  // per layer, in the open step
  // Bytes one request of a step moves, as recorded by the last complete run phase (replays).
  uint64_t step_bytes_to_host_per_request_ = 0;
  uint64_t step_bytes_assembled_per_request_ = 0;
  uint64_t open_bytes_to_host_per_request_ = 0;
  uint64_t open_bytes_assembled_per_request_ = 0;
  uint64_t bytes_host_to_device_ = 0;
  uint64_t bytes_device_to_host_ = 0;
  uint64_t bytes_assembled_ = 0;
  uint64_t bytes_ingested_ = 0;
};

}  // namespace sparsekv
