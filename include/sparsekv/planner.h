// The analytic model behind `sparsekv plan` (docs/planning.md): the time of one decode step and the
// largest batch a GPU can hold, for the full-HBM baseline and for sparse KV offloading to a memory
// tier. Pure functions of their inputs, unit-tested on hand-computed cases.
//
// One decode step over L layers at batch B (all times per layer in microseconds):
//   attention(B) = attention_fixed + attention_per_request * B
//   rest(B)      = max(weight_bytes_per_layer / weight_gbps, B * 2 * params_per_layer / flops)
//                  + rest_per_request * B                       (the rest of the model)
//   overhead(B)  = variant.fixed + variant.per_request * B       (launches, resolve, bookkeeping)
//   transfer     = rows fetched per layer * row_bytes / gather_gbps  (the variant's link traffic)
// with a share h of the transfer hidden behind attention and the rest of the model (never more
// than that compute takes):
//   TPOT = L * (overhead + max(attention + rest + (1 - h) * transfer, transfer))
// h = 0 is serial: TPOT = L * (attention + rest + overhead + transfer), what the benchmark
// measured with an indexer in every layer; h = 1 is the ideal, max(compute, transfer). With one
// top-k per 4 layers and copies ahead on 16 blocks the benchmark measured h = 0.6-0.77 at batch
// 4-64 (docs/overlap.md).
// Rows fetched per layer: sparsekv B * miss_rate * top_k; no-cache B * top_k; full-hbm 0.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "sparsekv/kv_footprint.h"
#include "sparsekv/options.h"
#include "sparsekv/step_schedule.h"

namespace sparsekv {

// What a variant adds to every layer of a step, beyond attention and the rest of the model.
struct VariantCost {
  double fixed_us = 0;        // per layer, whatever the batch
  double per_request_us = 0;  // per layer and request
  // Effective gather bandwidth of the measured link (GB/s); 0 for a variant that moves no rows.
  double gather_gbps = 0;
};

// The physical parameters of the model. The defaults are the fit to the committed H200 results
// (bench/results/2026-11-30-e2e-sweep/*.json, see docs/planning.md); `sparsekv plan --calibration`
// refits them.
struct Calibration {
  double attention_fixed_us = 12.23;
  double attention_per_request_us = 3.279;
  double weight_gbps = 4446;  // rate at which the rest of the model streams its weights
  double rest_per_request_us = 0.2822;
  VariantCost full_hbm{6.2, 0.44, 0};
  VariantCost sparsekv{40.8, 1.24, 48.5};
  VariantCost no_cache{16.6, 0, 46.0};
  double link_gbps = 55.4;  // the pinned-memcpy ceiling the gather bandwidths were measured under

  const VariantCost& cost(KVVariant variant) const;
  // gather_gbps / link_gbps of sparsekv: the fraction of a link's bandwidth the gather reaches.
  // Applied to every tier, which assumes the gather is as efficient on other links as on PCIe.
  double gather_efficiency() const;
};

struct ModelShape {
  int32_t layers = 61;
  int32_t row_bytes = 656;
  int32_t indexer_key_bytes = 132;
  int32_t top_k = 2048;
  double weights_gb = 84;      // per-GPU weight bytes streamed every step (1e9 B)
  double bytes_per_param = 2;  // bf16: converts weight bytes to multiply-adds
  // Layers of several kinds (RequestShape::classes, LayerClassesOf): DeepSeek-V4, GLM-5.3. Empty:
  // `layers` uniform layers above. Only Capacity reads a model with classes; PredictStep and
  // Limits' latency term model uniform layers (the step of the others needs calibration points).
  std::vector<LayerClass> classes;
  int32_t raw_window = 0;  // RequestShape::raw_window
};

struct GpuSpec {
  double hbm_gb = 141;        // HBM capacity (1e9 B)
  double reserved_gb = 8;     // activations and workspace; the KV budget is hbm - weights - this
  double flops_tflops = 989;  // dense bf16 rate bounding the rest of the model at large batches
};

// A memory tier holding the full KV history: its capacity per GPU and its bandwidth to the GPU.
struct MemoryTier {
  std::string name;
  double capacity_gb = 0;  // per GPU (1e9 B)
  double gbps = 0;         // link bandwidth to one GPU (GB/s)
};
// pcie-dram 250 GB @ 55 GB/s, cxl 500 GB @ 50, nvlink-c2c 480 GB @ 450, scaleup-pool 4000 GB @
// 450: illustrative per-GPU figures (docs/planning.md says where each comes from).
std::vector<MemoryTier> DefaultTiers();
// A host tier of DRAM that a node's GPUs share: `node_gb` (1e9 B) per node, of which each GPU
// holds node_gb / gpus_per_node, over its own link of `gbps`. Named "node-<node_gb>GB" (e.g.
// "node-250GB"). The standard node has 250 GB to 2 TB of DRAM and 8 GPUs: 31.25 to 250 GB per
// GPU. REQUIRES: node_gb > 0, gpus_per_node >= 1, gbps > 0.
MemoryTier NodeDramTier(double node_gb, int32_t gpus_per_node, double gbps);

// One point of the model.
struct StepInputs {
  KVVariant variant = KVVariant::kSparseKV;
  int32_t batch = 1;
  double miss_rate = 0.2;      // sparsekv only
  double link_gbps = 0;        // the tier's bandwidth; 0 = the calibration's link
  double hidden_fraction = 0;  // h above, in [0, 1]
};

// The step's parts, in milliseconds over all layers; total is the TPOT.
struct StepTime {
  double attention_ms = 0;
  double rest_ms = 0;
  double overhead_ms = 0;
  double transfer_ms = 0;
  double total_ms = 0;
  // The largest part: "weights" (rest of the model), "attention", "overhead" or "transfer".
  std::string binding;
};
StepTime PredictStep(const Calibration& cal, const ModelShape& model, const GpuSpec& gpu,
                     const StepInputs& in);

// The largest batch under each limit, for one variant and tier at one context. A limit that does
// not apply (full-hbm: tier capacity) is left at kUnlimited.
inline constexpr int32_t kUnlimited = 1 << 30;
struct BatchLimits {
  int32_t by_hbm = kUnlimited;       // KV-related HBM per request within hbm - weights - reserved
  int32_t by_capacity = kUnlimited;  // full history per request within the tier's capacity
  int32_t by_latency = kUnlimited;   // predicted TPOT <= the SLO (bandwidth enters here)
  int32_t max_batch() const;         // the smallest of the three
  std::string binding() const;       // "hbm", "capacity" or "latency" (the first smallest)
};
// `tpot_slo_ms` <= 0: no latency limit. The search stops at kMaxSearchBatch.
inline constexpr int32_t kMaxSearchBatch = 4096;
BatchLimits Limits(const Calibration& cal, const ModelShape& model, const GpuSpec& gpu,
                   const RequestShape& request, const StepInputs& in, double tier_capacity_gb,
                   double tpot_slo_ms);

// The requests per GPU at one context, from the footprint alone (KV budget = hbm - weights -
// reserved; RequestShape for `model` at `context` tokens, a hot cache of `hot_slots` per
// offloaded layer): every entry, key and window in HBM (full-hbm), and the offloaded layers'
// entries in each tier (sparsekv), bounded by HBM and by the tier's capacity. Capped at
// kMaxSearchBatch.
struct CapacityCase {
  int32_t context = 0;
  RequestFootprint full_hbm;   // per request
  RequestFootprint offloaded;  // per request, sparsekv
  int32_t full_hbm_batch = 0;  // by HBM
  int32_t offloaded_by_hbm = 0;
  std::vector<int32_t> offloaded_by_tier;  // per tier: min(offloaded_by_hbm, by its capacity)
};
// The request Capacity counts: `model`'s layers (classes or uniform) at `context` tokens.
RequestShape CapacityRequest(const ModelShape& model, int32_t context, int32_t hot_slots);
CapacityCase Capacity(const ModelShape& model, const GpuSpec& gpu,
                      const std::vector<MemoryTier>& tiers, int32_t context, int32_t hot_slots);

// The time to a ready host pool of `pool_gb` (1e9 B) at start-up: populated and registered in
// chunks of `chunk_gib` GiB (host_memory.h), at `ready_gbps`, the rate of the whole preparation
// (what `sparsekv bench` prints as "host arena ready: ... GB/s" on the machine in question).
//   seconds = pool_gb / ready_gbps,  chunks = ceil(pool_gb * 1e9 / chunk_gib GiB)
// single_registration_fails: the pool is 512 GiB or more, which one cudaHostRegister refuses.
struct HostPoolReady {
  double seconds = 0;
  int32_t chunks = 0;
  bool single_registration_fails = false;
};
HostPoolReady ModelHostPoolReady(double pool_gb, double ready_gbps, double chunk_gib = 64);

// ---- The step schedule the model expects to win (docs/planning.md, "The step schedule") ----
//
// The library's StepSchedule (step_schedule.h) measures its candidates and keeps the fastest.
// What the model expects of each at one sparsekv point, with PredictStep's parts at h = 0
// (per layer: A attention, R rest of the model, O overhead, T transfer) and B the batch:
//   serial               L * (O + A + R + T)
//   chunks of C rows     n = ceil(B / C) slices; each layer's copies and its attention pipelined
//                        over them, the rest of the layer after them:
//                        L * (O + R + (T + A) / n + (n - 1) / n * max(T, A) + n * kChunkLaunchUs)
//   prefetch on at most  PredictStep at h = kPrefetchHiddenFraction: the next layer's misses
//   16 blocks            copied beside this layer's work
//   not modelled         the prefetch on a larger grid (its copies on every SM were measured
//                        slower than serial) and the prefetch with chunks (slower than either
//                        alone): never expected to win
// The expected winner is the fastest modelled candidate, the earliest in AllowedChoices' order
// (serial first) on a tie.
inline constexpr double kChunkLaunchUs = 10;             // per slice and layer
inline constexpr double kPrefetchHiddenFraction = 0.34;  // measured (docs/overlap.md)

struct ScheduleEstimate {
  StepChoice choice;
  bool modelled = false;
  double total_ms = 0;  // the step's time, if modelled
  std::string why;      // what the time is made of, or why it is not modelled
};
struct ScheduleForecast {
  // AllowedChoices(options), less the chunks of the batch's size or more (as the schedule does).
  std::vector<ScheduleEstimate> candidates;
  size_t expected = 0;  // the expected winner, an index into candidates
  std::string reason;   // why it is expected to win
};
// `options` are the manager's: the candidates follow from its top_k, geometry and
// layers_per_index, max_prefetch, copy_chunk_rows and copy grids; its max_batch is replaced by
// in.batch. REQUIRES: in.variant is kSparseKV.
ScheduleForecast ForecastSchedule(const Calibration& cal, const ModelShape& model,
                                  const GpuSpec& gpu, const StepInputs& in,
                                  const CacheOptions& options);

}  // namespace sparsekv
