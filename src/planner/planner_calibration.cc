#include "sparsekv/planner_calibration.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

namespace sparsekv {
namespace {

using Json = nlohmann::json;

// Minimises sum_i ((x_i . c - y_i) / w_i)^2 over c >= 0: the normal equations solved by Gaussian
// elimination, and any coefficient that comes out negative fixed at 0 before solving again.
std::vector<double> FitNonNegative(const std::vector<std::vector<double>>& x,
                                   const std::vector<double>& y, const std::vector<double>& w) {
  const size_t n = x.empty() ? 0 : x[0].size();
  std::vector<bool> active(n, true);
  std::vector<double> c(n, 0);
  for (size_t round = 0; round < n; ++round) {
    std::vector<size_t> idx;
    for (size_t j = 0; j < n; ++j) {
      if (active[j]) idx.push_back(j);
    }
    const size_t m = idx.size();
    std::vector<std::vector<double>> a(m, std::vector<double>(m + 1, 0));
    for (size_t i = 0; i < x.size(); ++i) {
      const double s = 1 / (w[i] * w[i]);
      for (size_t r = 0; r < m; ++r) {
        for (size_t q = 0; q < m; ++q) a[r][q] += s * x[i][idx[r]] * x[i][idx[q]];
        a[r][m] += s * x[i][idx[r]] * y[i];
      }
    }
    for (size_t p = 0; p < m; ++p) {  // elimination with partial pivoting
      size_t best = p;
      for (size_t r = p + 1; r < m; ++r) {
        if (std::abs(a[r][p]) > std::abs(a[best][p])) best = r;
      }
      std::swap(a[p], a[best]);
      if (a[p][p] == 0) continue;
      for (size_t r = 0; r < m; ++r) {
        if (r == p) continue;
        const double f = a[r][p] / a[p][p];
        for (size_t q = p; q <= m; ++q) a[r][q] -= f * a[p][q];
      }
    }
    std::fill(c.begin(), c.end(), 0);
    bool negative = false;
    for (size_t r = 0; r < m; ++r) {
      c[idx[r]] = a[r][r] != 0 ? a[r][m] / a[r][r] : 0;
      if (c[idx[r]] < 0) {
        active[idx[r]] = false;
        negative = true;
      }
    }
    if (!negative) break;
  }
  for (double& v : c) v = std::max(v, 0.0);
  return c;
}

double WeightBytesPerLayer(const ModelShape& m) { return m.weights_gb * 1e9 / m.layers; }

// The modelled attention and rest of the model of a point, per layer (µs): the calibration's
// compute part, with no roofline term (the benchmark's batches stay far below it).
double ComputeUs(const Calibration& cal, const MeasuredPoint& p) {
  return cal.attention_fixed_us + cal.attention_per_request_us * p.batch +
         WeightBytesPerLayer(p.model) / (cal.weight_gbps * 1e3) + cal.rest_per_request_us * p.batch;
}

StatusOr<Json> Load(const std::string& path) {
  std::ifstream file(path);
  if (!file) return InvalidArgument("cannot read calibration file '" + path + "'");
  Json j = Json::parse(file, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return InvalidArgument("calibration file '" + path + "' is not a JSON object");
  }
  return j;
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

}  // namespace

StatusOr<MeasuredRun> ReadMeasured(const std::vector<std::string>& paths) {
  MeasuredRun run;
  for (const std::string& path : paths) {
    SPARSEKV_ASSIGN_OR_RETURN(const Json j, Load(path));
    const auto field = [&](const Json& o, const char* key) -> const Json* {
      auto it = o.find(key);
      return it == o.end() || it->is_null() ? nullptr : &*it;
    };
    const Json* points = field(j, "points");
    const Json* ceilings = field(j, "ceilings");
    const Json* proxy = field(j, "proxy");
    if (points == nullptr || ceilings == nullptr || proxy == nullptr || !points->is_array()) {
      return InvalidArgument("calibration file '" + path +
                             "' lacks points, ceilings or proxy (is it `sparsekv bench --json` "
                             "output from a GPU?)");
    }
    try {
      ModelShape model;
      model.layers = j.at("layers").get<int32_t>();
      model.row_bytes = j.at("row_bytes").get<int32_t>();
      model.top_k = j.at("top_k").get<int32_t>();
      model.weights_gb = proxy->at("weights_gb_per_step").get<double>();
      run.pcie_h2d_gbps = std::max(run.pcie_h2d_gbps, ceilings->at("pcie_h2d_gbps").get<double>());
      for (const Json& p : *points) {
        MeasuredPoint m;
        m.preset = p.at("preset").get<std::string>();
        SPARSEKV_ASSIGN_OR_RETURN(m.variant, ParseVariant(p.at("variant").get<std::string>()));
        // The planner models token-level offloading; page-granular offload is the benchmark's
        // comparison point, not a configuration it plans.
        if (m.variant == KVVariant::kPageOffload) continue;
        m.context = p.at("context").get<int32_t>();
        if (const Json* rate = field(p, "miss_rate_target"))
          m.miss_rate_target = rate->get<double>();
        m.batch = p.at("batch").get<int32_t>();
        m.tpot_ms = p.at("tpot_ms").get<double>();
        m.misses_per_step = p.at("misses_per_step").get<double>();
        m.attention_us_per_layer = p.at("attention_us_per_layer").get<double>();
        m.proxy_us_per_layer = p.at("proxy_us_per_layer").get<double>();
        m.model = model;
        if (m.batch < 1 || m.tpot_ms <= 0 || m.model.layers < 1) {
          return InvalidArgument("calibration file '" + path + "' has a point with batch < 1, " +
                                 "tpot_ms <= 0 or layers < 1");
        }
        run.points.push_back(std::move(m));
      }
    } catch (const Json::exception& e) {
      return InvalidArgument("calibration file '" + path + "': " + e.what());
    }
  }
  if (run.points.empty()) return InvalidArgument("calibration files hold no points");
  return run;
}

StatusOr<Calibration> FitCalibration(const MeasuredRun& run) {
  Calibration cal;
  cal.link_gbps = run.pcie_h2d_gbps;
  std::vector<std::vector<double>> x;
  std::vector<double> y;
  for (const MeasuredPoint& p : run.points) {
    x.push_back({1.0, static_cast<double>(p.batch)});
    y.push_back(p.attention_us_per_layer);
  }
  std::vector<double> c = FitNonNegative(x, y, y);
  cal.attention_fixed_us = c[0];
  cal.attention_per_request_us = c[1];
  // What the per-request term read: the points' top-k rows, averaged over them.
  double attention_bytes = 0;
  for (const MeasuredPoint& p : run.points) {
    attention_bytes += double{1} * p.model.top_k * p.model.row_bytes;
  }
  cal.attention_bytes_per_request = attention_bytes / run.points.size();

  x.clear();
  y.clear();
  for (const MeasuredPoint& p : run.points) {
    x.push_back({WeightBytesPerLayer(p.model) / 1e3, static_cast<double>(p.batch)});
    y.push_back(p.proxy_us_per_layer);
  }
  c = FitNonNegative(x, y, y);
  if (c[0] <= 0) return InvalidArgument("calibration: the proxy times do not grow with weights");
  cal.weight_gbps = 1 / c[0];
  cal.rest_per_request_us = c[1];

  for (KVVariant v : {KVVariant::kFullHbm, KVVariant::kSparseKV, KVVariant::kNoCache}) {
    // Unknowns: fixed µs, per-request µs, and (offloading variants) ms per GB fetched.
    const bool moves_rows = v != KVVariant::kFullHbm;
    // no-cache fetches B * top_k rows per layer: its per-request cost and its gather time are
    // both proportional to B and cannot be told apart; all of it is charged to the gather.
    const bool per_request = v != KVVariant::kNoCache;
    x.clear();
    y.clear();
    std::vector<double> w;
    for (const MeasuredPoint& p : run.points) {
      if (p.variant != v) continue;
      const double layers_ms = p.model.layers / 1e3;
      std::vector<double> row = {layers_ms, per_request ? layers_ms * p.batch : 0.0};
      if (moves_rows) row.push_back(p.misses_per_step * p.model.row_bytes / 1e9);
      x.push_back(row);
      y.push_back(p.tpot_ms - layers_ms * ComputeUs(cal, p));
      w.push_back(p.tpot_ms);
    }
    if (x.size() < x.front().size() + 1) {
      return InvalidArgument("calibration: too few points of variant " +
                             std::string(VariantName(v)) + " to fit");
    }
    c = FitNonNegative(x, y, w);
    VariantCost& cost = v == KVVariant::kFullHbm    ? cal.full_hbm
                        : v == KVVariant::kSparseKV ? cal.sparsekv
                                                    : cal.no_cache;
    cost.fixed_us = c[0];
    cost.per_request_us = c[1];
    cost.gather_gbps = moves_rows && c[2] > 0 ? 1e3 / c[2] : 0;
  }
  return cal;
}

CalibrationCheck CheckCalibration(const Calibration& cal, const MeasuredRun& run) {
  CalibrationCheck check;
  std::vector<double> abs_errors;
  for (const MeasuredPoint& p : run.points) {
    StepInputs in;
    in.variant = p.variant;
    in.batch = p.batch;
    // The miss rate is an input of the planner: the one the point ran at.
    in.miss_rate = p.misses_per_step / (double{1} * p.batch * p.model.layers * p.model.top_k);
    GpuSpec gpu;
    gpu.flops_tflops = 0;  // as fitted: no roofline term
    CheckedPoint c;
    c.measured = p;
    c.predicted_ms = PredictStep(cal, p.model, gpu, in).total_ms;
    c.error_pct = 100 * (c.predicted_ms - p.tpot_ms) / p.tpot_ms;
    abs_errors.push_back(std::abs(c.error_pct));
    check.points.push_back(std::move(c));
  }
  check.max_abs_error_pct =
      abs_errors.empty() ? 0 : *std::max_element(abs_errors.begin(), abs_errors.end());
  check.median_abs_error_pct = Median(abs_errors);
  return check;
}

StatusOr<CalibrationCheck> HoldOutCalibration(
    const MeasuredRun& run, const std::function<std::string(const MeasuredPoint&)>& group,
    const std::set<std::string>& groups) {
  CalibrationCheck out;
  std::vector<double> abs_errors;
  for (const std::string& g : groups) {
    MeasuredRun train, test;
    train.pcie_h2d_gbps = run.pcie_h2d_gbps;
    for (const MeasuredPoint& p : run.points) (group(p) == g ? test : train).points.push_back(p);
    if (test.points.empty()) continue;
    SPARSEKV_ASSIGN_OR_RETURN(const Calibration cal, FitCalibration(train));
    for (CheckedPoint& c : CheckCalibration(cal, test).points) {
      abs_errors.push_back(std::abs(c.error_pct));
      out.points.push_back(std::move(c));
    }
  }
  if (abs_errors.empty()) return InvalidArgument("hold-out: no point in the held-out groups");
  out.max_abs_error_pct = *std::max_element(abs_errors.begin(), abs_errors.end());
  out.median_abs_error_pct = Median(abs_errors);
  return out;
}

}  // namespace sparsekv
