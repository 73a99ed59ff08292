#include "tools/sparsekv/plan/plan_command.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>
#include <tuple>
#include <utility>

#include "sparsekv/kv_footprint.h"
#include "sparsekv/options.h"
#include "sparsekv/planner_calibration.h"
#include "tools/sparsekv/common/config_file.h"
#include "tools/sparsekv/common/exit_codes.h"
#include "tools/sparsekv/common/output_file.h"
#include "tools/sparsekv/common/preset_flags.h"
#include "tools/sparsekv/common/preset_layers.h"
#include "tools/sparsekv/common/validators.h"

namespace sparsekv::tools {

using Json = nlohmann::json;

// One modelled configuration: a variant on a tier at a context and miss rate, swept over batches
// 1, 2, 4, ... up to what HBM and the tier's capacity admit (points past the SLO included, marked).
struct PlanPoint {
  int32_t batch = 0;
  StepTime step;
  double tokens_per_s = 0;
  bool within_slo = true;
  std::optional<ScheduleForecast> schedule;  // sparsekv only
};
struct PlanCase {
  std::string tier;  // "hbm" for the full-HBM baseline
  KVVariant variant = KVVariant::kSparseKV;
  int32_t context = 0;
  double miss_rate = 0;
  BatchLimits limits;
  std::vector<PlanPoint> points;
  PlanPoint best;                      // the highest throughput within every limit; batch 0 if none
  std::optional<KindStepBytes> bytes;  // per request and step: a model with layer classes only
};

namespace {

std::string Format(const char* fmt, auto... args) {
  std::string text(std::snprintf(nullptr, 0, fmt, args...), '\0');
  std::snprintf(text.data(), text.size() + 1, fmt, args...);
  return text;
}

std::string Limit(int32_t v) { return v >= kMaxSearchBatch ? "-" : std::to_string(v); }

PlanCase Model(const Calibration& cal, const ModelShape& model, const GpuSpec& gpu,
               const MemoryTier& tier, KVVariant variant, int32_t context, double miss_rate,
               int32_t hot_slots, double slo_ms, double hidden_fraction,
               const CacheOptions& options) {
  PlanCase c;
  c.tier = tier.name;
  c.variant = variant;
  c.context = context;
  c.miss_rate = miss_rate;
  const RequestShape request = CapacityRequest(model, context, hot_slots);
  StepInputs in{variant, 1, miss_rate, tier.gbps, hidden_fraction, context};
  if (!model.classes.empty()) c.bytes = StepBytesPerRequest(model, variant, context, miss_rate);
  c.limits = Limits(cal, model, gpu, request, in, tier.capacity_gb, slo_ms);
  const int32_t top = std::min({c.limits.by_hbm, c.limits.by_capacity, kMaxSearchBatch});
  std::vector<int32_t> batches = SweepBatches(top);
  // The latency limit may fall between two swept batches; it is then the best point.
  const int32_t limit = c.limits.max_batch();
  if (limit > 0 && limit < top && !std::binary_search(batches.begin(), batches.end(), limit)) {
    batches.insert(std::upper_bound(batches.begin(), batches.end(), limit), limit);
  }
  for (int32_t b : batches) {
    in.batch = b;
    PlanPoint p;
    p.batch = b;
    p.step = PredictStep(cal, model, gpu, in);
    p.tokens_per_s = b / p.step.total_ms * 1e3;
    p.within_slo = b <= c.limits.by_latency;
    // The schedule's candidates follow from a manager's options, which the plan implies for
    // uniform layers only.
    if (variant == KVVariant::kSparseKV && model.classes.empty()) {
      p.schedule = ForecastSchedule(cal, model, gpu, in, options);
    }
    if (p.within_slo && p.tokens_per_s > c.best.tokens_per_s) c.best = p;
    c.points.push_back(p);
  }
  return c;
}

Json ToJson(const Calibration& c) {
  const auto cost = [](const VariantCost& v) {
    return Json{{"fixed_us_per_layer", v.fixed_us},
                {"per_request_us_per_layer", v.per_request_us},
                {"gather_gbps", v.gather_gbps}};
  };
  return {{"attention_fixed_us_per_layer", c.attention_fixed_us},
          {"attention_per_request_us_per_layer", c.attention_per_request_us},
          {"weight_stream_gbps", c.weight_gbps},
          {"rest_per_request_us_per_layer", c.rest_per_request_us},
          {"link_gbps", c.link_gbps},
          {"gather_efficiency", c.gather_efficiency()},
          {"full-hbm", cost(c.full_hbm)},
          {"sparsekv", cost(c.sparsekv)},
          {"no-cache", cost(c.no_cache)}};
}

Json ToJson(const CalibrationCheck& check) {
  Json points = Json::array();
  for (const CheckedPoint& p : check.points) {
    const MeasuredPoint& m = p.measured;
    points.push_back({{"preset", m.preset},
                      {"variant", VariantName(m.variant)},
                      {"context", m.context},
                      {"miss_rate_target", m.miss_rate_target ? Json(*m.miss_rate_target) : Json()},
                      {"batch", m.batch},
                      {"measured_tpot_ms", m.tpot_ms},
                      {"predicted_tpot_ms", p.predicted_ms},
                      {"error_pct", p.error_pct}});
  }
  return {{"max_abs_error_pct", check.max_abs_error_pct},
          {"median_abs_error_pct", check.median_abs_error_pct},
          {"points", points}};
}

Json ToJson(const ScheduleForecast& f) {
  Json candidates = Json::array();
  for (const ScheduleEstimate& e : f.candidates) {
    candidates.push_back({{"choice", e.choice.ToString()},
                          {"modelled", e.modelled},
                          {"expected_ms", e.modelled ? Json(e.total_ms) : Json()},
                          {"why", e.why}});
  }
  return {{"candidates", candidates},
          {"expected", f.candidates[f.expected].choice.ToString()},
          {"expected_ms", f.candidates[f.expected].total_ms},
          {"reason", f.reason}};
}

Json ToJson(const KindStepBytes& b) {
  return {{"offloaded_attention", b.offloaded_attention},
          {"resident_attention", b.resident_attention},
          {"window_attention", b.window_attention},
          {"indexer", b.indexer},
          {"fetched", b.fetched},
          {"appended", b.appended}};
}

Json ToJson(const PlanCase& c) {
  const auto point = [](const PlanPoint& p) {
    return Json{{"batch", p.batch},
                {"tpot_ms", p.step.total_ms},
                {"tokens_per_s", p.tokens_per_s},
                {"ideal_tpot_ms", p.step.ideal_ms},
                {"ideal_tokens_per_s", p.batch / p.step.ideal_ms * 1e3},
                {"attention_ms", p.step.attention_ms},
                {"indexer_ms", p.step.indexer_ms},
                {"rest_ms", p.step.rest_ms},
                {"overhead_ms", p.step.overhead_ms},
                {"transfer_ms", p.step.transfer_ms},
                {"binding", p.step.binding},
                {"within_slo", p.within_slo},
                {"schedule", p.schedule ? ToJson(*p.schedule) : Json()}};
  };
  Json points = Json::array();
  for (const PlanPoint& p : c.points) points.push_back(point(p));
  const auto limit = [](int32_t v) { return v >= kMaxSearchBatch ? Json() : Json(v); };
  return {{"tier", c.tier},
          {"variant", VariantName(c.variant)},
          {"context", c.context},
          {"miss_rate", c.variant == KVVariant::kSparseKV ? Json(c.miss_rate) : Json()},
          {"max_batch_by_hbm", limit(c.limits.by_hbm)},
          {"max_batch_by_capacity", limit(c.limits.by_capacity)},
          {"max_batch_by_latency", limit(c.limits.by_latency)},
          {"max_batch", limit(c.limits.max_batch())},
          {"binding_limit", c.limits.binding()},
          {"best", c.best.batch > 0 ? point(c.best) : Json()},
          {"bytes_per_request", c.bytes ? ToJson(*c.bytes) : Json()},
          {"points", points}};
}

// An SLO that no batch meets leaves batch 0: InvalidArgument when it is so for every case, a line
// on `out` when it is so for some.
Status SayWhereNoBatchMeetsTheSlo(const std::vector<PlanCase>& cases, double slo_ms,
                                  std::ostream& out) {
  if (slo_ms <= 0) return Status::Ok();
  int32_t none = 0, swept = 0;  // cases with batches to try (else HBM or capacity bind)
  double fastest_ms = -1;
  for (const PlanCase& c : cases) {
    if (c.points.empty()) continue;
    ++swept;
    if (c.best.batch > 0) continue;
    ++none;
    for (const PlanPoint& p : c.points) {
      if (fastest_ms < 0 || p.step.total_ms < fastest_ms) fastest_ms = p.step.total_ms;
    }
  }
  const std::string fastest =
      fastest_ms >= 0 ? Format("; their fastest step (batch 1) takes %.2f ms", fastest_ms) : "";
  if (none > 0 && none == swept) {
    return InvalidArgument(Format("no batch meets --tpot-slo-ms %g in any case", slo_ms) + fastest +
                           ": raise --tpot-slo-ms (0: no limit)");
  }
  if (none > 0) {
    out << Format("  --tpot-slo-ms %g: no batch meets it in %d of %d cases (batch 0 below)", slo_ms,
                  none, swept)
        << fastest << ".\n";
  }
  return Status::Ok();
}

// Whether `preset`'s layers differ in kind, cadence, keys or groups from the uniform layers the
// calibration was measured on (DeepSeek-V4, GLM-5.3): the plan then models each kind.
bool HasLayerKinds(const ModelPreset& preset) {
  if (!CheckToolsDriveLayers(preset.geometry(), preset.raw_window, ToolLayers::kOffloadedOnly).ok())
    return true;
  const std::vector<LayerClass> classes = LayerClassesOf(preset);
  if (classes.size() != 1) return true;
  const LayerClass& c = classes[0];
  return c.entry_tokens != 1 || c.index_groups != c.layers ||
         (preset.indexer_key_bytes > 0 && c.keyed_layers != c.layers);
}

// What the model of layers of several kinds takes from the calibration, and how (PredictKindStep).
std::string KindStepText(const Calibration& c) {
  return Format(
      "\nStep per layer kind: PROJECTED from DeepSeek-V3.2's measured constants (the calibration "
      "above, fitted on an H200 to uniform layers) until points of these layers are measured "
      "(docs/planning.md, \"Layers of several kinds: the step\"):\n"
      "  attention per layer %.2f us + the bytes a request's attention reads at %.1f GB/s (the "
      "fitted %.3f us per request for %.2f MB of rows, written as a rate);\n"
      "  indexer scan: its keys at the weights' streaming rate, %.0f GB/s; misses of the "
      "offloaded layers only, at %.2f of each tier's link;\n"
      "  overhead: sparsekv's %.1f + %.2f*B us on each offloaded layer, full-hbm's %.1f + "
      "%.2f*B us on the others.\n",
      c.attention_fixed_us, c.attention_gbps(), c.attention_per_request_us,
      c.attention_bytes_per_request / 1e6, c.weight_gbps, c.gather_efficiency(),
      c.sparsekv.fixed_us, c.sparsekv.per_request_us, c.full_hbm.fixed_us,
      c.full_hbm.per_request_us);
}

// Per context: what one request moves per step, by layer kind (StepBytesPerRequest).
std::string KindBytesTable(const std::vector<PlanCase>& cases) {
  std::string out = Format(
      "\nBytes per request and step (MB): what attention reads in the offloaded (CSA), resident "
      "(HCA) and window-only layers, the indexer's scan of its keys, the misses fetched from the "
      "tier and the new entries written back\n  %8s %5s %10s %10s %10s %10s %10s %10s\n",
      "context", "miss", "offloaded", "resident", "window", "indexer", "fetched", "appended");
  std::set<std::pair<int32_t, double>> shown;  // the tiers do not change the bytes
  for (const PlanCase& c : cases) {
    if (!c.bytes || c.variant != KVVariant::kSparseKV) continue;
    if (!shown.insert({c.context, c.miss_rate}).second) continue;
    const KindStepBytes& b = *c.bytes;
    out += Format("  %8d %5.2f %10.2f %10.2f %10.2f %10.2f %10.2f %10.3f\n", c.context, c.miss_rate,
                  b.offloaded_attention / 1e6, b.resident_attention / 1e6, b.window_attention / 1e6,
                  b.indexer / 1e6, b.fetched / 1e6, b.appended / 1e6);
  }
  return out;
}

// Every swept point: TPOT and tokens/s per batch, serial (or at --hidden-fraction) and ideal (the
// transfer wholly hidden), with the step's parts.
std::string KindStepTable(const std::vector<PlanCase>& cases) {
  std::string out = Format(
      "\nTPOT and throughput per batch (ideal: the transfer wholly hidden behind compute; * past "
      "the SLO)\n  %8s %-13s %5s %6s %9s %9s %9s %9s %8s %8s %8s %8s %8s  %s\n",
      "context", "tier", "miss", "batch", "tpot", "tok/s", "ideal", "ideal t/s", "attn", "indexer",
      "weights", "overhd", "xfer", "bound by");
  for (const PlanCase& c : cases) {
    for (const PlanPoint& p : c.points) {
      const StepTime& t = p.step;
      out += Format(
          "  %8d %-13s %5s %5d%s %7.2fms %9.0f %7.2fms %9.0f %6.2fms %6.2fms %6.2fms %6.2fms "
          "%6.2fms  %s\n",
          c.context, c.tier.c_str(),
          c.variant == KVVariant::kSparseKV ? Format("%.2f", c.miss_rate).c_str() : "-", p.batch,
          p.within_slo ? " " : "*", t.total_ms, p.tokens_per_s, t.ideal_ms,
          p.batch / t.ideal_ms * 1e3, t.attention_ms, t.indexer_ms, t.rest_ms, t.overhead_ms,
          t.transfer_ms, t.binding.c_str());
    }
  }
  return out;
}

// The machine a plan is for, into its JSON: the GPU, the weights and the memory tiers.
void PutMachine(Json& json, const GpuSpec& gpu, const ModelShape& model,
                const std::vector<MemoryTier>& tiers) {
  json["gpu"] = {{"hbm_gb", gpu.hbm_gb},
                 {"reserved_gb", gpu.reserved_gb},
                 {"tflops", gpu.flops_tflops},
                 {"weights_gb", model.weights_gb}};
  json["tiers"] = Json::array();
  for (const MemoryTier& t : tiers) {
    json["tiers"].push_back({{"name", t.name}, {"capacity_gb", t.capacity_gb}, {"gbps", t.gbps}});
  }
}

// Start-up: the time to a ready host pool of each tier's capacity, and of 1 and 2 TB, at
// `ready_gbps`. Printed to `out`; returned as JSON.
Json HostPoolsReady(const std::vector<MemoryTier>& tiers, double ready_gbps, std::ostream& out) {
  out << Format(
      "Host pool start-up at %.2f GB/s (--host-ready-gbps), in chunks of 64 GiB "
      "(docs/host-memory.md):\n",
      ready_gbps);
  Json json = Json::array();
  std::vector<std::pair<std::string, double>> pools;
  for (const MemoryTier& t : tiers) pools.emplace_back(t.name, t.capacity_gb);
  pools.emplace_back("1 TB", 1000);
  pools.emplace_back("2 TB", 2000);
  for (const auto& [name, gb] : pools) {
    const HostPoolReady r = ModelHostPoolReady(gb, ready_gbps);
    out << Format("  %-12s %7.0f GB: ready in %6.1f min, %3d chunks%s\n", name.c_str(), gb,
                  r.seconds / 60, r.chunks,
                  r.single_registration_fails ? " (one cudaHostRegister of it would fail)" : "");
    json.push_back({{"pool", name},
                    {"pool_gb", gb},
                    {"seconds", r.seconds},
                    {"chunks", r.chunks},
                    {"single_registration_fails", r.single_registration_fails}});
  }
  return json;
}

std::string CheckTable(const CalibrationCheck& check, const char* title) {
  std::string out = std::string(title) + "\n" +
                    Format("  %-14s %-9s %8s %6s %6s %10s %10s %8s\n", "preset", "variant",
                           "context", "miss", "batch", "measured", "predicted", "error");
  for (const CheckedPoint& p : check.points) {
    const MeasuredPoint& m = p.measured;
    out += Format("  %-14s %-9s %8d %6s %6d %8.2fms %8.2fms %+7.1f%%\n", m.preset.c_str(),
                  std::string(VariantName(m.variant)).c_str(), m.context,
                  m.miss_rate_target ? Format("%.2f", *m.miss_rate_target).c_str() : "-", m.batch,
                  m.tpot_ms, p.predicted_ms, p.error_pct);
  }
  return out + Format("  max |error| %.1f%%, median |error| %.1f%% over %zu points\n",
                      check.max_abs_error_pct, check.median_abs_error_pct, check.points.size());
}

std::string CalibrationText(const Calibration& c) {
  return Format(
      "Calibration (per layer): attention %.2f + %.3f*B us; rest of model: weights at %.0f GB/s "
      "+ %.3f*B us\n  overhead full-hbm %.1f + %.2f*B us; sparsekv %.1f + %.2f*B us, gather "
      "%.1f GB/s; no-cache %.1f + %.2f*B us, gather %.1f GB/s\n  gather efficiency %.2f of the "
      "%.1f GB/s link (applied to every tier)\n",
      c.attention_fixed_us, c.attention_per_request_us, c.weight_gbps, c.rest_per_request_us,
      c.full_hbm.fixed_us, c.full_hbm.per_request_us, c.sparsekv.fixed_us,
      c.sparsekv.per_request_us, c.sparsekv.gather_gbps, c.no_cache.fixed_us,
      c.no_cache.per_request_us, c.no_cache.gather_gbps, c.gather_efficiency(), c.link_gbps);
}

std::string PlanTable(const std::vector<PlanCase>& cases, double slo_ms) {
  std::string out = Format(
      "\nMax batch per GPU and best throughput (TPOT SLO %s)\n  %8s %-13s %5s %6s %6s %6s "
      "%-8s %9s %9s %-9s %7s  %s\n",
      slo_ms > 0 ? Format("%.0f ms", slo_ms).c_str() : "none", "context", "tier", "miss", "hbm",
      "cap", "slo", "limit", "tpot", "tok/s", "bound by", "vs hbm", "schedule");
  double baseline = 0;
  for (const PlanCase& c : cases) {
    if (c.variant == KVVariant::kFullHbm) baseline = c.best.tokens_per_s;
    const std::string gain = baseline > 0 && c.variant != KVVariant::kFullHbm
                                 ? Format("%.2fx", c.best.tokens_per_s / baseline)
                                 : "";
    const std::string schedule =
        c.best.schedule ? c.best.schedule->candidates[c.best.schedule->expected].choice.ToString()
                        : "-";
    out += Format(
        "  %8d %-13s %5s %6s %6s %6s %-8s %7.1fms %9.0f %-9s %7s  %s\n", c.context, c.tier.c_str(),
        c.variant == KVVariant::kSparseKV ? Format("%.2f", c.miss_rate).c_str() : "-",
        Limit(c.limits.by_hbm).c_str(), Limit(c.limits.by_capacity).c_str(),
        Limit(c.limits.by_latency).c_str(), c.limits.binding().c_str(), c.best.step.total_ms,
        c.best.tokens_per_s, c.best.batch > 0 ? c.best.step.binding.c_str() : "-", gain.c_str(),
        schedule.c_str());
  }
  return out;
}

// Per sparsekv row of PlanTable, at its best batch: the step schedule's candidates with the time
// the model expects of each, and the one it expects to win, with why.
std::string ScheduleTable(const std::vector<PlanCase>& cases, const CacheOptions& o,
                          const std::string& config_path) {
  std::string out =
      "\nStep schedule at each row's best batch: the candidates the library would measure "
      "(AllowedChoices) with the step the model expects of each, the expected winner (*) and "
      "why; the library measures them and may choose otherwise (docs/planning.md)\n" +
      Format(
          "  options%s: layers_per_index %d, max_prefetch %d, copy_chunk_rows %d, copy_blocks "
          "%d, prefetch_copy_blocks %d\n",
          config_path.empty() ? "" : (" (--config " + config_path + ")").c_str(),
          o.layers_per_index, o.max_prefetch, o.copy_chunk_rows, o.copy_blocks,
          o.prefetch_copy_blocks);
  for (const PlanCase& c : cases) {
    if (!c.best.schedule) continue;
    const ScheduleForecast& f = *c.best.schedule;
    std::string list;
    int32_t unmodelled = 0, planned = 0;
    for (size_t i = 0; i < f.candidates.size(); ++i) {
      const ScheduleEstimate& e = f.candidates[i];
      if (!e.modelled) {
        ++unmodelled;
        planned += e.choice.planned_copy;
        continue;
      }
      list += Format("%s%s%s %.2f ms", list.empty() ? "" : ", ", e.choice.ToString().c_str(),
                     i == f.expected ? "*" : "", e.total_ms);
    }
    if (unmodelled > 0) {
      std::string which = unmodelled > planned ? "the prefetch on every SM, or with chunks" : "";
      if (planned > 0) which += (which.empty() ? "" : "; ") + std::string("the planned copy");
      list += Format("; %d not modelled (%s)", unmodelled, which.c_str());
    }
    out += Format("  %8d %-13s %5.2f batch %4d: %s\n  %36s %s\n", c.context, c.tier.c_str(),
                  c.miss_rate, c.best.batch, list.c_str(), "",
                  f.candidates[f.expected].choice.ToString().append(": ").append(f.reason).c_str());
  }
  return out;
}

// What a manager with a budget-sized hot cache (device_budget_bytes, hot_slots = 0) would
// choose per tier and context: the batch the tier allows, the HBM left for the hot cache, the
// slots that follow. Printed to `out`; returned as JSON.
Json BudgetedHotCaches(const ModelShape& model, const GpuSpec& gpu,
                       const std::vector<MemoryTier>& tiers, const std::vector<int32_t>& contexts,
                       int32_t hot_slots, std::ostream& out) {
  out << "Hot cache sized by the budget (hot_slots = 0, the manager keeping the indexer keys; "
         "docs/residency.md): the batch the tier holds, the KV budget less that batch's other "
         "device state for the manager, then the most slots per request and layer with which "
         "that batch's blocks and keys fit:\n";
  Json json = Json::array();
  const int64_t kv_budget =
      static_cast<int64_t>((gpu.hbm_gb - model.weights_gb - gpu.reserved_gb) * 1e9);
  for (const MemoryTier& tier : tiers) {
    for (int32_t context : contexts) {
      // The fixed hot_slots only stand in: PlanBudgetedHotCache charges no block for them.
      const BudgetedHotCache b =
          PlanBudgetedHotCache(CapacityRequest(model, context, hot_slots), kv_budget,
                               static_cast<int64_t>(tier.capacity_gb * 1e9), kMaxSearchBatch);
      out << Format("  %-12s %6dK: batch %4d, manager %6.1f GB, %6d slots (vs %d fixed)\n",
                    tier.name.c_str(), context / 1024, b.max_batch, b.hot_cache_bytes / 1e9,
                    b.hot_slots, hot_slots);
      json.push_back({{"tier", tier.name},
                      {"context", context},
                      {"max_batch", b.max_batch},
                      {"hot_cache_bytes", b.hot_cache_bytes},
                      {"hot_slots", b.hot_slots},
                      {"per_request_bytes", b.per_request_bytes}});
    }
  }
  return json;
}

// The capacity of a preset whose layers differ in kind (DeepSeek-V4, GLM-5.3;
// docs/deepseek-v4.md): per context, the requests per GPU with every entry, key and window in HBM,
// and with the offloaded layers' entries in each tier, from the footprint alone. Printed to
// `out`; returned as JSON.
Json CapacityReport(const ModelPreset& preset, const ModelShape& model, const GpuSpec& gpu,
                    const std::vector<MemoryTier>& tiers, const std::vector<int32_t>& contexts,
                    int32_t hot_slots, std::ostream& out) {
  out << Format(
      "%s: %d layers (%d offloaded, %d resident, %d window-only), %d-B entries, top-k %d, raw "
      "window %d\n  weights %.2f GB per GPU, %.1f GB of HBM for KV; a hot cache of %d entries "
      "per offloaded layer\n",
      preset.name.c_str(), preset.num_layers, preset.layers_of(LayerKind::kOffloaded),
      preset.layers_of(LayerKind::kResident), preset.layers_of(LayerKind::kWindowOnly),
      preset.row_bytes, preset.top_k, preset.raw_window, model.weights_gb,
      gpu.hbm_gb - model.weights_gb - gpu.reserved_gb, hot_slots);
  out << "\nCapacity per GPU in requests, from the footprint per layer kind\n"
      << Format("  %8s %10s %8s %10s %10s %8s", "context", "HBM/req", "full-hbm", "offl. HBM",
                "host/req", "by HBM");
  for (const MemoryTier& t : tiers) out << Format(" %12s", t.name.c_str());
  out << "\n";
  Json json = Json::array();
  for (int32_t context : contexts) {
    const CapacityCase c = Capacity(model, gpu, tiers, context, hot_slots);
    out << Format("  %8d %8.0fMB %8d %8.0fMB %8.2fGB %8d", context, c.full_hbm.hbm_bytes / 1e6,
                  c.full_hbm_batch, c.offloaded.hbm_bytes / 1e6, c.offloaded.host_bytes / 1e9,
                  c.offloaded_by_hbm);
    Json by_tier = Json::array();
    for (size_t i = 0; i < tiers.size(); ++i) {
      out << Format(" %12d", c.offloaded_by_tier[i]);
      by_tier.push_back({{"tier", tiers[i].name}, {"max_batch", c.offloaded_by_tier[i]}});
    }
    out << "\n";
    json.push_back({{"context", context},
                    {"full_hbm_bytes_per_request", c.full_hbm.hbm_bytes},
                    {"full_hbm_max_batch", c.full_hbm_batch},
                    {"offloaded_hbm_bytes_per_request", c.offloaded.hbm_bytes},
                    {"offloaded_host_bytes_per_request", c.offloaded.host_bytes},
                    {"offloaded_max_batch_by_hbm", c.offloaded_by_hbm},
                    {"offloaded_max_batch_by_tier", by_tier}});
  }
  out << "  HBM/req: every entry, key and window in HBM; offl.: the offloaded layers' entries in "
         "the tier, the rest in HBM;\n  per tier: the batch both HBM and the tier's capacity "
         "hold.\n";
  return json;
}

}  // namespace

std::string CalibrationTable(const Calibration& c) {
  return "| parameter | value |\n|---|---|\n" +
         Format("| attention per layer | %.2f µs + %.3f µs × B |\n", c.attention_fixed_us,
                c.attention_per_request_us) +
         Format("| rest of model (proxy) | weights streamed at %.0f GB/s + %.3f µs × B |\n",
                c.weight_gbps, c.rest_per_request_us) +
         Format("| full-hbm overhead | %.1f + %.2f × B µs per layer |\n", c.full_hbm.fixed_us,
                c.full_hbm.per_request_us) +
         Format("| sparsekv overhead | %.1f + %.2f × B µs per layer |\n", c.sparsekv.fixed_us,
                c.sparsekv.per_request_us) +
         Format(
             "| sparsekv gather | %.1f GB/s effective (%.2f of the measured %.1f GB/s "
             "pinned-memcpy ceiling) |\n",
             c.sparsekv.gather_gbps, c.gather_efficiency(), c.link_gbps) +
         Format(
             "| no-cache | %.1f µs per layer, gather %.1f GB/s (its per-request cost and its "
             "gather are both ∝ B and cannot be told apart: all charged to the gather) |\n",
             c.no_cache.fixed_us, c.no_cache.gather_gbps);
}

StatusOr<MemoryTier> ParseTier(const std::string& text) {
  std::istringstream in(text);
  MemoryTier t;
  std::string capacity, gbps;
  if (std::getline(in, t.name, ':') && std::getline(in, capacity, ':') && std::getline(in, gbps) &&
      !t.name.empty()) {
    try {
      size_t used_c = 0, used_g = 0;
      t.capacity_gb = std::stod(capacity, &used_c);
      t.gbps = std::stod(gbps, &used_g);
      if (used_c == capacity.size() && used_g == gbps.size() && t.capacity_gb > 0 && t.gbps > 0) {
        return t;
      }
    } catch (const std::exception&) {
    }
  }
  return InvalidArgument("--tier '" + text +
                         "': expected NAME:CAPACITY_GB:GBPS with positive numbers, e.g. "
                         "cxl:500:50");
}

PlanCommand::PlanCommand(CLI::App& parent) {
  app_ = parent.add_subcommand(
      "plan",
      "Capacity and bandwidth model of decode with sparse KV offloading: max batch per GPU by "
      "HBM, tier capacity and TPOT SLO; TPOT and throughput vs batch; across tiers and contexts.");
  app_->add_option("--preset", preset_, "model shape")->check(KnownPreset())->capture_default_str();
  app_->add_option("--precision", precision_,
                   "KV row format: fp8 (656 B; DeepSeek-V4: its 584-B entries) or bf16 (1152 B)")
      ->check(CLI::IsMember({"fp8", "bf16"}))
      ->capture_default_str();
  app_->add_option("--weights-gb", model_.weights_gb,
                   "per-GPU weight bytes streamed every step (rest-of-model cost)")
      ->check(PositiveReal())
      ->capture_default_str();
  app_->add_option("--hbm-gb", gpu_.hbm_gb, "GPU HBM capacity")
      ->check(PositiveReal())
      ->capture_default_str();
  app_->add_option("--reserved-gb", gpu_.reserved_gb, "HBM for activations and workspace")
      ->check(AtLeast(0.0))
      ->capture_default_str();
  app_->add_option("--tflops", gpu_.flops_tflops,
                   "GPU dense bf16 TFLOP/s (bounds the rest of the model at large batches)")
      ->check(PositiveReal())
      ->capture_default_str();
  app_->add_option("--tier", tiers_,
                   "memory tier NAME:CAPACITY_GB_PER_GPU:GBPS, repeatable [default: "
                   "pcie-dram:250:55 cxl:500:50 nvlink-c2c:480:450 scaleup-pool:4000:450]");
  app_->add_option("--node-dram-gb", node_dram_gb_,
                   "host tiers of DRAM per node, comma-separated GB (e.g. 250,500,1000,2000): "
                   "each GPU holds its share (/ --gpus-per-node) over pcie-dram's link; added "
                   "to the --tier tiers (the defaults only when neither is given)")
      ->delimiter(',')
      ->check(PositiveReal());
  app_->add_option("--gpus-per-node", gpus_per_node_, "GPUs sharing a node's DRAM (--node-dram-gb)")
      ->check(AtLeast<int32_t>(1))
      ->capture_default_str();
  app_->add_option("--contexts,--context", contexts_,
                   "context lengths, comma-separated (--context is the same option)")
      ->delimiter(',')
      ->check(AtLeast<int32_t>(1))
      ->capture_default_str();
  app_->add_option("--miss-rates", miss_rates_,
                   "hot-cache miss rates, comma-separated (measure yours with `sparsekv replay`)")
      ->delimiter(',')
      ->check(Fraction())
      ->capture_default_str();
  app_->add_option("--hot-slots", hot_slots_, "hot-cache slots per request and layer")
      ->check(AtLeast<int32_t>(1))
      ->capture_default_str();
  app_->add_option("--tpot-slo-ms", tpot_slo_ms_, "TPOT limit per step (0: none)")
      ->check(AtLeast(0.0))
      ->capture_default_str();
  app_->add_option("--hidden-fraction", hidden_fraction_,
                   "share of the miss transfer hidden behind attention and the rest of the "
                   "model: 0 = serial (an indexer in every layer, copies inline); 0.50 measured "
                   "with an indexer per layer and a pipelined layer (copies by chunks of 16 "
                   "rows), 0.34 with the cross-layer prefetch; 0.6-0.77 with one top-k per 4 "
                   "layers and copies ahead on 16 blocks; 1 = the ideal")
      ->check(Fraction())
      ->capture_default_str();
  app_->add_option("--host-ready-gbps", host_ready_gbps_,
                   "rate at which a host pool is populated and pinned at start-up, for the "
                   "time to a ready pool of each tier and of 1 and 2 TB (`sparsekv bench` prints "
                   "yours as \"host arena ready: ... GB/s\"; the default is one plain "
                   "cudaHostRegister as reported to vLLM, ~700 GB in ~12 min, not measured here)")
      ->check(PositiveReal())
      ->capture_default_str();
  app_->add_option("--calibration", calibration_paths_,
                   "refit the model to `sparsekv bench --json` files and check it against them")
      ->check(CLI::ExistingFile);
  app_->add_option("--json", json_path_, "also write the results as JSON to PATH")
      ->option_text("PATH")
      ->check(NonEmpty());
  app_->add_option("--copy-chunk-rows", copy_chunk_rows_,
                   "the manager's copy_chunk_rows: the step schedule may copy and attend in "
                   "chunks of multiples of this many batch rows (0: no chunks)")
      ->check(AtLeast<int32_t>(0))
      ->capture_default_str();
  app_->add_flag("--crosslayer-prefetch", crosslayer_prefetch_,
                 "the manager's max_prefetch = top-k: the step schedule may prefetch each layer's "
                 "top-k into the next layer's hot cache");
  app_->add_option("--config", config_path_,
                   "the manager's CacheOptions from FILE, sparsekv's own JSON (docs/config.md): "
                   "its hot_slots and what the step schedule's candidates follow from "
                   "(layers_per_index, max_prefetch, copy_chunk_rows, copy grids); its geometry "
                   "and top_k must be the preset's (a flag for a key it sets is refused)")
      ->option_text("FILE")
      ->check(NonEmpty());
}

bool PlanCommand::selected() const { return app_->parsed(); }

std::vector<PlanCase> PlanCommand::Cases(const Calibration& cal, const ModelShape& model,
                                         const std::vector<MemoryTier>& tiers, int32_t hot_slots,
                                         const CacheOptions& options) const {
  std::vector<PlanCase> cases;
  const MemoryTier hbm{"hbm", 0, 0};
  for (int32_t context : contexts_) {
    cases.push_back(Model(cal, model, gpu_, hbm, KVVariant::kFullHbm, context, 0, hot_slots,
                          tpot_slo_ms_, hidden_fraction_, options));
    for (const MemoryTier& tier : tiers) {
      for (double rate : miss_rates_) {
        cases.push_back(Model(cal, model, gpu_, tier, KVVariant::kSparseKV, context, rate,
                              hot_slots, tpot_slo_ms_, hidden_fraction_, options));
      }
    }
  }
  return cases;
}

Status PlanCommand::WriteJson(Json& json, const std::vector<PlanCase>& cases) const {
  json["cases"] = Json::array();
  for (const PlanCase& c : cases) json["cases"].push_back(ToJson(c));
  if (json_path_.empty()) return Status::Ok();
  return WriteOutputFile(json_path_, json.dump(2) + "\n", "JSON");
}

int PlanCommand::RunLayerKinds(const std::string& command, const ModelPreset& preset,
                               const std::vector<MemoryTier>& tiers, std::ostream& out,
                               std::ostream& err) {
  const auto fail = [&](const Status& s, int code) {
    err << "sparsekv plan: " << s.message() << "\n";
    return code;
  };
  // The preset's weights and a hot cache of 2 x top-k (SGLang's HiSparse for DeepSeek-V4) unless
  // given.
  ModelShape model = model_;
  if (app_->count("--weights-gb") == 0 && preset.weights_per_gpu_gb > 0) {
    model.weights_gb = preset.weights_per_gpu_gb;
  }
  model.layers = preset.num_layers;
  model.row_bytes = preset.row_bytes;
  model.indexer_key_bytes = preset.indexer_key_bytes;
  model.top_k = preset.top_k;
  model.classes = LayerClassesOf(preset);
  model.raw_window = preset.raw_window;
  const int32_t hot_slots = app_->count("--hot-slots") > 0 ? hot_slots_ : 2 * preset.top_k;
  if (hot_slots < preset.top_k) {
    return fail(
        InvalidArgument("--hot-slots (" + std::to_string(hot_slots) +
                        ") must be >= the preset's top-k (" + std::to_string(preset.top_k) + ")"),
        kExitUsage);
  }
  if (!(gpu_.hbm_gb - model.weights_gb - gpu_.reserved_gb > 0)) {
    return fail(InvalidArgument(Format("no HBM is left for KV: --hbm-gb %g - weights %g - "
                                       "--reserved-gb %g",
                                       gpu_.hbm_gb, model.weights_gb, gpu_.reserved_gb)),
                kExitUsage);
  }
  // The step schedule's options are a manager's for uniform layers.
  for (const char* flag : {"--config", "--copy-chunk-rows", "--crosslayer-prefetch"}) {
    if (app_->get_option(flag)->count() > 0) {
      return fail(InvalidArgument(std::string(flag) +
                                  ": the step schedule is forecast for "
                                  "uniform layers only, not for --preset " +
                                  preset_),
                  kExitUsage);
    }
  }
  Calibration cal;
  if (!calibration_paths_.empty()) {
    StatusOr<MeasuredRun> run = ReadMeasured(calibration_paths_);
    if (!run.ok()) return fail(run.status(), kExitFailure);
    StatusOr<Calibration> fitted = FitCalibration(*run);
    if (!fitted.ok()) return fail(fitted.status(), kExitFailure);
    cal = *fitted;
  }

  Json json = {{"command", command}, {"preset", preset_}, {"precision", precision_}};
  json["capacity"] = CapacityReport(preset, model, gpu_, tiers, contexts_, hot_slots, out);

  const CacheOptions no_schedule;  // not read: no schedule is forecast for these layers
  const std::vector<PlanCase> cases = Cases(cal, model, tiers, hot_slots, no_schedule);
  out << "\n" << CalibrationText(cal) << KindStepText(cal);
  if (Status s = SayWhereNoBatchMeetsTheSlo(cases, tpot_slo_ms_, out); !s.ok()) {
    return fail(s, kExitUsage);
  }
  out << KindBytesTable(cases) << PlanTable(cases, tpot_slo_ms_)
      << "  hbm/cap/slo: max batch by the KV budget in HBM, by the tier's capacity, by the TPOT "
         "SLO;\n  bound by: the largest part of the best point's step; vs hbm: its tokens/s over "
         "the full-HBM baseline's.\n"
      << (hidden_fraction_ > 0
              ? Format("  --hidden-fraction %.2f: that share of the transfer hidden behind "
                       "compute.\n",
                       hidden_fraction_)
              : std::string("  Copies serial with compute (--hidden-fraction for overlap; the "
                            "ideal below hides them all).\n"))
      << KindStepTable(cases);
  json["host_pool_ready"] = HostPoolsReady(tiers, host_ready_gbps_, out);

  json["calibration"] = ToJson(cal);
  json["step_model"] = {
      {"projected", true},
      {"note",
       "every term projected from DeepSeek-V3.2's measured constants until points of these "
       "layers are measured"},
      {"attention_gbps_per_request", cal.attention_gbps()},
      {"attention_bytes_per_request_calibrated", cal.attention_bytes_per_request},
      {"indexer_scan_gbps", cal.weight_gbps},
      {"gather_efficiency", cal.gather_efficiency()}};
  PutMachine(json, gpu_, model, tiers);
  json["hot_slots"] = hot_slots;
  json["tpot_slo_ms"] = tpot_slo_ms_;
  json["hidden_fraction"] = hidden_fraction_;
  if (Status s = WriteJson(json, cases); !s.ok()) return fail(s, kExitFailure);
  return kExitOk;
}

int PlanCommand::Run(const std::string& command, std::ostream& out, std::ostream& err) {
  const auto fail = [&](const Status& s, int code) {
    err << "sparsekv plan: " << s.message() << "\n";
    return code;
  };
  std::vector<MemoryTier> tiers;
  for (const std::string& t : tiers_) {
    StatusOr<MemoryTier> tier = ParseTier(t);
    if (!tier.ok()) return fail(tier.status(), kExitUsage);
    // A row names its tier: two of one name (or the baseline's) could not be told apart.
    for (const MemoryTier& other : tiers) {
      if (other.name == tier->name) {
        return fail(InvalidArgument("--tier: two tiers are named '" + tier->name +
                                    "'; give each its own name"),
                    kExitUsage);
      }
    }
    if (tier->name == "hbm") {
      return fail(InvalidArgument("--tier: 'hbm' names the full-HBM baseline; call the tier "
                                  "something else"),
                  kExitUsage);
    }
    tiers.push_back(*tier);
  }
  for (double node_gb : node_dram_gb_) {
    const MemoryTier tier = NodeDramTier(node_gb, gpus_per_node_, DefaultTiers()[0].gbps);
    for (const MemoryTier& other : tiers) {
      if (other.name == tier.name) {
        return fail(InvalidArgument("--node-dram-gb: the tier '" + tier.name +
                                    "' is given twice; give each size once"),
                    kExitUsage);
      }
    }
    tiers.push_back(tier);
  }
  if (tiers.empty()) tiers = DefaultTiers();
  StatusOr<ModelPreset> preset = precision_ == "bf16"
                                     ? FindPreset(preset_, KVRowFormat::kBf16Row1152)
                                     : FindPreset(preset_);  // the model's fp8 rows or entries
  if (!preset.ok()) return fail(preset.status(), kExitUsage);
  if (Status s = CheckOutputPath("--json", json_path_); !s.ok()) return fail(s, kExitUsage);
  if (HasLayerKinds(*preset)) return RunLayerKinds(command, *preset, tiers, out, err);
  if (hot_slots_ < preset->top_k) {
    return fail(
        InvalidArgument("--hot-slots (" + std::to_string(hot_slots_) +
                        ") must be >= the preset's top-k (" + std::to_string(preset->top_k) +
                        "): a step's selection must fit in the hot cache"),
        kExitUsage);
  }
  for (int32_t context : contexts_) {
    if (context < preset->top_k) {
      return fail(
          InvalidArgument("--contexts: " + std::to_string(context) +
                          " is below the preset's top-k (" + std::to_string(preset->top_k) + ")"),
          kExitUsage);
    }
  }
  // What HBM holds for KV once the weights and the reserve are placed; every limit below is a
  // share of it.
  if (const double kv_budget_gb = gpu_.hbm_gb - model_.weights_gb - gpu_.reserved_gb;
      !(kv_budget_gb > 0)) {
    return fail(
        InvalidArgument(Format("no HBM is left for KV: --hbm-gb %g - --weights-gb %g - "
                               "--reserved-gb %g = %g GB; raise --hbm-gb or lower the "
                               "other two",
                               gpu_.hbm_gb, model_.weights_gb, gpu_.reserved_gb, kv_budget_gb)),
        kExitUsage);
  }
  // The manager the plan implies, for the step schedule's candidates: the preset's rows and
  // top-k, the hot cache, the schedule's options; a --config file's over them.
  CacheOptions options;
  options.geometry = preset->geometry();
  options.top_k = preset->top_k;
  options.hot_slots = hot_slots_;
  options.copy_chunk_rows = copy_chunk_rows_;
  options.max_prefetch = crosslayer_prefetch_ ? preset->top_k : 0;
  options.max_requests = 1;  // each point's batch, in ForecastSchedule
  options.max_context = *std::max_element(contexts_.begin(), contexts_.end());
  options.host_capacity_tokens = (int64_t{options.max_context} + options.host_page_tokens - 1) /
                                 options.host_page_tokens * options.host_page_tokens;
  if (!config_path_.empty()) {
    std::vector<FlagKey> given;
    for (const auto& [flag, key] : {std::pair{"--hot-slots", "hot_slots"},
                                    {"--copy-chunk-rows", "copy_chunk_rows"},
                                    {"--crosslayer-prefetch", "max_prefetch"}}) {
      if (app_->get_option(flag)->count() > 0) given.push_back({flag, key});
    }
    StatusOr<ConfigFile> file = ReadConfigFile(config_path_, given, options);
    if (!file.ok()) return fail(file.status(), kExitUsage);
    const CacheOptions& f = file->options;
    if (f.geometry.num_layers() != options.geometry.num_layers() ||
        f.geometry.token_bytes() != options.geometry.token_bytes() || f.top_k != options.top_k) {
      return fail(InvalidArgument(Format(
                      "--config %s: its geometry (%d layers, %lld B per "
                      "token) and top_k (%d) are not those of --preset %s "
                      "--precision %s (%d layers, %lld B, top_k %d), which "
                      "the plan models; give the preset the file describes",
                      config_path_.c_str(), f.geometry.num_layers(),
                      static_cast<long long>(f.geometry.token_bytes()), f.top_k, preset_.c_str(),
                      precision_.c_str(), options.geometry.num_layers(),
                      static_cast<long long>(options.geometry.token_bytes()), options.top_k)),
                  kExitUsage);
    }
    if (f.hot_slots < f.top_k) {
      return fail(InvalidArgument(Format("--config %s: hot_slots %d (0: chosen from the device "
                                         "budget) is not a fixed hot cache of at least top_k "
                                         "(%d) slots, which the plan models",
                                         config_path_.c_str(), f.hot_slots, f.top_k)),
                  kExitUsage);
    }
    options = f;
    hot_slots_ = f.hot_slots;
  }
  ModelShape model = model_;
  model.layers = preset->num_layers;
  model.row_bytes = preset->row_bytes;
  model.indexer_key_bytes = preset->indexer_key_bytes;
  model.top_k = preset->top_k;

  Json json = {{"command", command}, {"preset", preset_}, {"precision", precision_}};
  Calibration cal;
  if (!calibration_paths_.empty()) {
    StatusOr<MeasuredRun> run = ReadMeasured(calibration_paths_);
    if (!run.ok()) return fail(run.status(), kExitFailure);
    StatusOr<Calibration> fitted = FitCalibration(*run);
    if (!fitted.ok()) return fail(fitted.status(), kExitFailure);
    cal = *fitted;
    const CalibrationCheck check = CheckCalibration(cal, *run);
    out << CheckTable(check, "Check: predicted vs measured TPOT (serial copies, as measured)");
    json["check"] = ToJson(check);
    json["summary"] = {{"plan_max_error_pct", check.max_abs_error_pct},
                       {"plan_median_error_pct", check.median_abs_error_pct}};
    // Out of sample: each context predicted from a fit to the others, and each preset from a
    // fit to the others (a preset whose own points span one miss rate cannot fit the gather).
    std::set<std::string> contexts, presets;
    for (const MeasuredPoint& p : run->points) {
      contexts.insert(std::to_string(p.context));
      presets.insert(p.preset);
    }
    const auto context_of = [](const MeasuredPoint& p) { return std::to_string(p.context); };
    const auto preset_of = [](const MeasuredPoint& p) { return p.preset; };
    for (const auto& [name, groups, group] :
         {std::tuple{"leave_context_out", contexts, std::function(context_of)},
          std::tuple{"leave_preset_out", presets, std::function(preset_of)}}) {
      if (groups.size() < 2) continue;
      StatusOr<CalibrationCheck> held = HoldOutCalibration(*run, group, groups);
      if (!held.ok()) return fail(held.status(), kExitFailure);
      out << Format("Out of sample (%s): max |error| %.1f%%, median %.1f%% over %zu points\n", name,
                    held->max_abs_error_pct, held->median_abs_error_pct, held->points.size());
      json[name] = ToJson(*held);
    }
  }
  out << CalibrationText(cal);
  json["calibration"] = ToJson(cal);

  const std::vector<PlanCase> cases = Cases(cal, model, tiers, hot_slots_, options);
  if (Status s = SayWhereNoBatchMeetsTheSlo(cases, tpot_slo_ms_, out); !s.ok()) {
    return fail(s, kExitUsage);
  }
  out << PlanTable(cases, tpot_slo_ms_)
      << "  hbm/cap/slo: max batch by the KV budget in HBM, by the tier's capacity, by the TPOT "
         "SLO;\n  bound by: the largest part of the best point's step; vs hbm: its tokens/s over "
         "the full-HBM baseline's.\n"
      << (hidden_fraction_ > 0
              ? Format("  --hidden-fraction %.2f: that share of the transfer hidden behind "
                       "compute.\n",
                       hidden_fraction_)
              : std::string("  Copies serial with compute, as with an indexer per layer and "
                            "copies inline (--hidden-fraction for the overlap paths).\n"))
      << "  schedule: the step schedule the model expects to win at the best point (below).\n"
      << ScheduleTable(cases, options, config_path_);

  json["budgeted_hot_cache"] = BudgetedHotCaches(model, gpu_, tiers, contexts_, hot_slots_, out);

  json["host_pool_ready"] = HostPoolsReady(tiers, host_ready_gbps_, out);

  PutMachine(json, gpu_, model, tiers);
  json["hot_slots"] = hot_slots_;
  json["tpot_slo_ms"] = tpot_slo_ms_;
  json["hidden_fraction"] = hidden_fraction_;
  json["config"] = config_path_.empty() ? Json() : Json(config_path_);
  json["schedule_options"] = {{"layers_per_index", options.layers_per_index},
                              {"max_prefetch", options.max_prefetch},
                              {"copy_chunk_rows", options.copy_chunk_rows},
                              {"copy_blocks", options.copy_blocks},
                              {"prefetch_copy_blocks", options.prefetch_copy_blocks}};
  json["host_ready_gbps"] = host_ready_gbps_;
  if (Status s = WriteJson(json, cases); !s.ok()) return fail(s, kExitFailure);
  return kExitOk;
}

}  // namespace sparsekv::tools
