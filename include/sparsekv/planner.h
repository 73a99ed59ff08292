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
// A model whose layers differ in kind (DeepSeek-V4, GLM-5.3) has a step per kind, projected from
// these terms: PredictKindStep below.
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
  // Bytes one request's attention read per layer in the points the attention terms were fitted
  // to: top_k rows of row_bytes, 2048 x 656 B in the committed results (FitCalibration: the mean
  // over its points). The model of layers of several kinds scales the per-request term by it.
  double attention_bytes_per_request = 2048.0 * 656;

  const VariantCost& cost(KVVariant variant) const;
  // gather_gbps / link_gbps of sparsekv: the fraction of a link's bandwidth the gather reaches.
  // Applied to every tier, which assumes the gather is as efficient on other links as on PCIe.
  double gather_efficiency() const;
  // attention_bytes_per_request / attention_per_request_us, in GB/s: the rate at which the
  // calibrated attention reads a request's rows (not a measured bandwidth but the fitted term
  // written as one; 410 GB/s with the defaults). 0 if attention_per_request_us is 0.
  double attention_gbps() const;
};

struct ModelShape {
  int32_t layers = 61;
  int32_t row_bytes = 656;
  int32_t indexer_key_bytes = 132;
  int32_t top_k = 2048;
  double weights_gb = 84;      // per-GPU weight bytes streamed every step (1e9 B)
  double bytes_per_param = 2;  // bf16: converts weight bytes to multiply-adds
  // Layers of several kinds (RequestShape::classes, LayerClassesOf): DeepSeek-V4, GLM-5.3. Empty:
  // `layers` uniform layers above. With classes (whose layers `layers` should sum), PredictStep
  // models each kind (PredictKindStep below) and Limits and Capacity size each kind (Footprint).
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
  int64_t context = 0;         // tokens per request; read only for a model with classes
};

// The step's parts, in milliseconds over all layers; total is the TPOT.
struct StepTime {
  double attention_ms = 0;
  double indexer_ms = 0;  // the indexer's scan of its keys: layers of several kinds only
  double rest_ms = 0;
  double overhead_ms = 0;
  double transfer_ms = 0;
  double total_ms = 0;
  // The same step with the whole transfer hidden (h = 1): overhead + max(compute, transfer).
  double ideal_ms = 0;
  // The largest part: "weights" (rest of the model), "attention", "indexer", "overhead" or
  // "transfer".
  std::string binding;
};
// The model above for `model` without classes; with classes, the model of layers of several
// kinds (below). REQUIRES: in.batch >= 1.
StepTime PredictStep(const Calibration& cal, const ModelShape& model, const GpuSpec& gpu,
                     const StepInputs& in);

// ---- Layers of several kinds (DeepSeek-V4, GLM-5.3; docs/planning.md, "Layers of several
// kinds: the step") ----
//
// What one request moves per step, summed over the layers of each kind, at T tokens and miss
// rate m. For a class (LayerClass) of L layers, cadence r, entry stride s, Lk keyed layers, with
// K = min(its top-k, floor(T / r)), W = min(model.raw_window, T) and the indexer's key of
// model.indexer_key_bytes:
//   offloaded (CSA)    attention reads L * (K + W) * s (its top-k entries and its raw window)
//                      the indexer scans Lk * floor(T / r) * key (one key per entry)
//                      sparsekv fetches L * m * K * s from the tier (the misses; no-cache m = 1)
//                      and writes back L * s / r (an entry completes every r tokens)
//   resident (HCA)     attention reads L * (floor(T / r) + W) * s (every entry, and the window)
//   window-only        attention reads L * W * s
// Full HBM reads the same and moves nothing over the link.
struct KindStepBytes {
  double offloaded_attention = 0;
  double resident_attention = 0;
  double window_attention = 0;
  double indexer = 0;
  double fetched = 0;   // host -> HBM: the offloaded layers' misses
  double appended = 0;  // HBM -> host: the offloaded layers' new entries, averaged over r tokens
  double attention() const { return offloaded_attention + resident_attention + window_attention; }
};
KindStepBytes StepBytesPerRequest(const ModelShape& model, KVVariant variant, int64_t tokens,
                                  double miss_rate);

// The step of such a model at batch B, from the calibrated terms of the uniform model (no term is
// measured on these layers yet). With L layers, Lo of them offloaded, and the bytes above:
//   attention = L * attention_fixed + B * attention bytes / cal.attention_gbps()
//   indexer   = B * indexer bytes / cal.weight_gbps    (an HBM stream, as the weights are)
//   rest      = L * rest per layer                      (as above)
//   overhead  = Lo * variant's cost + (L - Lo) * full-hbm's cost (sparsekv and no-cache: their
//               resolve runs on the offloaded layers only); full-hbm: L * full-hbm's cost
//   transfer  = B * fetched bytes / gather bandwidth   (the tier's, as above)
//   TPOT      = overhead + max(attention + indexer + rest + (1 - h) * transfer, transfer)
// The appended entries cross the link the other way and are not charged (as the uniform model's
// write-back is in its fitted overhead). For a model of one offloaded class with a row per token,
// a key in every layer and no raw window it is PredictStep's uniform model plus the indexer.
// T is in.context. REQUIRES: model.classes is not empty, in.batch >= 1.
StepTime PredictKindStep(const Calibration& cal, const ModelShape& model, const GpuSpec& gpu,
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
// `tpot_slo_ms` <= 0: no latency limit. The search stops at kMaxSearchBatch. The HBM and capacity
// limits are Footprint's (per layer kind, for a request with classes); the latency limit predicts
// steps at request.tokens.
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
