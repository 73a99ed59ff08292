// Indexer keys kept by the manager (CacheOptions::indexer_key_bytes): the room they take is the
// room residency loses, every refusal, and keys that survive demotion, retraction and forks. The
// randomized workload (manager_model_test.cc, the hybrid seeds with keys) checks every key of
// every step against the dense model.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <vector>

#include "sparsekv/hot_cache.h"
#include "sparsekv/manager.h"
#include "testing/harness.h"
#include "testing/workload.h"

namespace sparsekv {
namespace {

using testing::Bytes;

constexpr int32_t kLayers = 2;
constexpr int32_t kRow = 16;
constexpr int32_t kKey = 8;
constexpr int32_t kPageRows = 4;  // a page holds 4 * 16 / 8 = 8 keys per layer
constexpr int32_t kPrompt = 30;
constexpr int32_t kNew = 3;  // 33 positions: 9 resident pages and 5 pages of keys per request

// Row of position p in layer l of request id: kRow bytes equal to p + 1 + 30 l + 60 (id - 1).
Bytes Rows(RequestId id, int32_t layer, int32_t first, int32_t n) {
  Bytes b(static_cast<size_t>(n) * kRow);
  for (int32_t i = 0; i < n; ++i) {
    std::memset(b.data() + i * kRow, first + i + 1 + 30 * layer + 60 * int(id - 1), kRow);
  }
  return b;
}

class ManagerKeysTest : public ::testing::Test {
 protected:
  // Room for `requests` requests resident with their keys (14 pages each), and top_k 2, C 6,
  // W 2: a block is 2 pages.
  static CacheOptions Options(int32_t requests) {
    CacheOptions o = testing::SmallOptions();
    o.geometry = KVGeometry::Uniform(kLayers, kRow);
    o.hot_slots = 6;
    o.window = 2;
    o.max_requests = 4;
    o.max_context = kPrompt + kNew;
    o.host_capacity_tokens = 4 * 40;  // 5 host pages of 8 tokens per request
    o.host_page_tokens = 8;
    o.hybrid_residency = true;
    o.resident_page_rows = kPageRows;
    o.indexer_key_bytes = kKey;
    const int64_t page = int64_t{kPageRows} * kRow * kLayers;
    const int64_t state = 4 * (HotCache::StateBytes(o.geometry, 6, 1, ReplacementOf(o)) + 2 * 4);
    o.device_budget_bytes = requests * 14 * page + state;
    return o;
  }
  void Create(const CacheOptions& o) {
    auto m = SparseKVCacheManager::Create(o, CreateCpuBackend());
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    m_ = std::move(*m);
    model_ = std::make_unique<testing::DenseModel>(o.geometry);
  }
  void AdmitAndIngest(RequestId id) {
    ASSERT_TRUE(m_->Admit(id, kPrompt, kNew, nullptr).ok());
    std::vector<Bytes> layers;
    for (int32_t l = 0; l < kLayers; ++l) {
      layers.push_back(Rows(id, l, 0, kPrompt));
      ASSERT_TRUE(m_->IngestPrompt(id, l, layers.back().data(), nullptr).ok());
      const Bytes keys =
          testing::KeysOf(layers.back().data(), kPrompt, LayerShape{kRow, kRow}, kKey);
      ASSERT_TRUE(m_->IngestIndexerKeys(id, l, keys.data(), nullptr).ok());
    }
    model_->Add(id, layers, kPrompt);
  }
  // One step of `batch`, each request selecting positions 0 and its newest; checks rows and
  // keys.
  void Step(const std::vector<RequestId>& batch) {
    testing::StepDriver driver(*m_);
    std::vector<Bytes> appended(kLayers);
    std::vector<std::vector<int32_t>> topk(kLayers);
    for (int32_t l = 0; l < kLayers; ++l) {
      for (RequestId id : batch) {
        const int32_t p = model_->Length(id, l);
        const Bytes row = Rows(id, l, p, 1);
        model_->Append(id, l, row.data());
        appended[l].insert(appended[l].end(), row.begin(), row.end());
        topk[l].insert(topk[l].end(), {0, p});
      }
    }
    const std::vector<testing::LayerResult> result = driver.Step(batch, appended, topk);
    for (int32_t l = 0; l < kLayers; ++l) {
      EXPECT_EQ(
          testing::CheckLayer(*model_, m_->options().geometry, l, batch, topk[l], result[l], 2), 0);
    }
    EXPECT_EQ(testing::CheckKeys(*model_, *m_, batch, nullptr), 0);
  }

  std::unique_ptr<SparseKVCacheManager> m_;
  std::unique_ptr<testing::DenseModel> model_;
};

// The pages a request's keys take are charged like its KV: a budget of three requests' rows and
// keys holds three resident requests, and the fourth demotes one (whose keys stay put).
TEST_F(ManagerKeysTest, KeysAndResidentRowsShareTheMemory) {
  Create(Options(3));
  for (RequestId id : {1, 2, 3}) {
    AdmitAndIngest(id);
    EXPECT_TRUE(m_->IsResident(id)) << id;
  }
  Step({1, 2, 3});
  AdmitAndIngest(4);  // 5 pages of keys + a block of 2: demoting one request frees 9 - 2
  EXPECT_EQ(m_->ReadStats(nullptr)->demotions, 1u);
  EXPECT_EQ(m_->ReadStats(nullptr)->resident_requests, 2);
  Step({1, 2, 3, 4});
  // Released requests give their keys' pages back: the demoted one can be promoted again.
  ASSERT_TRUE(m_->Release(4).ok());
  model_->Remove(4);
  for (RequestId id : {1, 2, 3}) {
    if (!m_->IsResident(id)) {
      ASSERT_TRUE(m_->Promote(id, nullptr).ok());
    }
  }
  Step({1, 2, 3});
}

// GLM-5.3: only a group's first layer holds keys. Layer 1 shares layer 0's top-k and has none:
// its keys are refused, its view is empty, a step appends no key to it (null keys are fine), and
// a request needs only layer 0's keys to join a step.
TEST_F(ManagerKeysTest, OnlyKeyedLayersHoldKeys) {
  CacheOptions o = Options(3);
  o.geometry.layers[0].index_group = o.geometry.layers[1].index_group = 0;
  o.geometry.layers[1].indexer_keys = false;
  Create(o);
  ASSERT_TRUE(m_->Admit(1, kPrompt, kNew, nullptr).ok());
  std::vector<Bytes> layers;
  for (int32_t l = 0; l < kLayers; ++l) {
    layers.push_back(Rows(1, l, 0, kPrompt));
    ASSERT_TRUE(m_->IngestPrompt(1, l, layers.back().data(), nullptr).ok());
  }
  const Bytes keys = testing::KeysOf(layers[0].data(), kPrompt, LayerShape{kRow, kRow}, kKey);
  const Status refused = m_->IngestIndexerKeys(1, 1, keys.data(), nullptr);
  EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.message().find("indexer_keys is false"), std::string::npos)
      << refused.message();
  ASSERT_TRUE(m_->IngestIndexerKeys(1, 0, keys.data(), nullptr).ok());
  model_->Add(1, layers, kPrompt);
  EXPECT_EQ(m_->IndexerKeys(1).keys, nullptr);
  Step({1});  // CheckKeys: layer 0's keys, layer 1's empty view

  // By hand: AppendToken of the unkeyed layer takes null keys, the keyed one does not.
  ASSERT_TRUE(m_->PlanStep(std::vector<RequestId>{1}, nullptr).ok());
  const Bytes row = Rows(1, 0, kPrompt + 1, 1);
  EXPECT_EQ(m_->AppendToken(0, row.data(), nullptr, nullptr).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(m_->AppendToken(1, row.data(), nullptr, nullptr).ok());
}

TEST_F(ManagerKeysTest, RetractedRequestsKeepTheirKeysAndForksCopyThem) {
  Create(Options(3));
  AdmitAndIngest(1);
  Step({1});
  ASSERT_TRUE(m_->Retract(1).ok());
  ASSERT_TRUE(m_->Resume(1, nullptr).ok());
  ASSERT_TRUE(m_->Fork(1, 2, 1, nullptr).ok());
  model_->Copy(1, 2);
  ASSERT_TRUE(m_->Release(1).ok());  // the child's keys are its own
  model_->Remove(1);
  Step({2});
}

// "A forked child has its parent's" keys: only the layers the parent has; the others the child
// ingests itself before it may join a step.
TEST_F(ManagerKeysTest, AForkOfAParentWithoutEveryLayersKeysIngestsTheRest) {
  Create(Options(3));
  ASSERT_TRUE(m_->Admit(1, kPrompt, kNew, nullptr).ok());
  std::vector<Bytes> layers;
  std::vector<Bytes> keys;
  for (int32_t l = 0; l < kLayers; ++l) {
    layers.push_back(Rows(1, l, 0, kPrompt));
    ASSERT_TRUE(m_->IngestPrompt(1, l, layers.back().data(), nullptr).ok());
    keys.push_back(testing::KeysOf(layers.back().data(), kPrompt, LayerShape{kRow, kRow}, kKey));
  }
  model_->Add(1, layers, kPrompt);
  ASSERT_TRUE(m_->IngestIndexerKeys(1, 0, keys[0].data(), nullptr).ok());  // layer 0 only
  ASSERT_TRUE(m_->Fork(1, 2, kNew, nullptr).ok());
  model_->Copy(1, 2);
  EXPECT_EQ(m_->IngestIndexerKeys(2, 0, keys[0].data(), nullptr).code(),
            StatusCode::kAlreadyExists);  // copied from the parent
  const std::vector<RequestId> child = {2};
  EXPECT_EQ(m_->PlanStep(child, nullptr).code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(m_->IngestIndexerKeys(2, 1, keys[1].data(), nullptr).ok());
  ASSERT_TRUE(m_->IngestIndexerKeys(1, 1, keys[1].data(), nullptr).ok());
  Step({1, 2});
}

TEST_F(ManagerKeysTest, RefusalsChangeNothing) {
  Create(Options(3));
  const Bytes keys(kPrompt * kKey, std::byte{7});
  EXPECT_EQ(m_->IngestIndexerKeys(1, 0, keys.data(), nullptr).code(), StatusCode::kNotFound);
  ASSERT_TRUE(m_->Admit(1, kPrompt, kNew, nullptr).ok());
  EXPECT_EQ(m_->IngestIndexerKeys(1, kLayers, keys.data(), nullptr).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(m_->IngestIndexerKeys(1, 0, nullptr, nullptr).code(), StatusCode::kInvalidArgument);
  for (int32_t l = 0; l < kLayers; ++l) {
    const Bytes rows = Rows(1, l, 0, kPrompt);
    ASSERT_TRUE(m_->IngestPrompt(1, l, rows.data(), nullptr).ok());
  }
  // Rows, but not yet keys: the request cannot join a step.
  const Status early = m_->PlanStep(std::vector<RequestId>{1}, nullptr);
  EXPECT_EQ(early.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(early.message().find("indexer keys"), std::string::npos) << early.message();
  for (int32_t l = 0; l < kLayers; ++l) {
    ASSERT_TRUE(m_->IngestIndexerKeys(1, l, keys.data(), nullptr).ok());
  }
  EXPECT_EQ(m_->IngestIndexerKeys(1, 0, keys.data(), nullptr).code(), StatusCode::kAlreadyExists);
  ASSERT_TRUE(m_->PlanStep(std::vector<RequestId>{1}, nullptr).ok());
  const Bytes row = Rows(1, 0, kPrompt, 1);
  EXPECT_EQ(m_->AppendToken(0, row.data(), nullptr).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(m_->AppendToken(0, row.data(), nullptr, nullptr).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(m_->IndexerKeys(0).key_bytes, kKey);
  EXPECT_EQ(m_->IndexerKeys(kLayers).keys, nullptr);

  // Without indexer keys: nothing to ingest, and the view is empty.
  CacheOptions o = testing::SmallOptions();
  auto plain = SparseKVCacheManager::Create(o, CreateCpuBackend());
  ASSERT_TRUE(plain.ok());
  ASSERT_TRUE((*plain)->Admit(1, 4, 1, nullptr).ok());
  EXPECT_EQ((*plain)->IngestIndexerKeys(1, 0, keys.data(), nullptr).code(),
            StatusCode::kFailedPrecondition);
  EXPECT_EQ((*plain)->IndexerKeys(0).keys, nullptr);
}

TEST_F(ManagerKeysTest, BudgetTooSmallForTheKeysIsRefused) {
  CacheOptions o = Options(0);
  // Room for max_requests blocks (2 pages each) and their keys (5 pages each), but a byte.
  const int64_t page = int64_t{kPageRows} * kRow * kLayers;
  o.device_budget_bytes += 4 * 7 * page - 1;
  auto m = SparseKVCacheManager::Create(o, CreateCpuBackend());
  EXPECT_EQ(m.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(m.status().message().find("indexer keys"), std::string::npos) << m.status().message();
  o.device_budget_bytes += 1;
  EXPECT_TRUE(SparseKVCacheManager::Create(o, CreateCpuBackend()).ok());
}

}  // namespace
}  // namespace sparsekv
