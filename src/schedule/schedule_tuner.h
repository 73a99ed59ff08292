// ScheduleTuner: which StepChoice a step of a given shape runs in, learnt from measured step times.
// Host only, no backend: every decision can be tested directly.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "sparsekv/step_schedule.h"

namespace sparsekv {

// What decides a schedule: the batch and how many of its requests are in hot-cache mode (in
// classes 0, 1, 2-3, 4-7, ...: steps whose hot-cache requests differ by less than a factor of
// two share what was measured).
struct StepShape {
  int32_t batch = 0;
  int32_t hot_requests = 0;
  int32_t hot_class() const;
  bool operator<(const StepShape& o) const {
    return std::pair(batch, hot_class()) < std::pair(o.batch, o.hot_class());
  }
};

struct ScheduleDecision {
  StepChoice choice;
  std::string reason;
  bool calibrating = false;  // the step measures a candidate
};

class ScheduleTuner {
 public:
  // `candidates` non-empty, serial among them; trials >= 1.
  ScheduleTuner(std::vector<StepChoice> candidates, int32_t trials);

  // A step with no request in hot-cache mode runs serially (nothing to copy or prefetch). Else
  // the candidates that fit the batch (chunks smaller than it) are measured `trials` steps each,
  // round robin over those measured least (forward in even rounds, backward in odd ones), and
  // then the one with the lowest median step time runs.
  ScheduleDecision Choose(const StepShape& shape) const;
  // A step of `shape` ran in `choice` in `seconds`.
  void Observe(const StepShape& shape, const StepChoice& choice, double seconds);

 private:
  std::vector<StepChoice> Fitting(const StepShape& shape) const;
  static double Median(std::vector<double> v);

  std::vector<StepChoice> candidates_;
  int32_t trials_;
  // Per shape class, per candidate (its index), the measured step times.
  std::map<StepShape, std::map<size_t, std::vector<double>>> times_;
};

}  // namespace sparsekv
