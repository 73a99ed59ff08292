// Calibrating the planner's model (sparsekv/planner.h) from measured end-to-end results and
// checking it against them. The fits keep to physically meaningful parameters, each by weighted
// least squares on relative error (every point counts as much as any other, whatever its TPOT):
//   attention(B) = fixed + per_request * B      from every point's attention-alone time;
//   rest(B) = bytes / weight_gbps + per_request * B   from every point's proxy-alone time;
//   per variant: fixed, per_request overhead and 1 / gather_gbps, from the TPOT left after the
//   modelled attention and rest (a coefficient that comes out negative is fixed at 0 and the
//   others refitted: no parameter may mean negative time or bandwidth). no-cache fetches every
//   selected row, so its per-request overhead and its gather time cannot be told apart: it has no
//   per-request term, and the gather carries all of it.
// The check predicts every point from the fitted parameters alone (no measured time of the point
// enters its prediction) and reports the relative error of each.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "sparsekv/planner.h"
#include "sparsekv/status.h"

namespace sparsekv {

// The fields of one point of a `sparsekv bench` JSON record that the calibration uses.
struct MeasuredPoint {
  std::string preset;
  KVVariant variant = KVVariant::kSparseKV;
  int32_t context = 0;
  std::optional<double> miss_rate_target;
  int32_t batch = 0;
  double tpot_ms = 0;
  double misses_per_step = 0;  // rows fetched per step (no-cache: every selected row)
  double attention_us_per_layer = 0;
  double proxy_us_per_layer = 0;
  ModelShape model;  // from the record: layers, row bytes, top-k, proxy weights
};
struct MeasuredRun {
  std::vector<MeasuredPoint> points;
  double pcie_h2d_gbps = 0;  // the ceiling measured in the same run
};

// Reads the points of `sparsekv bench --json` files. InvalidArgument names the file and field.
StatusOr<MeasuredRun> ReadMeasured(const std::vector<std::string>& paths);

// Fits every parameter of the model to `run`. InvalidArgument if a variant has too few points.
StatusOr<Calibration> FitCalibration(const MeasuredRun& run);

struct CheckedPoint {
  MeasuredPoint measured;
  double predicted_ms = 0;
  double error_pct = 0;  // 100 * (predicted - measured) / measured
};
struct CalibrationCheck {
  std::vector<CheckedPoint> points;
  double max_abs_error_pct = 0;
  double median_abs_error_pct = 0;
};
// Predicts every point of `run` with `cal` (serial copies, as measured).
CalibrationCheck CheckCalibration(const Calibration& cal, const MeasuredRun& run);

// Out-of-sample check: for each group in `groups`, fits on the points of the other groups and
// checks on the group's own (e.g. group = context: leave one context out).
StatusOr<CalibrationCheck> HoldOutCalibration(
    const MeasuredRun& run, const std::function<std::string(const MeasuredPoint&)>& group,
    const std::set<std::string>& groups);

}  // namespace sparsekv
