// PlanStep refusals change nothing (manager.h): for every refusal a batch can meet after requests
// that would plan, and for a device copy failing at any point of the plan, the manager's
// lengths, pages, statistics and memory figures are as before, and the next step planned reads
// what the dense model holds. On the CPU backend, wrapped to fail a chosen copy.
#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <vector>

#include "sparsekv/manager.h"
#include "testing/forwarding_backend.h"
#include "testing/harness.h"

namespace sparsekv {
namespace {

using testing::Bytes;
using testing::DenseModel;
using testing::FaultyBackend;

constexpr int32_t kLayers = 2;
constexpr int32_t kPrompt = 6;

// Two layers of 8-byte rows, 4-token pages: a prompt of 6 tokens leaves its second page partly
// filled, which a fork shares.
CacheOptions Options() {
  CacheOptions o;
  o.geometry = KVGeometry::Uniform(kLayers, 8);
  o.top_k = 2;
  o.hot_slots = 3;
  o.window = 1;
  o.host_capacity_tokens = 128;
  o.max_requests = 6;
  o.max_host_requests = 8;
  o.max_batch = 4;
  o.max_context = 32;
  o.host_page_tokens = 4;
  return o;
}

class ManagerPlanTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto m = SparseKVCacheManager::Create(Options(), backend_);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    m_ = std::move(*m);
    // 1: a request; 2: its fork, both holding a spare for the shared partial page; 3: at its
    // reserved length; 4: retracted; 5: admitted, not ingested.
    Admit(1, 8);
    ASSERT_TRUE(m_->Fork(1, 2, 8, nullptr).ok());
    model_.Copy(1, 2);
    Admit(3, 0);
    Admit(4, 8);
    ASSERT_TRUE(m_->Retract(4).ok());
    ASSERT_TRUE(m_->Admit(5, kPrompt, 8, nullptr).ok());
    driver_ = std::make_unique<testing::StepDriver>(*m_);
  }

  void Admit(RequestId id, int32_t max_new_tokens) {
    ASSERT_TRUE(m_->Admit(id, kPrompt, max_new_tokens, nullptr).ok());
    std::vector<Bytes> prompt;
    for (int32_t l = 0; l < kLayers; ++l) {
      prompt.push_back(testing::RandomRows(rng_, kPrompt, 8));
      ASSERT_TRUE(m_->IngestPrompt(id, l, prompt.back().data(), nullptr).ok());
    }
    model_.Add(id, prompt, kPrompt);
  }

  // The run phase of the planned step of `batch` (requests 1 and 2), checked against the model:
  // every position of each request's history, in top-k pairs.
  void RunPlannedStep(const std::vector<RequestId>& batch) {
    std::vector<Bytes> new_rows;
    for (int32_t l = 0; l < kLayers; ++l) {
      new_rows.push_back(testing::RandomRows(rng_, static_cast<int64_t>(batch.size()), 8));
    }
    const int32_t len = model_.Length(batch[0], 0) + 1;
    for (int32_t first = 0; first < len; first += 2) {
      std::vector<std::vector<int32_t>> topk(kLayers);
      for (int32_t l = 0; l < kLayers; ++l) {
        for (size_t b = 0; b < batch.size(); ++b) {
          topk[l].push_back(first);
          topk[l].push_back(first + 1 < len ? first + 1 : -1);
        }
      }
      if (first > 0) {
        ASSERT_TRUE(m_->PlanStep(batch, nullptr).ok());
      }
      driver_->UploadInputs(static_cast<int32_t>(batch.size()), new_rows, topk);
      const Status ran = driver_->RunPhase();
      ASSERT_TRUE(ran.ok()) << ran.ToString();
      for (size_t b = 0; b < batch.size(); ++b) {
        for (int32_t l = 0; l < kLayers; ++l) {
          model_.Append(batch[b], l, new_rows[l].data() + b * 8);
        }
      }
      const std::vector<testing::LayerResult> out =
          driver_->DownloadOutputs(static_cast<int32_t>(batch.size()));
      for (int32_t l = 0; l < kLayers; ++l) {
        EXPECT_EQ(testing::CheckLayer(model_, m_->options().geometry, l, batch, topk[l], out[l], 2),
                  0)
            << "layer " << l << ", positions from " << first;
      }
    }
  }

  std::shared_ptr<FaultyBackend> backend_ = std::make_shared<FaultyBackend>();
  std::unique_ptr<SparseKVCacheManager> m_;
  std::unique_ptr<testing::StepDriver> driver_;
  DenseModel model_{KVGeometry::Uniform(kLayers, 8)};
  std::mt19937_64 rng_{7};
  const std::vector<RequestId> ids_ = {1, 2, 3, 4, 5};
};

TEST_F(ManagerPlanTest, ARefusalAfterRequestsThatWouldPlanChangesNothing) {
  struct Refusal {
    std::vector<RequestId> batch;
    std::vector<int32_t> token_ids;  // empty: a step without ids
    StatusCode code;
  };
  const std::vector<Refusal> refusals = {
      {{1, 2, 9}, {}, StatusCode::kNotFound},
      {{1, 2, 4}, {}, StatusCode::kFailedPrecondition},     // retracted
      {{1, 2, 5}, {}, StatusCode::kFailedPrecondition},     // not ingested
      {{1, 2, 1}, {}, StatusCode::kInvalidArgument},        // twice in the batch
      {{1, 2, 3}, {}, StatusCode::kOutOfRange},             // at its reserved length
      {{1, 2, 3, 4, 5}, {}, StatusCode::kInvalidArgument},  // more than max_batch
      {{1, 2}, {7}, StatusCode::kInvalidArgument},          // one token id for two requests
  };
  const std::vector<int64_t> before = testing::ObservableState(*m_, ids_);
  for (const Refusal& r : refusals) {
    const Status s = r.token_ids.empty() ? m_->PlanStep(r.batch, nullptr)
                                         : m_->PlanStep(r.batch, r.token_ids, nullptr);
    EXPECT_EQ(s.code(), r.code) << s.ToString();
    EXPECT_EQ(testing::ObservableState(*m_, ids_), before) << s.ToString();
  }
  ASSERT_TRUE(m_->PlanStep({1, 2}, nullptr).ok());
  RunPlannedStep({1, 2});
}

// A copy failing on the device at any point of the plan (the copies on write of the shared page,
// the page-table uploads, the plan upload) refuses the step with the backend's error, and leaves
// every request, page and counter as it was; the same batch then plans and reads right.
TEST_F(ManagerPlanTest, ADeviceFailureAnywhereInThePlanChangesNothing) {
  const std::vector<int64_t> before = testing::ObservableState(*m_, ids_);
  int refused = 0;
  for (int copies = 0;; ++copies) {
    backend_->FailCopy(copies);
    const Status s = m_->PlanStep({1, 2}, nullptr);
    if (s.ok()) break;
    backend_->Disarm();
    ++refused;
    EXPECT_EQ(s.code(), StatusCode::kInternal) << s.ToString();
    EXPECT_EQ(testing::ObservableState(*m_, ids_), before)
        << "copy " << copies << " failed: " << s.ToString();
    ASSERT_LT(copies, 100);
  }
  backend_->Disarm();
  // Request 1 copies the page both requests share (one copy per layer, then its page-table row),
  // request 2 then writes in place, and the plan is uploaded: four copies, each failed once.
  EXPECT_EQ(refused, 4);
  RunPlannedStep({1, 2});
  const StatusOr<CacheStats> s = m_->ReadStats(nullptr);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->copy_on_write_pages, 1u);
  EXPECT_EQ(s->pages_shared, 1);  // the first page only; the partial page is each one's own
}

}  // namespace
}  // namespace sparsekv
