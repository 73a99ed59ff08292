#include "tools/sparsekv/bench/e2e_report.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string_view>

namespace sparsekv::tools {
namespace {

using Json = nlohmann::ordered_json;

constexpr int32_t kSummaryContext = 32768;

std::string Fixed(double value, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", digits, value);
  return buf;
}

bool RateIs(const E2EPoint& p, double rate) {
  return p.miss_rate_target && std::abs(*p.miss_rate_target - rate) < 1e-9;
}

// The points of `variant` at the summary context passing `keep`.
std::vector<const E2EPoint*> Select(const E2EReport& r, KVVariant variant,
                                    const std::function<bool(const E2EPoint&)>& keep) {
  std::vector<const E2EPoint*> out;
  for (const E2EPoint& p : r.points) {
    if (p.variant == variant && p.context == kSummaryContext && keep(p)) out.push_back(&p);
  }
  return out;
}

const E2EPoint* Peak(const std::vector<const E2EPoint*>& points) {
  const E2EPoint* best = nullptr;
  for (const E2EPoint* p : points) {
    if (best == nullptr || p->tokens_per_s > best->tokens_per_s) best = p;
  }
  return best;
}

const E2EPoint* AtBatch(const std::vector<const E2EPoint*>& points, int32_t batch) {
  for (const E2EPoint* p : points) {
    if (p->batch == batch) return p;
  }
  return nullptr;
}

Json NullOr(bool present, double value) { return present ? Json(value) : Json(nullptr); }

// The model in a summary key: none for deepseek-v3.2 (the keys' reference model), else the
// preset's name without a "deepseek-" prefix and without its punctuation, and a separator
// ("glm-5.3" -> "glm53_", "deepseek-v4-pro" -> "v4pro_"), so that two models' keys can sit in one
// summary.
std::string ModelInfix(const std::string& preset) {
  if (preset == "deepseek-v3.2" || preset.empty()) return "";
  std::string_view name = preset;
  if (name.starts_with("deepseek-")) name.remove_prefix(std::string_view("deepseek-").size());
  std::string out;
  for (char ch : name) {
    if (std::isalnum(static_cast<unsigned char>(ch))) out += ch;
  }
  return out + "_";
}

// A context in a key: "32k", "256k"; whole multiples of 2^20 tokens as "1m", "2m".
std::string ContextKey(int32_t context) {
  if (context > 0 && context % (1 << 20) == 0) return std::to_string(context >> 20) + "m";
  return std::to_string(context / 1024) + "k";
}

// The keys over every context: sparsekv / full-hbm tokens/s at every batch full-hbm holds (the
// minimum, over the points of the miss-rate sweep at `rate`, or with no rate: the locality mode's),
// and peak over peak per context in the locality mode ("calibrated").
void AddAcrossContexts(const E2EReport& r, Json& j) {
  auto full_at = [&](int32_t context, int32_t batch) -> const E2EPoint* {
    for (const E2EPoint& p : r.points) {
      if (p.variant == KVVariant::kFullHbm && p.context == context && p.batch == batch) return &p;
    }
    return nullptr;
  };
  auto min_ratio = [&](const std::function<bool(const E2EPoint&)>& keep) {
    double worst = 0;
    bool any = false;
    for (const E2EPoint& p : r.points) {
      if (p.variant != KVVariant::kSparseKV || !keep(p)) continue;
      const E2EPoint* f = full_at(p.context, p.batch);
      if (f == nullptr || f->tokens_per_s <= 0) continue;
      const double ratio = p.tokens_per_s / f->tokens_per_s;
      worst = any ? std::min(worst, ratio) : ratio;
      any = true;
    }
    return NullOr(any, worst);
  };
  const auto calibrated = [](const E2EPoint& p) { return !p.miss_rate_target.has_value(); };
  j["e2e_min_ratio_vs_full_hbm"] = min_ratio(calibrated);
  j["e2e_min_ratio_vs_full_hbm_m5"] = min_ratio([](const E2EPoint& p) { return RateIs(p, 0.05); });
  j["e2e_min_ratio_vs_full_hbm_m20"] = min_ratio([](const E2EPoint& p) { return RateIs(p, 0.2); });
  std::map<int32_t, std::pair<double, double>> peaks;  // context -> (full-hbm, sparsekv)
  for (const E2EPoint& p : r.points) {
    if (p.variant == KVVariant::kFullHbm) {
      peaks[p.context].first = std::max(peaks[p.context].first, p.tokens_per_s);
    } else if (p.variant == KVVariant::kSparseKV && calibrated(p)) {
      peaks[p.context].second = std::max(peaks[p.context].second, p.tokens_per_s);
    }
  }
  for (const auto& [context, peak] : peaks) {
    const std::string key = "e2e_throughput_ratio_vs_full_hbm_" + ModelInfix(r.preset) +
                            ContextKey(context) + "_calibrated";
    j[key] =
        NullOr(peak.first > 0 && peak.second > 0, peak.first > 0 ? peak.second / peak.first : 0);
  }
}

// The keys of a model other than DeepSeek-V3.2 (ModelInfix not empty, e.g. "v4pro"), over the
// points of the locality mode (no miss-rate target), per context C and over all of them:
//   e2e_throughput_ratio_vs_full_hbm_<model>_<C>: sparsekv's tokens/s at its largest batch (the
//     host pool's batch) / full-hbm's peak tokens/s at C;
//   e2e_ideal_ratio_vs_full_hbm_<model>_<C>: the ideal tokens/s (batch / ideal_ms) of that same
//     sparsekv point / full-hbm's peak: what the ratio above would be with perfect overlap;
//   e2e_min_ratio_vs_full_hbm_<model>: the smallest sparsekv / full-hbm tokens/s over every
//     (context, batch) both ran, i.e. every batch full-hbm holds.
// A key whose points are missing is null.
void AddModelKeys(const E2EReport& r, Json& j) {
  const std::string model = ModelInfix(r.preset);
  if (model.empty()) return;
  struct AtContext {
    double full_peak = 0;
    const E2EPoint* largest = nullptr;  // sparsekv's largest batch
  };
  std::map<int32_t, AtContext> contexts;
  double worst = 0;
  bool any = false;
  for (const E2EPoint& p : r.points) {
    if (p.miss_rate_target.has_value()) continue;
    AtContext& at = contexts[p.context];
    if (p.variant == KVVariant::kFullHbm) {
      at.full_peak = std::max(at.full_peak, p.tokens_per_s);
    } else if (p.variant == KVVariant::kSparseKV) {
      if (at.largest == nullptr || p.batch > at.largest->batch) at.largest = &p;
      for (const E2EPoint& f : r.points) {
        if (f.variant != KVVariant::kFullHbm || f.miss_rate_target.has_value() ||
            f.context != p.context || f.batch != p.batch || f.tokens_per_s <= 0) {
          continue;
        }
        const double ratio = p.tokens_per_s / f.tokens_per_s;
        worst = any ? std::min(worst, ratio) : ratio;
        any = true;
      }
    }
  }
  for (const auto& [context, at] : contexts) {
    const std::string c = model + ContextKey(context);
    const bool both = at.full_peak > 0 && at.largest != nullptr;
    j["e2e_throughput_ratio_vs_full_hbm_" + c] =
        NullOr(both, both ? at.largest->tokens_per_s / at.full_peak : 0);
    const bool ideal = both && at.largest->ideal_ms > 0;
    j["e2e_ideal_ratio_vs_full_hbm_" + c] =
        NullOr(ideal, ideal ? at.largest->batch * 1e3 / at.largest->ideal_ms / at.full_peak : 0);
  }
  j["e2e_min_ratio_vs_full_hbm_" + model.substr(0, model.size() - 1)] = NullOr(any, worst);
}

Json Summary(const E2EReport& r) {
  auto any = [](const E2EPoint&) { return true; };
  const auto full = Select(r, KVVariant::kFullHbm, any);
  auto sparse_at = [&](double rate) {
    return Select(r, KVVariant::kSparseKV, [&](const E2EPoint& p) { return RateIs(p, rate); });
  };
  const auto m20 = sparse_at(0.2);
  const E2EPoint* page_peak =
      Peak(Select(r, KVVariant::kPageOffload, [&](const E2EPoint& p) { return RateIs(p, 0.2); }));
  const E2EPoint* full_peak = Peak(full);
  const E2EPoint* m20_peak = Peak(m20);

  double ideal = 0;
  for (const E2EPoint* p : m20) {
    if (p->ideal_ms > 0) ideal = std::max(ideal, p->batch * 1e3 / p->ideal_ms);
  }
  const E2EPoint* m20_largest = nullptr;
  for (const E2EPoint* p : m20) {
    if (m20_largest == nullptr || p->batch > m20_largest->batch) m20_largest = p;
  }
  auto overhead_b1 = [&](double rate) {
    const E2EPoint* s = AtBatch(sparse_at(rate), 1);
    const E2EPoint* f = AtBatch(full, 1);
    return NullOr(s && f && f->tpot_ms > 0, s && f ? s->tpot_ms / f->tpot_ms - 1 : 0);
  };

  Json j;
  j["e2e_throughput_ratio_vs_full_hbm_32k_m20"] =
      NullOr(full_peak && m20_peak && full_peak->tokens_per_s > 0,
             full_peak && m20_peak ? m20_peak->tokens_per_s / full_peak->tokens_per_s : 0);
  j["e2e_throughput_to_ideal_32k_m20"] =
      NullOr(m20_peak && ideal > 0, m20_peak ? m20_peak->tokens_per_s / ideal : 0);
  j["e2e_throughput_ratio_vs_page_offload_32k_m20"] =
      NullOr(page_peak && m20_peak && page_peak->tokens_per_s > 0,
             page_peak && m20_peak ? m20_peak->tokens_per_s / page_peak->tokens_per_s : 0);
  j["e2e_tpot_overhead_b1_m5"] = overhead_b1(0.05);
  j["e2e_tpot_overhead_b1_m20"] = overhead_b1(0.2);
  j["e2e_step_to_floor_ratio"] =
      NullOr(m20_largest != nullptr, m20_largest ? m20_largest->step_to_floor : 0);
  AddAcrossContexts(r, j);
  AddModelKeys(r, j);
  return j;
}

Json PointJson(const E2EPoint& p) {
  Json j;
  j["preset"] = p.preset;
  j["variant"] = VariantName(p.variant);
  j["context"] = p.context;
  j["miss_rate_target"] = p.miss_rate_target ? Json(*p.miss_rate_target) : Json(nullptr);
  j["batch"] = p.batch;
  j["max_batch"] = p.max_batch;
  j["timed_steps"] = p.timed_steps;
  j["tpot_ms"] = p.tpot_ms;
  j["tpot_min_ms"] = p.tpot_min_ms;
  j["tpot_max_ms"] = p.tpot_max_ms;
  j["tokens_per_s"] = p.tokens_per_s;
  j["hbm_bytes_per_request"] = p.hbm_bytes_per_request;
  j["host_bytes_per_request"] = p.host_bytes_per_request;
  j["hit_rate"] = p.hit_rate;
  j["miss_rate"] = p.miss_rate;
  j["misses_per_step"] = p.misses_per_step;
  j["prefetch_rows_per_step"] = p.prefetch_rows_per_step;
  j["pcie_bytes_per_step"] = p.pcie_bytes_per_step;
  j["pcie_gbps"] = p.pcie_gbps;
  j["pcie_to_ceiling"] = p.pcie_to_ceiling;
  j["attention_us_per_layer"] = p.attention_us_per_layer;
  j["proxy_us_per_layer"] = p.proxy_us_per_layer;
  j["topk_host_ms"] = p.topk_host_ms;
  j["topk_upload_ms"] = p.topk_upload_ms;
  j["floor_ms"] = p.floor_ms;
  j["ideal_ms"] = p.ideal_ms;
  j["step_to_floor"] = p.step_to_floor;
  j["hot_slots"] = p.hot_slots;
  j["resident_requests"] = p.resident_requests;
  if (!p.schedule.empty()) {
    j["schedule"] = p.schedule;
    j["schedule_reason"] = p.schedule_reason;
  }
  return j;
}

std::string Target(const E2EPoint& p) {
  return p.miss_rate_target ? Fixed(100 * *p.miss_rate_target, 0) + "%" : "-";
}

}  // namespace

std::string FormatE2ESummaryJson(const E2EReport& r) { return Summary(r).dump(2) + "\n"; }

std::string FormatE2EJson(const E2EReport& r) {
  Json j;
  j["command"] = r.command;
  j["config"] = r.config.empty() ? Json() : Json(r.config);
  if (!r.config.empty()) j["config_options"] = Json::parse(r.config_options);
  j["device"] = r.device;
  j["preset"] = r.preset;
  j["precision"] = r.precision;
  j["layers"] = r.layers;
  j["row_bytes"] = r.row_bytes;
  j["top_k"] = r.top_k;
  j["hot_slots"] = r.hot_slots;
  j["window"] = r.window;
  j["page_tokens"] = r.page_tokens;
  j["offload_page_tokens"] = r.offload_page_tokens;
  j["heads"] = r.heads;
  j["proxy"] = {{"enabled", r.proxy},
                {"label", "proxy: one bf16 weight-streaming GEMM per layer, not the model"},
                {"weights_gb_per_step", r.proxy_weights_gb},
                {"bytes_per_layer", r.proxy_bytes_per_layer}};
  j["hbm_budget_gb"] = r.hbm_budget_gb;
  j["host_pool_gb"] = r.host_pool_gb;
  j["host_pool_pinned_gb"] = r.host_pool_pinned_gb;
  j["host_pool_ready_s"] = r.host_pool_ready_s;
  j["host_pool_ready_gb_per_s"] = r.host_pool_ready_gb_per_s;
  j["indexer_keys"] = "charged to every variant's HBM budget, not allocated (the engine owns them)";
  j["steps"] = r.steps;
  j["warmup_steps"] = r.warmup_steps;
  j["ceilings"] = {{"pcie_h2d_gbps", r.ceilings.pcie_h2d_gbps},
                   {"pcie_d2h_gbps", r.ceilings.pcie_d2h_gbps},
                   {"hbm_copy_gbps_read_plus_write", r.ceilings.hbm_gbps}};
  j["floor_definition"] =
      "floor_ms = attention_ms + proxy_ms + pcie_bytes / pcie_h2d_gbps + hbm_bytes / "
      "hbm_copy_gbps; attention and proxy as measured at the same batch, bytes per "
      "tools/sparsekv/e2e_plan.h Traffic()";
  j["ideal_definition"] =
      "ideal_ms = max(attention_ms + proxy_ms + hbm_bytes / hbm_copy_gbps, pcie_bytes / "
      "pcie_h2d_gbps): PCIe transfers perfectly overlapped; ideal throughput = max over batches "
      "of batch / ideal_ms";
  Json checks = Json::array();
  for (const E2ECheck& c : r.checks) {
    checks.push_back({{"preset", c.preset},
                      {"variant", VariantName(c.variant)},
                      {"context", c.context},
                      {"batch", c.batch},
                      {"steps", c.steps},
                      {"bytes_compared", c.bytes_compared},
                      {"bytes_different", c.bytes_different},
                      {"output_nonzero", c.output_nonzero},
                      {"passed", c.passed()}});
  }
  j["checks"] = checks;
  Json points = Json::array();
  for (const E2EPoint& p : r.points) points.push_back(PointJson(p));
  j["points"] = points;
  j["notes"] = r.notes;
  j["summary"] = Summary(r);
  return j.dump(1) + "\n";
}

std::string FormatE2ECsv(const E2EReport& r) {
  const Json first = PointJson(E2EPoint{});
  std::string out;
  for (auto it = first.begin(); it != first.end(); ++it) {
    out += (it == first.begin() ? "" : ",") + it.key();
  }
  out += "\n";
  for (const E2EPoint& p : r.points) {
    const Json j = PointJson(p);
    bool head = true;
    for (const auto& [key, value] : j.items()) {
      out += head ? "" : ",";
      head = false;
      if (value.is_string()) {
        out += value.get<std::string>();
      } else if (!value.is_null()) {
        out += value.dump();
      }
    }
    out += "\n";
  }
  return out;
}

std::string FormatE2ETable(const E2EReport& r) {
  std::string out = "sparsekv bench (end to end): " + r.device + "\n";
  out += "  " + r.preset + ", " + r.precision + " (" + std::to_string(r.row_bytes) + " B rows), " +
         std::to_string(r.layers) + " layers, top-k " + std::to_string(r.top_k) + ", " +
         std::to_string(r.heads) + " heads; HBM budget " + Fixed(r.hbm_budget_gb, 0) +
         " GB for KV, host pool " + Fixed(r.host_pool_gb, 0) + " GB\n";
  out += "  proxy: " +
         (r.proxy ? Fixed(r.proxy_weights_gb, 0) +
                        " GB of weights streamed per step (a proxy for "
                        "the rest of the model, not the model)"
                  : std::string("off")) +
         "\n";
  if (!r.config.empty()) out += "  config: " + r.config_summary + "\n";
  out += "  ceilings: pinned H2D " + Fixed(r.ceilings.pcie_h2d_gbps, 1) + " GB/s, D2H " +
         Fixed(r.ceilings.pcie_d2h_gbps, 1) + " GB/s, device copy " +
         Fixed(r.ceilings.hbm_gbps, 0) + " GB/s (read + write)\n";
  for (const E2ECheck& c : r.checks) {
    out += "  check " + std::string(VariantName(c.variant)) + " vs full-hbm @" +
           std::to_string(c.context / 1024) + "K, batch " + std::to_string(c.batch) + ", " +
           std::to_string(c.steps) + " steps, all layers: " +
           (c.passed() ? "PASS (bit-identical attention output)"
                       : "FAIL (" + std::to_string(c.bytes_different) + " of " +
                             std::to_string(c.bytes_compared) + " bytes differ" +
                             (c.output_nonzero ? "" : ", output all zero") + ")") +
           "\n";
  }
  char line[512];
  std::snprintf(line, sizeof(line), "  %-12s %5s %5s %5s %9s %9s %8s %7s %7s %9s %6s %8s %8s %6s\n",
                "variant", "ctx", "miss", "batch", "TPOT ms", "tok/s", "HBM/req", "hit %", "miss %",
                "PCIe GB/s", "/ceil", "attn us", "proxy us", "/floor");
  out += line;
  for (const E2EPoint& p : r.points) {
    std::snprintf(
        line, sizeof(line),
        "  %-12s %4dK %5s %5d %9.2f %9.0f %7.2fG %7.1f %7.1f %9.1f %6.2f %8.1f %8.1f %6.2f\n",
        std::string(VariantName(p.variant)).c_str(), p.context / 1024, Target(p).c_str(), p.batch,
        p.tpot_ms, p.tokens_per_s, p.hbm_bytes_per_request / 1e9, 100 * p.hit_rate,
        100 * p.miss_rate, p.pcie_gbps, p.pcie_to_ceiling, p.attention_us_per_layer,
        p.proxy_us_per_layer, p.step_to_floor);
    out += line;
  }
  if (std::any_of(r.points.begin(), r.points.end(),
                  [](const E2EPoint& p) { return p.variant == KVVariant::kPageOffload; })) {
    out += "  (page-offload: hit % and miss % count pages of " +
           std::to_string(r.offload_page_tokens) + " tokens, a miss being a page copied)\n";
  }
  for (const std::string& n : r.notes) out += "  note: " + n + "\n";
  out += "  summary: " + Summary(r).dump() + "\n";
  return out;
}

}  // namespace sparsekv::tools
