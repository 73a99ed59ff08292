#include "sparsekv/planner.h"

#include <algorithm>
#include <array>
#include <cmath>
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

std::vector<MemoryTier> DefaultTiers() {
  return {{"pcie-dram", 250, 55},
          {"cxl", 500, 50},
          {"nvlink-c2c", 480, 450},
          {"scaleup-pool", 4000, 450}};
}

StepTime PredictStep(const Calibration& cal, const ModelShape& model, const GpuSpec& gpu,
                     const StepInputs& in) {
  const double b = in.batch;
  const double layers = model.layers;
  const double weight_bytes = model.weights_gb * 1e9 / layers;
  const double stream_us = weight_bytes / (cal.weight_gbps * 1e3);
  const double compute_us =
      gpu.flops_tflops > 0 ? b * 2 * weight_bytes / model.bytes_per_param / (gpu.flops_tflops * 1e6)
                           : 0;
  const double attention_us = cal.attention_fixed_us + cal.attention_per_request_us * b;
  const double rest_us = std::max(stream_us, compute_us) + cal.rest_per_request_us * b;
  const VariantCost& cost = cal.cost(in.variant);
  const double overhead_us = cost.fixed_us + cost.per_request_us * b;

  double rows = 0;  // fetched per layer
  if (in.variant == KVVariant::kSparseKV) rows = b * in.miss_rate * model.top_k;
  if (in.variant == KVVariant::kNoCache) rows = b * model.top_k;
  // A tier's gather reaches the fraction of its link that the calibrated gather reached of its own.
  const double gbps = in.link_gbps > 0 ? in.link_gbps * cal.gather_efficiency() : cost.gather_gbps;
  const double transfer_us = rows > 0 && gbps > 0 ? rows * model.row_bytes / (gbps * 1e3) : 0;

  StepTime t;
  t.attention_ms = layers * attention_us / 1e3;
  t.rest_ms = layers * rest_us / 1e3;
  t.overhead_ms = layers * overhead_us / 1e3;
  t.transfer_ms = layers * transfer_us / 1e3;
  const double compute_ms = t.attention_ms + t.rest_ms;
  t.total_ms = t.overhead_ms +
               std::max(compute_ms + (1 - in.hidden_fraction) * t.transfer_ms, t.transfer_ms);
  const std::array<std::pair<double, const char*>, 4> parts = {{{t.rest_ms, "weights"},
                                                                {t.attention_ms, "attention"},
                                                                {t.overhead_ms, "overhead"},
                                                                {t.transfer_ms, "transfer"}}};
  t.binding = std::max_element(parts.begin(), parts.end(), [](const auto& a, const auto& c) {
                return a.first < c.first;
              })->second;
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
    int32_t b = 0;
    for (point.batch = 1; point.batch <= kMaxSearchBatch; ++point.batch) {
      if (PredictStep(cal, model, gpu, point).total_ms > tpot_slo_ms) break;
      b = point.batch;
    }
    limits.by_latency = b;
  }
  return limits;
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
