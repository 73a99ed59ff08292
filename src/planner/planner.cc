#include "sparsekv/planner.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <string>
#include <utility>

namespace sparsekv {

const VariantCost& Calibration::cost(KVVariant variant) const {
  switch (variant) {
    case KVVariant::kFullHbm:
      return full_hbm;
    case KVVariant::kNoCache:
      return no_cache;
    case KVVariant::kSparseKV:
    case KVVariant::kPageOffload:  // not planned: ReadMeasured skips its points
      break;
  }
  return sparsekv;
}

double Calibration::gather_efficiency() const {
  return link_gbps > 0 ? sparsekv.gather_gbps / link_gbps : 1;
}

double Calibration::attention_gbps() const {
  return attention_per_request_us > 0 ? attention_bytes_per_request / attention_per_request_us / 1e3
                                      : 0;
}

std::vector<MemoryTier> DefaultTiers() {
  return {{"pcie-dram", 250, 55},
          {"cxl", 500, 50},
          {"nvlink-c2c", 480, 450},
          {"scaleup-pool", 4000, 450}};
}

MemoryTier NodeDramTier(double node_gb, int32_t gpus_per_node, double gbps) {
  char name[48];
  std::snprintf(name, sizeof(name), "node-%gGB", node_gb);
  return {name, node_gb / gpus_per_node, gbps};
}

namespace {

// The rest of the model per layer at batch `b` (µs), over `layers` layers: its weights streamed
// or its multiply-adds, whichever is longer, and the per-request term.
double RestPerLayerUs(const Calibration& cal, const ModelShape& model, const GpuSpec& gpu, double b,
                      double layers) {
  const double weight_bytes = model.weights_gb * 1e9 / layers;
  const double stream_us = weight_bytes / (cal.weight_gbps * 1e3);
  const double compute_us =
      gpu.flops_tflops > 0 ? b * 2 * weight_bytes / model.bytes_per_param / (gpu.flops_tflops * 1e6)
                           : 0;
  return std::max(stream_us, compute_us) + cal.rest_per_request_us * b;
}

// The effective gather bandwidth of `in`'s tier (GB/s): a tier's gather reaches the fraction of
// its link that the calibrated gather reached of its own.
double GatherGbps(const Calibration& cal, const StepInputs& in) {
  return in.link_gbps > 0 ? in.link_gbps * cal.gather_efficiency()
                          : cal.cost(in.variant).gather_gbps;
}

// The name of the largest of `parts`, the first on a tie.
template <size_t N>
std::string Largest(const std::array<std::pair<double, const char*>, N>& parts) {
  return std::max_element(parts.begin(), parts.end(),
                          [](const auto& a, const auto& c) { return a.first < c.first; })
      ->second;
}

}  // namespace

StepTime PredictStep(const Calibration& cal, const ModelShape& model, const GpuSpec& gpu,
                     const StepInputs& in) {
  if (!model.classes.empty()) return PredictKindStep(cal, model, gpu, in);
  const double b = in.batch;
  const double layers = model.layers;
  const double attention_us = cal.attention_fixed_us + cal.attention_per_request_us * b;
  const double rest_us = RestPerLayerUs(cal, model, gpu, b, layers);
  const VariantCost& cost = cal.cost(in.variant);
  const double overhead_us = cost.fixed_us + cost.per_request_us * b;

  double rows = 0;  // fetched per layer
  if (in.variant == KVVariant::kSparseKV) rows = b * in.miss_rate * model.top_k;
  if (in.variant == KVVariant::kNoCache) rows = b * model.top_k;
  const double gbps = GatherGbps(cal, in);
  const double transfer_us = rows > 0 && gbps > 0 ? rows * model.row_bytes / (gbps * 1e3) : 0;

  StepTime t;
  t.attention_ms = layers * attention_us / 1e3;
  t.rest_ms = layers * rest_us / 1e3;
  t.overhead_ms = layers * overhead_us / 1e3;
  t.transfer_ms = layers * transfer_us / 1e3;
  const double compute_ms = t.attention_ms + t.rest_ms;
  t.total_ms = t.overhead_ms +
               std::max(compute_ms + (1 - in.hidden_fraction) * t.transfer_ms, t.transfer_ms);
  t.ideal_ms = t.overhead_ms + std::max(compute_ms, t.transfer_ms);
  const std::array<std::pair<double, const char*>, 4> parts = {{{t.rest_ms, "weights"},
                                                                {t.attention_ms, "attention"},
                                                                {t.overhead_ms, "overhead"},
                                                                {t.transfer_ms, "transfer"}}};
  t.binding = Largest(parts);
  return t;
}

KindStepBytes StepBytesPerRequest(const ModelShape& model, KVVariant variant, int64_t tokens,
                                  double miss_rate) {
  // A request shorter than the window or the top-k reads what it has.
  const double window = std::min<double>(model.raw_window, static_cast<double>(tokens));
  const double key = model.indexer_key_bytes;
  const double fetched_share = variant == KVVariant::kSparseKV  ? miss_rate
                               : variant == KVVariant::kNoCache ? 1
                                                                : 0;
  KindStepBytes bytes;
  for (const LayerClass& c : model.classes) {
    const double layers = c.layers, stride = c.entry_bytes;
    const double entries = static_cast<double>(tokens / c.entry_tokens);
    switch (c.kind) {
      case LayerKind::kOffloaded: {
        const double selected = std::min<double>(c.top_k, entries);
        bytes.offloaded_attention += layers * (selected + window) * stride;
        bytes.indexer += c.keyed_layers * entries * key;
        bytes.fetched += layers * fetched_share * selected * stride;
        if (fetched_share > 0) bytes.appended += layers * stride / c.entry_tokens;
        break;
      }
      case LayerKind::kResident:
        bytes.resident_attention += layers * (entries + window) * stride;
        break;
      case LayerKind::kWindowOnly:
        bytes.window_attention += layers * window * stride;
        break;
    }
  }
  return bytes;
}

StepTime PredictKindStep(const Calibration& cal, const ModelShape& model, const GpuSpec& gpu,
                         const StepInputs& in) {
  const double b = in.batch;
  double layers = 0, offloaded = 0;
  for (const LayerClass& c : model.classes) {
    layers += c.layers;
    if (c.kind == LayerKind::kOffloaded) offloaded += c.layers;
  }
  const KindStepBytes bytes = StepBytesPerRequest(model, in.variant, in.context, in.miss_rate);
  const double attention_gbps = cal.attention_gbps();
  const double gbps = GatherGbps(cal, in);
  // A variant's cost per layer at this batch; the layers it does not offload cost full HBM's.
  const auto per_layer_us = [b](const VariantCost& v) { return v.fixed_us + v.per_request_us * b; };
  const double overhead_us = offloaded * per_layer_us(cal.cost(in.variant)) +
                             (layers - offloaded) * per_layer_us(cal.full_hbm);

  StepTime t;
  t.attention_ms = (layers * cal.attention_fixed_us +
                    (attention_gbps > 0 ? b * bytes.attention() / (attention_gbps * 1e3) : 0)) /
                   1e3;
  t.indexer_ms = cal.weight_gbps > 0 ? b * bytes.indexer / (cal.weight_gbps * 1e6) : 0;
  t.rest_ms = layers * RestPerLayerUs(cal, model, gpu, b, layers) / 1e3;
  t.overhead_ms = overhead_us / 1e3;
  t.transfer_ms = bytes.fetched > 0 && gbps > 0 ? b * bytes.fetched / (gbps * 1e6) : 0;
  const double compute_ms = t.attention_ms + t.indexer_ms + t.rest_ms;
  t.total_ms = t.overhead_ms +
               std::max(compute_ms + (1 - in.hidden_fraction) * t.transfer_ms, t.transfer_ms);
  t.ideal_ms = t.overhead_ms + std::max(compute_ms, t.transfer_ms);
  t.binding = Largest(std::array<std::pair<double, const char*>, 5>{{{t.rest_ms, "weights"},
                                                                     {t.attention_ms, "attention"},
                                                                     {t.indexer_ms, "indexer"},
                                                                     {t.overhead_ms, "overhead"},
                                                                     {t.transfer_ms, "transfer"}}});
  return t;
}

int32_t BatchLimits::max_batch() const { return std::min({by_hbm, by_capacity, by_latency}); }

std::string BatchLimits::binding() const {
  const int32_t m = max_batch();
  if (by_hbm == m) return "hbm";
  if (by_capacity == m) return "capacity";
  return "latency";
}

BatchLimits Limits(const Calibration& cal, const ModelShape& model, const GpuSpec& gpu,
                   const RequestShape& request, const StepInputs& in, double tier_capacity_gb,
                   double tpot_slo_ms) {
  BatchLimits limits;
  const RequestFootprint f = Footprint(in.variant, request);
  const double budget = (gpu.hbm_gb - model.weights_gb - gpu.reserved_gb) * 1e9;
  limits.by_hbm =
      budget > 0 ? static_cast<int32_t>(std::min<double>(budget / f.hbm_bytes, kMaxSearchBatch))
                 : 0;
  if (f.host_bytes > 0) {
    limits.by_capacity = static_cast<int32_t>(
        std::min<double>(tier_capacity_gb * 1e9 / f.host_bytes, kMaxSearchBatch));
  }
  if (tpot_slo_ms > 0) {
    // TPOT grows with the batch: the first batch over the SLO ends the search.
    StepInputs point = in;
    point.context = request.tokens;
    int32_t b = 0;
    for (point.batch = 1; point.batch <= kMaxSearchBatch; ++point.batch) {
      if (PredictStep(cal, model, gpu, point).total_ms > tpot_slo_ms) break;
      b = point.batch;
    }
    limits.by_latency = b;
  }
  return limits;
}

namespace {

std::string Ms(double ms) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.2f ms", ms);
  return text;
}

// Why `o` allows serial only at `batch`.
std::string OnlySerialBecause(const CacheOptions& o, int32_t batch) {
  const std::string prefetch =
      o.index_groups() <= 1 ? "one index group: no prefetch" : "max_prefetch < top_k: no prefetch";
  const std::string chunks = o.copy_chunk_rows <= 0 ? "copy_chunk_rows 0: no chunks"
                                                    : "no chunk of copy_chunk_rows " +
                                                          std::to_string(o.copy_chunk_rows) +
                                                          " below batch " + std::to_string(batch);
  return "the only choice the options allow (" + prefetch + "; " + chunks + ")";
}

}  // namespace

ScheduleForecast ForecastSchedule(const Calibration& cal, const ModelShape& model,
                                  const GpuSpec& gpu, const StepInputs& in,
                                  const CacheOptions& options) {
  StepInputs serial_in = in;
  serial_in.hidden_fraction = 0;
  const StepTime serial = PredictStep(cal, model, gpu, serial_in);
  StepInputs prefetch_in = in;
  prefetch_in.hidden_fraction = kPrefetchHiddenFraction;
  const double prefetch_ms = PredictStep(cal, model, gpu, prefetch_in).total_ms;
  CacheOptions o = options;
  o.max_batch = in.batch;
  const int32_t options_grid = o.prefetch_copy_blocks > 0 ? o.prefetch_copy_blocks : o.copy_blocks;

  ScheduleForecast f;
  for (const StepChoice& choice : AllowedChoices(o)) {
    ScheduleEstimate e;
    e.choice = choice;
    const int32_t grid =
        choice.prefetch_copy_blocks > 0 ? choice.prefetch_copy_blocks : options_grid;
    if (choice.planned_copy) {
      e.why =
          "not modelled: the copies of a shared indexer's later layers run beside the layers "
          "before them, and the model has no term for what they hide (measured once, 2026-11-30: "
          "+28.5% over full-hbm at batch 64 on 16 blocks against +67.5% without)";
    } else if (!choice.crosslayer_prefetch && choice.chunk_rows == 0) {
      e.modelled = true;
      e.total_ms = serial.total_ms;
      e.why = "copies inline before each layer's attention";
    } else if (!choice.crosslayer_prefetch) {
      const double n = std::ceil(static_cast<double>(in.batch) / choice.chunk_rows);
      const double a = serial.attention_ms, t = serial.transfer_ms;
      const double pipeline = (t + a) / n + (n - 1) / n * std::max(t, a);
      const double launches = model.layers * n * kChunkLaunchUs / 1e3;
      e.modelled = true;
      e.total_ms = serial.overhead_ms + serial.rest_ms + pipeline + launches;
      e.why = std::to_string(static_cast<int32_t>(n)) + " slices: copies beside attention hide " +
              Ms(a + t - pipeline) + " of " + Ms(t) + " of transfer, for " + Ms(launches) +
              " of launches";
    } else if (choice.chunk_rows > 0) {
      e.why =
          "not modelled: the prefetch's and the chunks' side-stream copies slowed each other "
          "(measured slower than either alone)";
    } else if (grid <= 0 || grid > kBoundedPrefetchCopyBlocks) {
      e.why = "not modelled: its copies on " +
              (grid <= 0 ? std::string("every SM") : std::to_string(grid) + " blocks") +
              " take SMs from attention and the GEMMs (on every SM measured slower than serial)";
    } else {
      e.modelled = true;
      e.total_ms = prefetch_ms;
      e.why = "hides " + std::to_string(static_cast<int32_t>(kPrefetchHiddenFraction * 100)) +
              "% of the transfer behind the previous layer";
    }
    if (choice.chunk_rows < in.batch) f.candidates.push_back(e);
  }
  for (size_t i = 1; i < f.candidates.size(); ++i) {
    const ScheduleEstimate& c = f.candidates[i];
    if (c.modelled && c.total_ms < f.candidates[f.expected].total_ms) f.expected = i;
  }
  const ScheduleEstimate& best = f.candidates[f.expected];
  if (f.candidates.size() == 1) {
    f.reason = OnlySerialBecause(o, in.batch);
  } else if (serial.transfer_ms <= 0) {
    f.reason = "nothing misses: no copy to hide";
  } else if (f.expected == 0) {
    f.reason = "no other candidate is modelled faster";
  } else {
    f.reason = best.why + "; " + Ms(serial.total_ms - best.total_ms) + " below serial";
  }
  return f;
}

RequestShape CapacityRequest(const ModelShape& model, int32_t context, int32_t hot_slots) {
  RequestShape r;
  r.layers = model.layers;
  r.row_bytes = model.row_bytes;
  r.indexer_key_bytes = model.indexer_key_bytes;
  r.top_k = model.top_k;
  r.classes = model.classes;
  r.raw_window = model.raw_window;
  r.hot_slots = hot_slots;
  r.tokens = context;
  return r;
}

CapacityCase Capacity(const ModelShape& model, const GpuSpec& gpu,
                      const std::vector<MemoryTier>& tiers, int32_t context, int32_t hot_slots) {
  const RequestShape request = CapacityRequest(model, context, hot_slots);
  const double budget_gb = gpu.hbm_gb - model.weights_gb - gpu.reserved_gb;
  const int64_t budget = budget_gb > 0 ? static_cast<int64_t>(budget_gb * 1e9) : 0;
  constexpr int64_t kUnbounded = int64_t{1} << 62;
  CapacityCase c;
  c.context = context;
  c.full_hbm = Footprint(KVVariant::kFullHbm, request);
  c.offloaded = Footprint(KVVariant::kSparseKV, request);
  c.full_hbm_batch = MaxBatch(KVVariant::kFullHbm, request, budget, 0, kMaxSearchBatch);
  c.offloaded_by_hbm = MaxBatch(KVVariant::kSparseKV, request, budget, kUnbounded, kMaxSearchBatch);
  for (const MemoryTier& tier : tiers) {
    c.offloaded_by_tier.push_back(MaxBatch(KVVariant::kSparseKV, request, budget,
                                           static_cast<int64_t>(tier.capacity_gb * 1e9),
                                           kMaxSearchBatch));
  }
  return c;
}

HostPoolReady ModelHostPoolReady(double pool_gb, double ready_gbps, double chunk_gib) {
  constexpr double kGiB = 1024.0 * 1024 * 1024;
  HostPoolReady r;
  if (pool_gb <= 0 || ready_gbps <= 0 || chunk_gib <= 0) return r;
  r.seconds = pool_gb / ready_gbps;
  r.chunks = static_cast<int32_t>(std::ceil(pool_gb * 1e9 / (chunk_gib * kGiB)));
  r.single_registration_fails = pool_gb * 1e9 >= 512 * kGiB;
  return r;
}

}  // namespace sparsekv
