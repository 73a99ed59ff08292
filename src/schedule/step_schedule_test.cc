// StepSchedule on the CPU backend: every choice reads exactly the rows written (the dense model
// is the oracle), the tuner measures each candidate and keeps the fastest, and bad calls are
// refused.
#include "sparsekv/step_schedule.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "schedule/schedule_tuner.h"
#include "testing/harness.h"

namespace sparsekv {
namespace {

using testing::Bytes;

constexpr int32_t kLayers = 6;
constexpr int32_t kStride = 24;
constexpr int32_t kTopK = 8;
constexpr int32_t kRequests = 6;

CacheOptions Options(int32_t layers_per_index, bool hybrid) {
  CacheOptions o;
  o.geometry = KVGeometry::Uniform(kLayers, kStride);
  o.top_k = kTopK;
  o.hot_slots = 12;
  o.window = 2;
  o.host_page_tokens = 8;
  o.max_requests = kRequests;
  o.max_context = 96;
  o.host_capacity_tokens = int64_t{kRequests} * 96;
  o.layers_per_index = layers_per_index;
  o.copy_chunk_rows = 1;
  o.max_prefetch = kTopK;
  if (hybrid) {
    // Room for about two resident requests: the others run in hot-cache mode.
    o.hybrid_residency = true;
    o.resident_page_rows = 14;
  }
  return o;
}

// Drives random steps through a schedule and checks, inside the engine's attention callback,
// every row it may read against the dense model.
class ScheduleWorkload {
 public:
  ScheduleWorkload(const CacheOptions& o, const ScheduleOptions& so, uint64_t seed)
      : rng_(seed), model_(o.geometry) {
    auto m = SparseKVCacheManager::Create(o, CreateCpuBackend());
    EXPECT_TRUE(m.ok()) << m.status().ToString();
    manager_ = std::move(*m);
    auto s = StepSchedule::Create(*manager_, so);
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    schedule_ = std::move(*s);
    for (RequestId id = 1; id <= kRequests; ++id) {
      const int32_t len = std::uniform_int_distribution<int32_t>(1, 40)(rng_);
      EXPECT_TRUE(manager_->Admit(id, len, 40, nullptr).ok());
      std::vector<Bytes> layers;
      for (int32_t l = 0; l < kLayers; ++l) {
        layers.push_back(testing::RandomRows(rng_, len, kStride));
        EXPECT_TRUE(manager_->IngestPrompt(id, l, layers.back().data(), nullptr).ok());
      }
      model_.Add(id, layers, len);
    }
  }

  // One step of a random batch; returns false once a check failed.
  void Step() {
    std::vector<RequestId> ids;
    for (RequestId id = 1; id <= kRequests; ++id) ids.push_back(id);
    std::shuffle(ids.begin(), ids.end(), rng_);
    const int32_t batch = std::uniform_int_distribution<int32_t>(1, kRequests)(rng_);
    ids.resize(batch);
    ASSERT_TRUE(schedule_->PlanStep(ids, nullptr).ok());
    const int32_t max_batch = manager_->options().effective_max_batch();
    std::vector<int32_t> slots(static_cast<size_t>(max_batch) * kTopK, -7);
    std::vector<int32_t> topk;
    for (int32_t l = 0; l < kLayers; ++l) {
      const Bytes rows = testing::RandomRows(rng_, max_batch, kStride);
      for (int32_t b = 0; b < batch; ++b) model_.Append(ids[b], l, rows.data() + b * kStride);
      if (l % manager_->options().layers_per_index == 0) {
        topk = RandomTopK(ids, max_batch, l);
        std::fill(slots.begin(), slots.end(), -7);  // poison
      }
      std::vector<int32_t> attended(batch, 0);
      LayerWork work{rows.data(), nullptr, topk.data(), 0, slots.data()};
      const Status s = schedule_->RunLayer(
          l, work,
          [&](int32_t layer, int32_t first, int32_t n, StreamHandle) {
            for (int32_t b = first; b < first + n; ++b) {
              ++attended[b];
              Check(ids[b], layer, &topk[size_t(b) * kTopK], &slots[size_t(b) * kTopK]);
            }
            return Status::Ok();
          },
          nullptr);
      ASSERT_TRUE(s.ok()) << s.ToString();
      for (int32_t b = 0; b < batch; ++b) ASSERT_EQ(attended[b], 1) << "row " << b;
    }
    ASSERT_TRUE(schedule_->FinishStep(nullptr).ok());
  }

  StepSchedule& schedule() { return *schedule_; }
  SparseKVCacheManager& manager() { return *manager_; }

 private:
  // Positions of the request's history with padding, repeats and out-of-range entries.
  std::vector<int32_t> RandomTopK(const std::vector<RequestId>& ids, int32_t max_batch,
                                  int32_t layer) {
    std::vector<int32_t> topk(static_cast<size_t>(max_batch) * kTopK, -1);
    for (size_t b = 0; b < ids.size(); ++b) {
      const int32_t len = model_.Length(ids[b], layer);
      for (int32_t k = 0; k < kTopK; ++k) {
        const int32_t kind = std::uniform_int_distribution<int32_t>(0, 19)(rng_);
        int32_t p = std::uniform_int_distribution<int32_t>(0, len - 1)(rng_);
        if (kind == 0) p = -1;
        if (kind == 1) p = len + 3;
        if (kind == 2 && k > 0) p = topk[b * kTopK + k - 1];
        topk[b * kTopK + k] = p;
      }
    }
    return topk;
  }

  void Check(RequestId id, int32_t layer, const int32_t* topk, const int32_t* slots) {
    const int32_t len = model_.Length(id, layer);
    const std::byte* hot = manager_->HotLayer(layer);
    std::set<int32_t> seen;
    for (int32_t k = 0; k < kTopK; ++k) {
      const int32_t p = topk[k];
      const bool valid = p >= 0 && p < len && seen.insert(p).second;
      if (!valid) {
        EXPECT_EQ(slots[k], -1) << "position " << p;
        continue;
      }
      ASSERT_GE(slots[k], 0) << "position " << p;
      EXPECT_EQ(std::memcmp(hot + int64_t{slots[k]} * kStride, model_.Row(id, layer, p), kStride),
                0)
          << "request " << id << " layer " << layer << " position " << p;
    }
  }

  std::mt19937_64 rng_;
  testing::DenseModel model_;
  std::unique_ptr<SparseKVCacheManager> manager_;
  std::unique_ptr<StepSchedule> schedule_;
};

TEST(StepScheduleTest, EveryChoiceReadsTheRowsWritten) {
  for (int32_t lpi : {1, 2}) {
    for (bool hybrid : {false, true}) {
      const CacheOptions o = Options(lpi, hybrid);
      for (const StepChoice& c : AllowedChoices(o)) {
        SCOPED_TRACE(c.ToString() + " layers_per_index " + std::to_string(lpi) +
                     (hybrid ? " hybrid" : ""));
        ScheduleOptions so;
        so.fixed = c;
        ScheduleWorkload w(o, so, 17 + lpi);
        for (int32_t step = 0; step < 25; ++step) {
          w.Step();
          if (::testing::Test::HasFatalFailure()) return;
        }
        EXPECT_EQ(w.schedule().stats().steps_by_choice.at(c.ToString()), 25);
        const StatusOr<CacheStats> stats = w.manager().ReadStats(nullptr);
        ASSERT_TRUE(stats.ok());
        EXPECT_GT(stats->total.misses, 0u);
        if (c.crosslayer_prefetch) EXPECT_GT(stats->prefetch_rows, 0u);
      }
    }
  }
}

TEST(StepScheduleTest, AllowedChoicesFollowTheOptions) {
  CacheOptions o = Options(1, false);
  std::vector<std::string> names;
  for (const StepChoice& c : AllowedChoices(o)) names.push_back(c.ToString());
  EXPECT_EQ(names,
            (std::vector<std::string>{"serial", "chunks1", "chunks2", "chunks4", "prefetch",
                                      "prefetch+chunks1", "prefetch+chunks2", "prefetch+chunks4"}));
  o.copy_chunk_rows = 0;
  o.max_prefetch = 0;
  EXPECT_EQ(AllowedChoices(o), std::vector<StepChoice>{StepChoice{}});
}

TEST(StepScheduleTest, TheTunerMeasuresEveryCandidateThenKeepsTheFastest) {
  const CacheOptions o = Options(1, false);
  ScheduleOptions so;
  so.trials = 2;
  so.candidates = {StepChoice{}, StepChoice{true, 0}, StepChoice{false, 2}};
  ScheduleWorkload w(o, so, 5);
  for (int32_t step = 0; step < 40; ++step) {
    w.Step();
    if (HasFatalFailure()) return;
  }
  const ScheduleStats stats = w.schedule().stats();
  EXPECT_EQ(stats.steps, 40);
  EXPECT_GT(stats.calibration_steps, 0);
  EXPECT_LT(stats.calibration_steps, 40);
  EXPECT_FALSE(stats.last_reason.empty());
}

TEST(ScheduleTunerTest, ResidentStepsRunSeriallyAtOnce) {
  ScheduleTuner tuner({StepChoice{}, StepChoice{true, 0}}, 3);
  const ScheduleDecision d = tuner.Choose(StepShape{32, 0});
  EXPECT_EQ(d.choice, StepChoice{});
  EXPECT_FALSE(d.calibrating);
  EXPECT_NE(d.reason.find("resident"), std::string::npos);
}

TEST(ScheduleTunerTest, CalibratesRoundRobinAndPicksTheLowestMedian) {
  const std::vector<StepChoice> c = {StepChoice{}, StepChoice{true, 0}, StepChoice{false, 16},
                                     StepChoice{true, 16}};
  ScheduleTuner tuner(c, 3);
  const StepShape shape{59, 20};
  const std::vector<double> seconds = {5e-3, 4e-3, 4.5e-3, 6e-3};
  for (int32_t t = 0; t < 3; ++t) {
    for (size_t i = 0; i < c.size(); ++i) {
      const ScheduleDecision d = tuner.Choose(shape);
      ASSERT_TRUE(d.calibrating);
      ASSERT_EQ(d.choice, c[i]);
      // One slow outlier per candidate: the median ignores it.
      tuner.Observe(shape, d.choice, t == 1 ? 1.0 : seconds[i]);
    }
  }
  const ScheduleDecision d = tuner.Choose(shape);
  EXPECT_FALSE(d.calibrating);
  EXPECT_EQ(d.choice, (StepChoice{true, 0}));
  EXPECT_NE(d.reason.find("fastest of 4"), std::string::npos) << d.reason;
  // A shape of the same class (16-31 hot-cache requests) shares it; another class calibrates.
  EXPECT_EQ(tuner.Choose(StepShape{59, 31}).choice, (StepChoice{true, 0}));
  EXPECT_TRUE(tuner.Choose(StepShape{59, 40}).calibrating);
}

TEST(ScheduleTunerTest, ChunksAsLargeAsTheBatchAreNotCandidates) {
  ScheduleTuner tuner({StepChoice{}, StepChoice{false, 16}}, 1);
  const ScheduleDecision d = tuner.Choose(StepShape{16, 4});
  EXPECT_EQ(d.choice, StepChoice{});
  EXPECT_FALSE(d.calibrating);
}

TEST(StepScheduleTest, RefusesChoicesTheOptionsDoNotAllow) {
  CacheOptions o = Options(1, false);
  o.max_prefetch = 0;
  auto m = SparseKVCacheManager::Create(o, CreateCpuBackend());
  ASSERT_TRUE(m.ok());
  ScheduleOptions so;
  so.fixed = StepChoice{true, 0};
  const auto s = StepSchedule::Create(**m, so);
  ASSERT_EQ(s.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("prefetch"), std::string::npos);
  so.fixed.reset();
  so.candidates = {StepChoice{false, 3}};
  EXPECT_EQ(StepSchedule::Create(**m, so).status().code(), StatusCode::kInvalidArgument);
  so.candidates.clear();
  so.trials = 0;
  EXPECT_EQ(StepSchedule::Create(**m, so).status().code(), StatusCode::kInvalidArgument);
}

TEST(StepScheduleTest, RefusesRunPhaseCallsOutOfOrderAndReportsAttentionErrors) {
  const CacheOptions o = Options(1, false);
  ScheduleOptions so;
  so.fixed = StepChoice{false, 2};
  ScheduleWorkload w(o, so, 9);
  StepSchedule& s = w.schedule();
  std::vector<int32_t> slots(kRequests * kTopK), topk(kRequests * kTopK, 0);
  const Bytes rows(kRequests * kStride);
  const LayerWork work{rows.data(), nullptr, topk.data(), 0, slots.data()};
  const AttendFn ok = [](int32_t, int32_t, int32_t, StreamHandle) { return Status::Ok(); };
  EXPECT_EQ(s.RunLayer(0, work, ok, nullptr).code(), StatusCode::kFailedPrecondition);
  const std::vector<RequestId> batch = {1, 2, 3};
  ASSERT_TRUE(s.PlanStep(batch, nullptr).ok());
  EXPECT_EQ(s.RunLayer(1, work, ok, nullptr).code(), StatusCode::kFailedPrecondition);
  LayerWork no_topk = work;
  no_topk.topk = nullptr;
  EXPECT_EQ(s.RunLayer(0, no_topk, ok, nullptr).code(), StatusCode::kInvalidArgument);
  const Status failed = s.RunLayer(
      0, work,
      [](int32_t, int32_t first, int32_t, StreamHandle) {
        return first == 2 ? Unavailable("attention kernel failed") : Status::Ok();
      },
      nullptr);
  EXPECT_EQ(failed.code(), StatusCode::kUnavailable);
  EXPECT_NE(failed.message().find("layer 0 over rows [2, 3)"), std::string::npos)
      << failed.ToString();
  EXPECT_EQ(s.FinishStep(nullptr).code(), StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace sparsekv
