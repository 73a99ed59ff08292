// StepSchedule over DeepSeek-V4's layer kinds (testing::V4Shaped: CSA layers offloaded with a
// cadence of 4, HCA layers resident with a cadence of 128, a window-only layer, a raw window in
// every layer), on the CPU backend: in every choice the manager allows, each layer's attention
// reads what the same manager driven directly reads, and an aborted step completes every kind.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <utility>
#include <vector>

#include "sparsekv/step_schedule.h"
#include "testing/harness.h"
#include "testing/layer_kinds_model.h"

namespace sparsekv {
namespace {

using testing::Bytes;
using testing::kMaxBatch;
using testing::kStride;
using testing::kTopK;

constexpr int32_t kLayers = 5;

CacheOptions Options() {
  CacheOptions o = testing::V4Shaped(/*hybrid=*/false);
  o.copy_chunk_rows = 1;
  o.max_prefetch = kTopK;
  return o;
}

// What an attention of one batch row reads in one layer: the selected scope's rows (CSA: the
// top-k's rows, zero for a skipped entry; HCA: every entry) and the raw window's, in order.
struct Read {
  Bytes selected, window;
  bool operator==(const Read&) const = default;
};
using Reads = std::map<std::pair<int32_t, int32_t>, Read>;  // (layer, batch row)

void AppendRows(Bytes& out, const std::byte* row) { out.insert(out.end(), row, row + kStride); }

// The dense scopes of batch row b in `layer`, read through the manager's views (device memory is
// host memory on the CPU backend).
void ReadDense(const SparseKVCacheManager& m, int32_t layer, int32_t b, Read& read) {
  if (m.options().geometry.layers[layer].kind == LayerKind::kResident) {
    const StatusOr<DenseEntriesView> entries = m.DenseEntries(layer);
    ASSERT_TRUE(entries.ok()) << entries.status().ToString();
    for (int32_t e = 0; e < entries->Count(b); ++e) AppendRows(read.selected, entries->Entry(b, e));
  }
  const StatusOr<RawWindowView> window = m.RawWindow(layer);
  ASSERT_TRUE(window.ok()) << window.status().ToString();
  for (int32_t i = 0; i < window->Valid(b); ++i) AppendRows(read.window, window->Row(b, i));
}

// Two managers of the same options and prompts: one driven directly (AppendToken with StepRows,
// RunLayer with an assembled buffer on the CSA layers), one through a schedule fixed to `choice`.
class Pair {
 public:
  Pair(const StepChoice& choice, uint64_t seed) : rng_(seed), o_(Options()) {
    for (auto* m : {&direct_, &scheduled_}) {
      auto created = SparseKVCacheManager::Create(o_, CreateCpuBackend());
      EXPECT_TRUE(created.ok()) << created.status().ToString();
      *m = std::move(*created);
    }
    ScheduleOptions so;
    so.fixed = choice;
    auto schedule = StepSchedule::Create(*scheduled_, so);
    EXPECT_TRUE(schedule.ok()) << schedule.status().ToString();
    schedule_ = std::move(*schedule);
    for (RequestId id = 1; id <= kMaxBatch; ++id) {
      const int32_t len = std::uniform_int_distribution<int32_t>(16, 300)(rng_);
      lens_.push_back(len);
      for (auto* m : {&direct_, &scheduled_}) {
        EXPECT_TRUE((*m)->Admit(id, len, 40, nullptr).ok());
      }
      for (int32_t l = 0; l < kLayers; ++l) {
        const int32_t r = o_.geometry.layers[l].entry_tokens;
        const Bytes entries = testing::RandomRows(rng_, len / r, kStride);
        const Bytes window = testing::RandomRows(rng_, std::min(len, o_.raw_window), kStride);
        for (auto* m : {&direct_, &scheduled_}) {
          const PromptRows rows{entries.empty() ? nullptr : entries.data(), window.data()};
          const Status s = (*m)->IngestPrompt(id, l, rows, nullptr);
          EXPECT_TRUE(s.ok()) << s.ToString();
        }
      }
    }
  }

  // One step of every request in both; returns the reads of (direct, scheduled).
  std::pair<Reads, Reads> Step() {
    std::vector<RequestId> ids(kMaxBatch);
    std::iota(ids.begin(), ids.end(), RequestId(1));
    // Per layer: the new rows, the raw-window rows, and (CSA) distinct entries of each request.
    std::vector<Bytes> rows, window;
    std::vector<std::vector<int32_t>> topk;
    for (int32_t l = 0; l < kLayers; ++l) {
      rows.push_back(testing::RandomRows(rng_, kMaxBatch, kStride));
      window.push_back(testing::RandomRows(rng_, kMaxBatch, kStride));
      std::vector<int32_t> t;
      for (int32_t b = 0; b < kMaxBatch; ++b) {
        std::vector<int32_t> entries((lens_[b] + 1) / 4);
        std::iota(entries.begin(), entries.end(), 0);
        std::shuffle(entries.begin(), entries.end(), rng_);
        t.insert(t.end(), entries.begin(), entries.begin() + kTopK);
      }
      topk.push_back(t);
    }
    std::pair<Reads, Reads> out;

    EXPECT_TRUE(direct_->PlanStep(ids, nullptr).ok());
    std::vector<int32_t> slots(kMaxBatch * kTopK);
    Bytes assembled(size_t(kMaxBatch) * kTopK * kStride);
    for (int32_t l = 0; l < kLayers; ++l) {
      const Status appended =
          direct_->AppendToken(l, StepRows{rows[l].data(), nullptr, window[l].data()}, nullptr);
      EXPECT_TRUE(appended.ok()) << appended.ToString();
      if (o_.geometry.offloaded(l)) {
        const Status run =
            direct_->RunLayer(l, topk[l].data(), slots.data(), assembled.data(), nullptr);
        EXPECT_TRUE(run.ok()) << run.ToString();
      }
      for (int32_t b = 0; b < kMaxBatch; ++b) {
        Read& read = out.first[{l, b}];
        if (o_.geometry.offloaded(l)) {
          read.selected.assign(assembled.begin() + b * kTopK * kStride,
                               assembled.begin() + (b + 1) * kTopK * kStride);
        }
        ReadDense(*direct_, l, b, read);
      }
    }
    EXPECT_TRUE(direct_->FinishStep(nullptr).ok());

    EXPECT_TRUE(schedule_->PlanStep(ids, nullptr).ok());
    std::vector<int32_t> scheduled_slots(kMaxBatch * kTopK, -7);
    for (int32_t l = 0; l < kLayers; ++l) {
      const AttendFn attend = [&](int32_t layer, int32_t first, int32_t n, StreamHandle) {
        for (int32_t b = first; b < first + n; ++b) {
          Read& read = out.second[{layer, b}];
          if (o_.geometry.offloaded(layer)) {
            const std::byte* hot = scheduled_->HotLayer(layer);
            for (int32_t k = 0; k < kTopK; ++k) {
              const int32_t slot = scheduled_slots[b * kTopK + k];
              const Bytes zero(kStride);
              AppendRows(read.selected, slot < 0 ? zero.data() : hot + int64_t{slot} * kStride);
            }
          }
          ReadDense(*scheduled_, layer, b, read);
        }
        return Status::Ok();
      };
      LayerWork work;
      work.new_rows =
          o_.geometry.layers[l].kind == LayerKind::kWindowOnly ? nullptr : rows[l].data();
      work.window_rows = window[l].data();
      if (o_.geometry.offloaded(l)) {
        work.topk = topk[l].data();
        work.slots = scheduled_slots.data();
      }
      const Status run = schedule_->RunLayer(l, work, attend, nullptr);
      EXPECT_TRUE(run.ok()) << l << ": " << run.ToString();
    }
    EXPECT_TRUE(schedule_->FinishStep(nullptr).ok());
    for (int32_t& len : lens_) ++len;
    return out;
  }

  StepSchedule& schedule() { return *schedule_; }
  SparseKVCacheManager& scheduled() { return *scheduled_; }

 private:
  std::mt19937_64 rng_;
  CacheOptions o_;
  std::unique_ptr<SparseKVCacheManager> direct_, scheduled_;
  std::unique_ptr<StepSchedule> schedule_;
  std::vector<int32_t> lens_;
};

TEST(StepScheduleLayerKindsTest, EveryChoiceReadsWhatTheManagerDrivenDirectlyReads) {
  const std::vector<StepChoice> choices = AllowedChoices(Options());
  // Two resolving groups (the CSA layers 0 and 2): the prefetch is offered past the HCA layer.
  ASSERT_TRUE(std::any_of(choices.begin(), choices.end(),
                          [](const StepChoice& c) { return c.crosslayer_prefetch; }));
  for (const StepChoice& choice : choices) {
    Pair pair(choice, 11);
    for (int32_t step = 0; step < 12; ++step) {  // across entry boundaries of the CSA layers
      const auto [direct, scheduled] = pair.Step();
      ASSERT_EQ(direct.size(), size_t{kLayers * kMaxBatch});
      for (const auto& [at, read] : direct) {  // every scope read something
        EXPECT_FALSE(read.window.empty()) << at.first;
        if (Options().geometry.offloaded(at.first)) {
          EXPECT_EQ(read.selected.size(), size_t{kTopK} * kStride);
        }
      }
      EXPECT_TRUE(direct == scheduled) << choice.ToString() << " step " << step;
    }
  }
}

TEST(StepScheduleLayerKindsTest, ResidentAndWindowOnlyLayersNeedNoTopKButAWindow) {
  Pair pair(StepChoice{}, 5);
  const std::vector<RequestId> ids = {1, 2, 3};
  ASSERT_TRUE(pair.schedule().PlanStep(ids, nullptr).ok());
  const Bytes rows = Bytes(size_t(kMaxBatch) * kStride, std::byte{1});
  std::vector<int32_t> topk(kMaxBatch * kTopK, 0), slots(kMaxBatch * kTopK);
  int32_t attended = 0;
  const AttendFn attend = [&](int32_t, int32_t, int32_t, StreamHandle) {
    ++attended;
    return Status::Ok();
  };
  LayerWork csa{rows.data(), nullptr, topk.data(), 0, slots.data(), nullptr};
  // A raw window makes window_rows required.
  EXPECT_EQ(pair.schedule().RunLayer(0, csa, attend, nullptr).code(), StatusCode::kInvalidArgument);
  csa.window_rows = rows.data();
  ASSERT_TRUE(pair.schedule().RunLayer(0, csa, attend, nullptr).ok());
  // The HCA layer: new_rows and the window only; attended once over the batch.
  const int32_t before = attended;
  ASSERT_TRUE(pair.schedule()
                  .RunLayer(1, LayerWork{rows.data(), nullptr, nullptr, 0, nullptr, rows.data()},
                            attend, nullptr)
                  .ok());
  EXPECT_EQ(attended, before + 1);
  // An aborted step completes the others (CSA, HCA, window-only) with zero rows: the step's token
  // has a zero row in the window-only layer's raw window.
  ASSERT_TRUE(pair.schedule().AbortStep(nullptr).ok());
  const StatusOr<RawWindowView> window = pair.scheduled().RawWindow(4);  // the step's view
  ASSERT_TRUE(window.ok());
  const std::byte* newest = window->Row(0, window->Valid(0) - 1);
  EXPECT_TRUE(std::all_of(newest, newest + kStride, [](std::byte v) { return v == std::byte{0}; }));
  ASSERT_TRUE(pair.schedule().PlanStep(ids, nullptr).ok());  // the next step plans
}

}  // namespace
}  // namespace sparsekv
