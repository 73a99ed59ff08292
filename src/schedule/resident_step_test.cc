// A step whose requests are all resident: the backend operations each layer enqueues (counted
// by a recording backend that forwards to the CPU backend), and a run phase captured in such a
// step next to the replays after a request moved to hot-cache mode (the recording backend's
// capture and replay stand in for a CUDA graph). Rows and indexer keys are checked against the
// dense model after every step.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "sparsekv/hot_cache.h"
#include "sparsekv/manager.h"
#include "sparsekv/step_schedule.h"
#include "testing/harness.h"
#include "testing/recording_backend.h"

namespace sparsekv {
namespace {

using testing::Bytes;
using testing::RecordingBackend;
using Op = RecordingBackend::Op;

constexpr int32_t kLayers = 2;
constexpr int32_t kRow = 16;
constexpr int32_t kKey = 8;
constexpr int32_t kPageRows = 4;  // a page holds 4 * 16 / 8 = 8 keys per layer
constexpr int32_t kPrompt = 30;
constexpr int32_t kNew = 6;  // 36 positions: 9 resident pages and 5 pages of keys per request
constexpr int32_t kTopK = 3;
constexpr int32_t kMaxBatch = 4;

// Room for three requests resident (9 pages each, and 5 of keys with keys); a fourth admission
// demotes one. top_k 3, C 6, W 2.
CacheOptions Options(bool keys) {
  CacheOptions o;
  o.geometry = KVGeometry::Uniform(kLayers, kRow);
  o.top_k = kTopK;
  o.hot_slots = 6;
  o.window = 2;
  o.max_requests = kMaxBatch;
  o.max_context = kPrompt + kNew;
  o.host_capacity_tokens = 4 * 40;  // 5 host pages of 8 tokens per request
  o.host_page_tokens = 8;
  o.hybrid_residency = true;
  o.resident_page_rows = kPageRows;
  o.indexer_key_bytes = keys ? kKey : 0;
  const int64_t page = int64_t{kPageRows} * kRow * kLayers;
  const int64_t state = 4 * (HotCache::StateBytes(o.geometry, 6, 1, ReplacementOf(o)) + 2 * 4);
  o.device_budget_bytes = 3 * (keys ? 14 : 9) * page + state;
  return o;
}

// A manager over a recording backend, its schedule, the dense model, and the step's inputs and
// outputs in fixed buffers (what a captured run phase reads and writes).
class ResidentStepTest : public ::testing::Test {
 protected:
  void Create(bool keys) {
    backend_ = std::make_shared<RecordingBackend>();
    auto m = SparseKVCacheManager::Create(Options(keys), backend_);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    m_ = std::move(*m);
    auto s = StepSchedule::Create(*m_);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    schedule_ = std::move(*s);
    model_ = std::make_unique<testing::DenseModel>(m_->options().geometry);
    for (int32_t l = 0; l < kLayers; ++l) {
      rows_.emplace_back(kMaxBatch * kRow);
      keys_.emplace_back(kMaxBatch * kKey);
      topk_.emplace_back(kMaxBatch * kTopK);
      slots_.emplace_back(kMaxBatch * kTopK);
    }
  }
  void AdmitAndIngest(RequestId id) {
    ASSERT_TRUE(m_->Admit(id, kPrompt, kNew, nullptr).ok());
    std::vector<Bytes> layers;
    for (int32_t l = 0; l < kLayers; ++l) {
      layers.push_back(testing::RandomRows(rng_, kPrompt, kRow));
      ASSERT_TRUE(m_->IngestPrompt(id, l, layers.back().data(), nullptr).ok());
      if (m_->options().indexer_key_bytes > 0) {
        const Bytes keys =
            testing::KeysOf(layers.back().data(), kPrompt, LayerShape{kRow, kRow}, kKey);
        ASSERT_TRUE(m_->IngestIndexerKeys(id, l, keys.data(), nullptr).ok());
      }
    }
    model_->Add(id, layers, kPrompt);
  }
  // The step's inputs: new rows (and their keys) in the model and the buffers, and each request's
  // top-k: position 0, its newest, and one drawn from its history.
  void Inputs(const std::vector<RequestId>& batch) {
    for (int32_t l = 0; l < kLayers; ++l) {
      const Bytes rows = testing::RandomRows(rng_, kMaxBatch, kRow);
      std::memcpy(rows_[l].data(), rows.data(), rows.size());
      for (size_t b = 0; b < batch.size(); ++b) model_->Append(batch[b], l, &rows[b * kRow]);
      const Bytes keys = testing::KeysOf(rows.data(), kMaxBatch, LayerShape{kRow, kRow}, kKey);
      std::memcpy(keys_[l].data(), keys.data(), keys.size());
      std::fill(topk_[l].begin(), topk_[l].end(), kPaddingPosition);
      std::fill(slots_[l].begin(), slots_[l].end(), -7);  // poison
      for (size_t b = 0; b < batch.size(); ++b) {
        const int32_t len = model_->Length(batch[b], l);
        int32_t* row = &topk_[l][b * kTopK];
        row[0] = 0;
        row[1] = len - 1;
        row[2] = std::uniform_int_distribution<int32_t>(1, len - 2)(rng_);
      }
    }
  }
  LayerWork Work(int32_t l) {
    return LayerWork{rows_[l].data(),
                     m_->options().indexer_key_bytes > 0 ? keys_[l].data() : nullptr,
                     topk_[l].data(), 0, slots_[l].data()};
  }
  // Every layer through the schedule, then FinishStep: what a graph captures.
  Status RunPhase() {
    const AttendFn attend = [](int32_t, int32_t, int32_t, StreamHandle) { return Status::Ok(); };
    for (int32_t l = 0; l < kLayers; ++l) {
      SPARSEKV_RETURN_IF_ERROR(schedule_->RunLayer(l, Work(l), attend, nullptr));
    }
    return schedule_->FinishStep(nullptr);
  }
  // Every slot of the step names the model's row; every key is the model's.
  void Check(const std::vector<RequestId>& batch) {
    for (int32_t l = 0; l < kLayers; ++l) {
      for (size_t b = 0; b < batch.size(); ++b) {
        for (int32_t k = 0; k < kTopK; ++k) {
          const int32_t p = topk_[l][b * kTopK + k];
          const int32_t slot = slots_[l][b * kTopK + k];
          ASSERT_GE(slot, 0) << "layer " << l << " request " << batch[b] << " position " << p;
          ASSERT_LT(slot, m_->HotLayerRows());
          EXPECT_EQ(std::memcmp(m_->HotLayer(l) + int64_t{slot} * kRow, model_->Row(batch[b], l, p),
                                kRow),
                    0)
              << "layer " << l << " request " << batch[b] << " position " << p;
        }
      }
    }
    if (m_->options().indexer_key_bytes > 0) {
      EXPECT_EQ(testing::CheckKeys(*model_, *m_, batch, nullptr), 0);
    }
  }
  // One step of `batch` through the schedule: eagerly, or through the recording of its key
  // (choice / batch size), captured and launched now if there is none yet, else replayed.
  void Step(const std::vector<RequestId>& batch, bool captured) {
    ASSERT_TRUE(schedule_->PlanStep(batch, nullptr).ok());
    Inputs(batch);
    if (!captured) {
      ASSERT_TRUE(RunPhase().ok());
    } else {
      const std::string key = schedule_->choice().ToString() + "/" + std::to_string(batch.size());
      auto it = graphs_.find(key);
      if (it == graphs_.end()) {
        backend_->BeginCapture();
        const Status ran = RunPhase();
        it = graphs_.emplace(key, backend_->EndCapture()).first;
        ASSERT_TRUE(ran.ok()) << ran.ToString();
        ASSERT_TRUE(RecordingBackend::Replay(it->second).ok());
      } else {
        ASSERT_TRUE(RecordingBackend::Replay(it->second).ok());
        const Status finished = schedule_->FinishReplayedStep(-1);
        ASSERT_TRUE(finished.ok()) << finished.ToString();
      }
    }
    Check(batch);
  }

  std::mt19937_64 rng_{7};
  std::shared_ptr<RecordingBackend> backend_;
  std::unique_ptr<SparseKVCacheManager> m_;
  std::unique_ptr<StepSchedule> schedule_;
  std::unique_ptr<testing::DenseModel> model_;
  std::vector<Bytes> rows_, keys_;                  // per layer [max_batch, row / key]
  std::vector<std::vector<int32_t>> topk_, slots_;  // per layer [max_batch, top_k]
  std::map<std::string, RecordingBackend::Recording> graphs_;
};

// Per layer of a step whose requests are all resident: on the engine's stream one append of the
// row and its key (IndexCopyPair; IndexCopy without keys) and the resolve, and on the side stream
// the write-back; no miss copy. A step with a request in hot-cache mode adds its miss copy; the
// manager's own CopyMisses still launches one in any step.
TEST_F(ResidentStepTest, AnAllResidentStepRunsTwoOperationsPerLayerOnTheEnginesStream) {
  for (bool keys : {true, false}) {
    SCOPED_TRACE(keys ? "with indexer keys" : "without indexer keys");
    Create(keys);
    for (RequestId id : {1, 2, 3}) AdmitAndIngest(id);
    const std::vector<RequestId> batch = {1, 2, 3};
    ASSERT_TRUE(schedule_->PlanStep(batch, nullptr).ok());
    EXPECT_FALSE(m_->StepCanMiss());
    EXPECT_EQ(schedule_->choice(), StepChoice{.resident = true});
    EXPECT_EQ(schedule_->choice().ToString(), "resident");
    Inputs(batch);
    const AttendFn attend = [](int32_t, int32_t, int32_t, StreamHandle) { return Status::Ok(); };
    for (int32_t l = 0; l < kLayers; ++l) {
      backend_->ResetCounts();
      ASSERT_TRUE(schedule_->RunLayer(l, Work(l), attend, nullptr).ok());
      const RecordingBackend::Counts& n = backend_->counts();
      EXPECT_EQ(n.Main(Op::kIndexCopyPair), keys ? 1 : 0) << "layer " << l;
      EXPECT_EQ(n.Main(Op::kIndexCopy), keys ? 0 : 1) << "layer " << l;
      EXPECT_EQ(n.Main(Op::kResolve), 1) << "layer " << l;
      EXPECT_EQ(n.MainTotal(), 2) << "layer " << l;
      EXPECT_EQ(n.Side(Op::kIndexCopy), 1) << "layer " << l;  // the write-back
      EXPECT_EQ(n.SideTotal(), 1) << "layer " << l;
    }
    ASSERT_TRUE(schedule_->FinishStep(nullptr).ok());
    Check(batch);
    if (HasFatalFailure()) return;

    // Called on the manager, the same step launches the copy of an empty list.
    ASSERT_TRUE(m_->PlanStep(batch, nullptr).ok());
    Inputs(batch);
    for (int32_t l = 0; l < kLayers; ++l) {
      backend_->ResetCounts();
      ASSERT_TRUE(m_->AppendToken(l, Work(l).new_rows, Work(l).new_keys, nullptr).ok());
      ASSERT_TRUE(m_->RunLayer(l, topk_[l].data(), slots_[l].data(), nullptr, nullptr).ok());
      EXPECT_EQ(backend_->counts().MainTotal(), 3) << "layer " << l;
      EXPECT_EQ(backend_->counts().Main(Op::kIndexCopy), keys ? 1 : 2) << "layer " << l;
    }
    ASSERT_TRUE(m_->FinishStep(nullptr).ok());
    Check(batch);

    // Request 1 is demoted: the step can miss, runs serially and copies its misses; SkipMissCopy
    // is refused in it.
    AdmitAndIngest(4);
    ASSERT_FALSE(m_->IsResident(1));
    ASSERT_TRUE(schedule_->PlanStep(batch, nullptr).ok());
    EXPECT_TRUE(m_->StepCanMiss());
    EXPECT_EQ(schedule_->choice(), StepChoice{});
    Inputs(batch);
    for (int32_t l = 0; l < kLayers; ++l) {
      backend_->ResetCounts();
      ASSERT_TRUE(schedule_->RunLayer(l, Work(l), attend, nullptr).ok());
      EXPECT_EQ(backend_->counts().MainTotal(), 3) << "layer " << l;
      EXPECT_EQ(backend_->counts().Main(Op::kIndexCopy), keys ? 1 : 2) << "layer " << l;
    }
    ASSERT_TRUE(schedule_->FinishStep(nullptr).ok());
    Check(batch);
    ASSERT_TRUE(m_->PlanStep(batch, nullptr).ok());
    Inputs(batch);
    ASSERT_TRUE(m_->AppendToken(0, Work(0).new_rows, Work(0).new_keys, nullptr).ok());
    ASSERT_TRUE(m_->ResolveLayer(0, topk_[0].data(), slots_[0].data(), nullptr, nullptr).ok());
    const Status skipped = m_->SkipMissCopy(0);
    EXPECT_EQ(skipped.code(), StatusCode::kFailedPrecondition) << skipped.ToString();
    EXPECT_NE(skipped.message().find("the step can miss"), std::string::npos) << skipped.ToString();
    EXPECT_TRUE(m_->CopyMisses(0, nullptr).ok());  // the refusal marked nothing
    if (HasFatalFailure()) return;
    graphs_.clear();
    rows_.clear();
    keys_.clear();
    topk_.clear();
    slots_.clear();
    schedule_.reset();
    m_.reset();
  }
}

// A run phase captured in an all-resident step (no miss copy in it) replays for later such
// steps; once a request of the batch is demoted, the step's choice is no longer `resident`, so
// the same batch is captured anew (with its miss copies) instead of replaying the resident graph,
// and that graph replays too. Every step's rows and keys are the model's.
TEST_F(ResidentStepTest, AResidentGraphIsNotReplayedOnceARequestIsInHotCacheMode) {
  Create(/*keys=*/true);
  for (RequestId id : {1, 2, 3}) AdmitAndIngest(id);
  const std::vector<RequestId> batch = {1, 2, 3};
  for (int32_t step = 0; step < 2; ++step) {
    Step(batch, /*captured=*/true);
    if (HasFatalFailure()) return;
    EXPECT_EQ(schedule_->choice().ToString(), "resident");
  }
  ASSERT_EQ(graphs_.size(), 1u);
  const RecordingBackend::Recording& resident = graphs_.at("resident/3");
  EXPECT_EQ(resident.Count(Op::kIndexCopy, /*side=*/false), 0);  // no miss copy
  EXPECT_EQ(resident.Count(Op::kIndexCopyPair, false), kLayers);
  EXPECT_EQ(resident.Count(Op::kResolve, false), kLayers);

  AdmitAndIngest(4);  // demotes request 1, the lowest id among the largest
  ASSERT_FALSE(m_->IsResident(1));
  for (int32_t step = 0; step < 2; ++step) {
    Step(batch, /*captured=*/true);
    if (HasFatalFailure()) return;
    EXPECT_EQ(schedule_->choice().ToString(), "serial");
  }
  ASSERT_EQ(graphs_.size(), 2u);
  EXPECT_EQ(graphs_.at("serial/3").Count(Op::kIndexCopy, false), kLayers);  // the miss copies
  const StatusOr<CacheStats> stats = m_->ReadStats(nullptr);
  ASSERT_TRUE(stats.ok());
  EXPECT_GT(stats->total.misses, 0u);
  EXPECT_EQ(schedule_->stats().steps_by_choice.at("resident"), 2);
  EXPECT_EQ(schedule_->stats().steps_by_choice.at("serial"), 2);
}

// The resident choice is the schedule's to take: it cannot be fixed or measured, and it reads and
// prints as "resident".
TEST_F(ResidentStepTest, TheResidentChoiceIsNotOneToFixOrMeasure) {
  Create(/*keys=*/false);
  ScheduleOptions so;
  so.fixed = StepChoice{.resident = true};
  StatusOr<std::unique_ptr<StepSchedule>> s = StepSchedule::Create(*m_, so);
  EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("resident is not a choice"), std::string::npos)
      << s.status().ToString();
  so.fixed.reset();
  so.candidates = {StepChoice{}, StepChoice{.resident = true}};
  EXPECT_EQ(StepSchedule::Create(*m_, so).status().code(), StatusCode::kInvalidArgument);
  const StatusOr<StepChoice> parsed = ParseStepChoice("resident");
  ASSERT_TRUE(parsed.ok());
  EXPECT_EQ(*parsed, StepChoice{.resident = true});
  EXPECT_EQ(ParseStepChoice("resident+chunks4").status().code(), StatusCode::kInvalidArgument);
}

// A fixed choice runs every step, so that one graph serves them all; with
// fixed_yields_to_resident an all-resident step runs `resident` instead.
TEST_F(ResidentStepTest, AFixedChoiceGivesWayInAStepThatCannotMissOnlyWhenAsked) {
  for (bool yields : {false, true}) {
    SCOPED_TRACE(yields ? "fixed_yields_to_resident" : "fixed");
    Create(/*keys=*/true);
    ScheduleOptions so;
    so.fixed = StepChoice{};
    so.fixed_yields_to_resident = yields;
    auto s = StepSchedule::Create(*m_, so);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    schedule_ = std::move(*s);
    for (RequestId id : {1, 2, 3}) AdmitAndIngest(id);
    Step({1, 2}, /*captured=*/false);
    if (HasFatalFailure()) return;
    EXPECT_EQ(schedule_->choice().ToString(), yields ? "resident" : "serial");
    AdmitAndIngest(4);
    Step({1, 2}, /*captured=*/false);
    if (HasFatalFailure()) return;
    EXPECT_EQ(schedule_->choice().ToString(), "serial");
    EXPECT_EQ(schedule_->reason(), "fixed by ScheduleOptions::fixed");
    rows_.clear();
    keys_.clear();
    topk_.clear();
    slots_.clear();
    schedule_.reset();
    m_.reset();
  }
}

}  // namespace
}  // namespace sparsekv
