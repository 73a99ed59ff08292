#include "schedule/schedule_tuner.h"

#include <algorithm>
#include <bit>
#include <cstdio>

namespace sparsekv {

int32_t StepShape::hot_class() const {
  return hot_requests <= 0 ? 0 : static_cast<int32_t>(std::bit_width(uint32_t(hot_requests)));
}

ScheduleTuner::ScheduleTuner(std::vector<StepChoice> candidates, int32_t trials)
    : candidates_(std::move(candidates)), trials_(trials) {}

std::vector<StepChoice> ScheduleTuner::Fitting(const StepShape& shape) const {
  std::vector<StepChoice> out;
  for (const StepChoice& c : candidates_) {
    if (c.chunk_rows < shape.batch) out.push_back(c);
  }
  return out;
}

double ScheduleTuner::Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

namespace {
std::string Ms(double seconds) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.3f ms", seconds * 1e3);
  return text;
}
}  // namespace

ScheduleDecision ScheduleTuner::Choose(const StepShape& shape) const {
  if (shape.hot_requests == 0) {
    return {StepChoice{}, "every request is resident: nothing to copy or prefetch", false};
  }
  const std::vector<StepChoice> fitting = Fitting(shape);
  if (fitting.size() == 1) return {fitting[0], "the only candidate for this batch", false};
  const auto shape_it = times_.find(shape);
  auto times_of = [&](size_t i) -> const std::vector<double>* {
    if (shape_it == times_.end()) return nullptr;
    const auto it = shape_it->second.find(i);
    return it == shape_it->second.end() ? nullptr : &it->second;
  };
  auto index_of = [&](const StepChoice& c) {
    return static_cast<size_t>(std::find(candidates_.begin(), candidates_.end(), c) -
                               candidates_.begin());
  };
  // Round robin over the candidates measured least, in their order in even rounds and in the
  // reverse order in odd ones: a workload that drifts while they are measured (a cache warming
  // up misses less from step to step) then weighs on all of them alike. (In plain round robin the
  // last candidate of every round would always be measured on the warmest cache.)
  int32_t fewest = trials_;
  std::vector<int32_t> done(fitting.size());
  for (size_t i = 0; i < fitting.size(); ++i) {
    const std::vector<double>* t = times_of(index_of(fitting[i]));
    done[i] = t == nullptr ? 0 : static_cast<int32_t>(t->size());
    fewest = std::min(fewest, done[i]);
  }
  const StepChoice* next = nullptr;
  if (fewest < trials_) {
    const bool reverse = fewest % 2 == 1;
    for (size_t k = 0; k < fitting.size() && next == nullptr; ++k) {
      const size_t i = reverse ? fitting.size() - 1 - k : k;
      if (done[i] == fewest) next = &fitting[i];
    }
  }
  if (next != nullptr) {
    return {*next,
            "measuring " + next->ToString() + " (" + std::to_string(fewest + 1) + " of " +
                std::to_string(trials_) + ") at batch " + std::to_string(shape.batch) + ", " +
                std::to_string(shape.hot_requests) + " hot-cache requests",
            true};
  }
  std::vector<std::pair<double, StepChoice>> ranked;
  for (const StepChoice& c : fitting) ranked.emplace_back(Median(*times_of(index_of(c))), c);
  std::stable_sort(ranked.begin(), ranked.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  std::string reason = "fastest of " + std::to_string(ranked.size()) + " measured at batch " +
                       std::to_string(shape.batch) + " (" + Ms(ranked[0].first);
  reason += "; next " + ranked[1].second.ToString() + " " + Ms(ranked[1].first) + ")";
  return {ranked[0].second, reason, false};
}

void ScheduleTuner::Observe(const StepShape& shape, const StepChoice& choice, double seconds) {
  const auto it = std::find(candidates_.begin(), candidates_.end(), choice);
  if (it == candidates_.end() || seconds < 0) return;
  std::vector<double>& t = times_[shape][static_cast<size_t>(it - candidates_.begin())];
  // Only the latest trials count: a shape measured again (the mix drifted) keeps a window.
  t.push_back(seconds);
  if (t.size() > static_cast<size_t>(trials_)) t.erase(t.begin());
}

}  // namespace sparsekv
