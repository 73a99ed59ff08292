// A manager over DeepSeek-V4's layer kinds on the CPU backend: random lifecycles checked against
// the dense model of testing/layer_kinds_model.h, then the refusals.
#include <gtest/gtest.h>

#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "manager/dense_layer_store.h"
#include "sparsekv/host_kv_pool.h"
#include "sparsekv/hot_cache.h"
#include "sparsekv/manager.h"
#include "sparsekv/node_pool.h"
#include "testing/counting_backend.h"
#include "testing/forwarding_backend.h"
#include "testing/harness.h"
#include "testing/layer_kinds_model.h"

namespace sparsekv {
namespace {

using testing::Bytes;
using testing::kMaxBatch;
using testing::kRawWindow;
using testing::kStride;
using testing::kTopK;
using testing::V4Shaped;

// `o` in the entries the manager sizes its parts in: max_context / 4 (the clock's positions).
CacheOptions V4EntryOptions(CacheOptions o) {
  o.max_context /= 4;
  return o;
}

TEST(ManagerLayerKindsTest, RandomLifecyclesMatchTheDenseModel) {
  for (uint64_t seed = 1; seed <= 12; ++seed) {
    SCOPED_TRACE(seed);
    testing::LayerKindsModel model(seed, /*hybrid=*/seed % 3 == 0, CreateCpuBackend());
    model.Run(600);
    if (::testing::Test::HasFailure()) return;
    EXPECT_GT(model.steps(), 100);
  }
}

// Before some steps' plans, a refused plan: a batch with an unknown or a repeated request after
// those that would plan, and the same batch with a device copy failing at some point of the plan
// (DenseLayerStore's step table, a copy on write, the plan). Each refusal leaves the lengths,
// pages, counters and memory figures as they were, and the lifecycle's checks (entries and raw
// windows read through the views) hold after every later step.
TEST(ManagerLayerKindsTest, RefusedPlansChangeNothing) {
  std::vector<RequestId> ids(64);
  std::iota(ids.begin(), ids.end(), 1);
  for (uint64_t seed = 1; seed <= 6; ++seed) {
    SCOPED_TRACE(seed);
    auto backend = std::make_shared<testing::FaultyBackend>();
    testing::LayerKindsModel model(seed, /*hybrid=*/seed % 3 == 0, backend);
    std::mt19937_64 rng(seed);
    int32_t refused = 0;
    model.BeforePlan([&](SparseKVCacheManager& m, const std::vector<RequestId>& batch) {
      if (rng() % 2 == 0) return false;
      const std::vector<int64_t> before = testing::ObservableState(m, ids);
      std::vector<RequestId> bad = batch;
      bad.push_back(1000);
      // (A batch one past max_batch is refused for its size first.)
      EXPECT_EQ(m.PlanStep(bad, nullptr).code(),
                bad.size() > kMaxBatch ? StatusCode::kInvalidArgument : StatusCode::kNotFound);
      bad.back() = batch.front();
      EXPECT_EQ(m.PlanStep(bad, nullptr).code(), StatusCode::kInvalidArgument);
      EXPECT_EQ(testing::ObservableState(m, ids), before);
      backend->FailCopy(static_cast<int>(rng() % 3));
      const Status s = m.PlanStep(batch, nullptr);
      backend->Disarm();
      if (s.ok()) return true;
      ++refused;
      EXPECT_EQ(s.code(), StatusCode::kInternal) << s.ToString();
      EXPECT_EQ(testing::ObservableState(m, ids), before) << s.ToString();
      return false;
    });
    model.Run(400);
    if (::testing::Test::HasFailure()) return;
    EXPECT_GT(refused, 10);
  }
}

// The same with prefix sharing: admissions with AdmitWithPrefix (new prompts, and continuations
// of retained or live conversations), steps with token ids, Retain, release of retained
// conversations and eviction (also under the pool's pressure). A shared prefix's resident entries
// are restored from the retained conversation's host copy and read back as the model's; the raw
// windows come from the new prompt's rows. Everything released, the pool and the store are empty.
TEST(ManagerLayerKindsTest, RandomSharingLifecyclesMatchTheDenseModel) {
  int64_t hit_tokens = 0;
  int32_t restored = 0;
  for (uint64_t seed = 1; seed <= 12; ++seed) {
    SCOPED_TRACE(seed);
    testing::LayerKindsModel model(seed, /*hybrid=*/seed % 3 == 0, CreateCpuBackend(),
                                   /*sharing=*/true);
    model.Run(600);
    model.ReleaseAll();
    if (::testing::Test::HasFailure()) return;
    EXPECT_GT(model.steps(), 100);
    hit_tokens += model.hit_tokens();
    restored += model.restored();
  }
  EXPECT_GT(hit_tokens, 0);
  EXPECT_GT(restored, 0);
}

// Admits `ids` with AdmitWithPrefix and ingests every layer (rows of zeros); returns cached.
int32_t AdmitZeros(SparseKVCacheManager& m, RequestId id, const std::vector<int32_t>& ids) {
  const StatusOr<int32_t> cached = m.AdmitWithPrefix(id, ids, 8, nullptr);
  EXPECT_TRUE(cached.ok()) << cached.status().ToString();
  if (!cached.ok()) return -1;
  const Bytes rows(ids.size() * kStride), window(kRawWindow * kStride);
  for (int32_t l = 0; l < m.options().geometry.num_layers(); ++l) {
    const Status s =
        m.IngestPrompt(id, l, PromptRows{.entries = rows.data(), .window = window.data()}, nullptr);
    EXPECT_TRUE(s.ok()) << s.ToString();
  }
  return *cached;
}

// With resident layers, a retained conversation's copy of its resident entries serves a prefix:
// once the conversation is evicted, a prefix that a live request still holds is not a hit.
// Without resident layers (a raw window only) the live request's pages are shared as ever.
TEST(ManagerLayerKindsTest, APrefixIsSharedAsFarAsARetainedConversationHoldsIt) {
  std::vector<int32_t> ids(300);
  for (int32_t t = 0; t < 300; ++t) ids[t] = t % 5;
  std::vector<int32_t> next = ids;
  next.push_back(1);
  {
    auto m = SparseKVCacheManager::Create(V4Shaped(false), CreateCpuBackend());
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    EXPECT_EQ(AdmitZeros(**m, 1, ids), 0);
    ASSERT_TRUE((*m)->Fork(1, 2, 4, nullptr).ok());  // request 2 holds the same pages, live
    EXPECT_EQ(*(*m)->Retain(1), 256);                // 4 pages of 16 entries of 4 tokens
    EXPECT_EQ(AdmitZeros(**m, 3, next), 256);
    ASSERT_TRUE((*m)->Release(3).ok());
    EXPECT_EQ((*m)->EvictRetained(), 1);
    EXPECT_EQ(AdmitZeros(**m, 4, next), 0);  // only request 2 holds the prefix
  }
  CacheOptions o = V4Shaped(false);
  for (int32_t l : {1, 3}) {
    o.geometry.layers[l].kind = LayerKind::kOffloaded;
    o.geometry.layers[l].entry_tokens = 4;
  }
  auto m = SparseKVCacheManager::Create(o, CreateCpuBackend());
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(AdmitZeros(**m, 1, ids), 0);
  EXPECT_EQ(AdmitZeros(**m, 2, next), 256);  // request 1 is live
}

class ManagerLayerKindsRefusalTest : public ::testing::Test {
 protected:
  void SetUp() override {
    backend_ = CreateCpuBackend();
    auto m = SparseKVCacheManager::Create(V4Shaped(false), backend_);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    m_ = std::move(*m);
    ASSERT_TRUE(m_->Admit(1, 200, 10, nullptr).ok());
    const Bytes rows(200 * kStride), window(kRawWindow * kStride);
    for (int32_t l = 0; l < 5; ++l) {
      ASSERT_TRUE(m_->IngestPrompt(
                        1, l, PromptRows{.entries = rows.data(), .window = window.data()}, nullptr)
                      .ok());
    }
  }
  std::shared_ptr<Backend> backend_;
  std::unique_ptr<SparseKVCacheManager> m_;
  const Bytes rows_ = Bytes(kMaxBatch * kStride);
};

TEST_F(ManagerLayerKindsRefusalTest, ResidentAndWindowOnlyLayersHaveNoTopK) {
  ASSERT_TRUE(m_->PlanStep({1}, nullptr).ok());
  for (int32_t l = 0; l < 5; ++l) {
    ASSERT_TRUE(
        m_->AppendToken(l, StepRows{.entries = rows_.data(), .window = rows_.data()}, nullptr)
            .ok());
  }
  std::vector<int32_t> topk(kMaxBatch * kTopK, 0), slots(kMaxBatch * kTopK);
  Status s = m_->RunLayer(1, topk.data(), slots.data(), nullptr, nullptr);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("kResident"), std::string::npos) << s.message();
  s = m_->ResolveLayer(4, topk.data(), slots.data(), nullptr, nullptr);
  EXPECT_NE(s.message().find("kWindowOnly"), std::string::npos) << s.message();
  EXPECT_EQ(m_->CopyMisses(3, nullptr).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(m_->DenseEntries(0).status().code(), StatusCode::kInvalidArgument);
  // Only the offloaded layers' groups resolve before the step may finish.
  EXPECT_EQ(m_->FinishStep(nullptr).code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(m_->RunLayer(0, topk.data(), slots.data(), nullptr, nullptr).ok());
  ASSERT_TRUE(m_->RunLayer(2, topk.data(), slots.data(), nullptr, nullptr).ok());
  EXPECT_TRUE(m_->FinishStep(nullptr).ok());
}

TEST_F(ManagerLayerKindsRefusalTest, EveryLayerIsAppendedWithItsRows) {
  ASSERT_TRUE(m_->PlanStep({1}, nullptr).ok());
  // The form without a window, and a resident layer without entries.
  EXPECT_EQ(m_->AppendToken(0, rows_.data(), nullptr).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(m_->AppendToken(1, StepRows{.window = rows_.data()}, nullptr).code(),
            StatusCode::kInvalidArgument);
  // A window-only layer needs no entries.
  EXPECT_TRUE(m_->AppendToken(4, StepRows{.window = rows_.data()}, nullptr).ok());
  EXPECT_EQ(m_->AppendToken(4, StepRows{.window = rows_.data()}, nullptr).code(),
            StatusCode::kFailedPrecondition);
  std::vector<int32_t> topk(kMaxBatch * kTopK, 0), slots(kMaxBatch * kTopK);
  for (int32_t l : {0, 2}) {
    ASSERT_TRUE(
        m_->AppendToken(l, StepRows{.entries = rows_.data(), .window = rows_.data()}, nullptr)
            .ok());
    ASSERT_TRUE(m_->RunLayer(l, topk.data(), slots.data(), nullptr, nullptr).ok());
  }
  const Status s = m_->FinishStep(nullptr);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("layer 1"), std::string::npos) << s.message();
}

TEST_F(ManagerLayerKindsRefusalTest, SealedPromptsAreRefused) {
  const Status s = m_->AdmitSealedPrompt(3, 0, 0, 4, nullptr);
  EXPECT_EQ(s.code(), StatusCode::kUnimplemented);
  EXPECT_NE(s.message().find("raw_window"), std::string::npos) << s.message();
}

TEST(ManagerLayerKindsTest, GeometriesItDoesNotServeAreRefused) {
  CacheOptions o = V4Shaped(false);
  for (int32_t l : {0, 2}) {
    o.geometry.layers[l].kind = LayerKind::kResident;
    o.geometry.layers[l].entry_tokens = 128;
  }
  const auto none = SparseKVCacheManager::Create(o, CreateCpuBackend());
  EXPECT_EQ(none.status().code(), StatusCode::kInvalidArgument) << none.status().ToString();
  EXPECT_NE(none.status().message().find("no offloaded layer"), std::string::npos);

  // A shared pool is laid out over every layer, so none is made for these layers.
  const CacheOptions v4 = V4Shaped(false);
  const auto pool =
      HostKVPool::CreateShared(v4, 2 * v4.effective_max_host_requests(), CreateCpuBackend());
  EXPECT_EQ(pool.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(pool.status().message().find("kResident"), std::string::npos)
      << pool.status().message();
  EXPECT_EQ(NodePoolBytes(v4, 2, NodePoolOptions{}).status().code(), StatusCode::kUnimplemented);
}

// The host pool and the hot cache hold the offloaded layers (0 and 2) only: their figures follow
// the formula over those layers and are what the backend allocated.
TEST(ManagerLayerKindsTest, ThePoolAndTheHotCacheHoldOnlyOffloadedLayers) {
  const CacheOptions o = V4Shaped(false);
  auto backend = std::make_shared<testing::CountingBackend>();
  auto m = SparseKVCacheManager::Create(o, backend);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  const HostKVPool& pool = (*m)->host_pool();
  EXPECT_EQ(o.geometry.token_stride_bytes(), 2 * kStride);
  // 1600 tokens are 400 entries, 25 pages of 16.
  EXPECT_EQ(pool.bytes(), 400 * 2 * kStride);
  EXPECT_EQ(pool.layer_base(1), nullptr);
  EXPECT_EQ(pool.layer_base(4), nullptr);
  EXPECT_EQ(backend->live_host_bytes(), pool.bytes());
  CacheStats s = *(*m)->ReadStats(nullptr);
  EXPECT_EQ(s.host_memory.total, pool.bytes());
  EXPECT_EQ(s.host_memory.sum(), s.host_memory.total);
  // Without a budget, max_requests blocks of one page of 6 + 2 slots of the offloaded layers, and
  // the replacement state of their two groups.
  const HotCacheReplacement clock = ReplacementOf(V4EntryOptions(o));
  EXPECT_EQ(s.device_memory.free_rows, 4 * 8 * 2 * kStride);
  EXPECT_EQ(s.device_memory.replacement_state, 4 * (HotCache::StateBytesOf(2, 6, clock) + 4));
  EXPECT_EQ(s.device_bytes, backend->live_device_bytes());
  EXPECT_EQ(s.device_memory.sum(), s.device_bytes);
  // A request: its block's rows and the store's entries and windows, still all allocated bytes.
  ASSERT_TRUE((*m)->Admit(1, 300, 212, nullptr).ok());
  s = *(*m)->ReadStats(nullptr);
  EXPECT_EQ(s.device_memory.hot_cache_rows, 8 * 2 * kStride);
  EXPECT_EQ(s.device_memory.free_rows, 3 * 8 * 2 * kStride);
  EXPECT_EQ(s.device_bytes, backend->live_device_bytes());
  EXPECT_EQ(s.device_memory.sum(), s.device_bytes);
}

// A retained conversation's host copy of its part of the resident layers' store is counted in
// host_memory.retained_entries, outside the pool: the bytes the store's device allocation for it
// held, which the backend gives back when the copy is taken, until the conversation is evicted.
TEST(ManagerLayerKindsTest, RetainedEntriesCountTheHostCopiesOfTheStore) {
  auto backend = std::make_shared<testing::CountingBackend>();
  auto m = SparseKVCacheManager::Create(V4Shaped(false), backend);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  std::vector<int32_t> ids(300);
  for (int32_t t = 0; t < 300; ++t) ids[t] = t % 7;
  EXPECT_EQ(AdmitZeros(**m, 1, ids), 0);
  CacheStats s = *(*m)->ReadStats(nullptr);
  EXPECT_EQ(s.host_memory.retained_entries, 0);
  const int64_t store = s.device_memory.resident_entries + s.device_memory.windows;
  ASSERT_GT(s.device_memory.resident_entries, 0);
  ASSERT_GT(s.device_memory.windows, 0);
  const int64_t device_before = backend->live_device_bytes();
  const int64_t host_before = backend->live_host_bytes();
  ASSERT_TRUE((*m)->Retain(1).ok());
  s = *(*m)->ReadStats(nullptr);
  EXPECT_EQ(s.retained_conversations, 1);
  EXPECT_EQ(s.host_memory.retained_entries, store);
  EXPECT_EQ(device_before - backend->live_device_bytes(), s.host_memory.retained_entries);
  // The copy is host memory outside the pool: the pool's figures do not move.
  EXPECT_EQ(backend->live_host_bytes(), host_before);
  EXPECT_EQ(s.host_memory.sum(), s.host_memory.total);
  EXPECT_EQ(s.host_memory.total, (*m)->host_pool().bytes());
  // Evicted, the copy is dropped.
  EXPECT_EQ((*m)->EvictRetained(), 1);
  s = *(*m)->ReadStats(nullptr);
  EXPECT_EQ(s.host_memory.retained_entries, 0);
}

// At one device_budget_bytes the hot cache gets the pages that the resident and window-only layers'
// rows took before: pages of R entries of the offloaded layers alone.
TEST(ManagerLayerKindsTest, TheBudgetBuysPagesOfTheOffloadedLayersOnly) {
  CacheOptions o = V4Shaped(/*hybrid=*/true);
  o.device_budget_bytes = 1 << 16;
  auto m = SparseKVCacheManager::Create(o, CreateCpuBackend());
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  // The store's share first (max_requests requests of max_context tokens and its tables), then
  // the blocks' state (clock over 160 entries, page lists of 4 pages of R = 2), then pages.
  const DenseLayerStoreOptions dense{.geometry = o.geometry,
                                     .raw_window = o.raw_window,
                                     .page_rows = o.resident_page_rows,
                                     .max_requests = o.max_requests,
                                     .max_batch = o.effective_max_batch(),
                                     .max_request_tokens = o.max_context};
  const int64_t share = DenseLayerStore::TableBytes(dense) +
                        o.max_requests * DenseLayerStore::RequestBytes(dense, o.max_context).sum();
  const HotCacheReplacement clock = ReplacementOf(V4EntryOptions(o));
  const auto pages = [&](int64_t row_bytes, int32_t states) {
    const int64_t state = o.max_requests * (HotCache::StateBytesOf(states, 6, clock) + 4 * 4);
    return (o.device_budget_bytes - share - state) / (2 * row_bytes);
  };
  const int64_t now = pages(2 * kStride, 2);
  const int64_t before = pages(5 * kStride, 5);  // a row and a state in every layer
  const CacheStats s = *(*m)->ReadStats(nullptr);
  EXPECT_EQ(s.device_memory.free_rows, now * 2 * 2 * kStride);
  EXPECT_GT(now, before);
  EXPECT_EQ((*m)->options().hot_slots, 6);
}

// DeepSeek-V4's presets, whole: every layer, the raw window, keys on the CSA layers.
TEST(ManagerLayerKindsTest, TheDeepSeekV4PresetsAreServed) {
  for (const char* name : {"deepseek-v4-flash", "deepseek-v4-pro"}) {
    const StatusOr<ModelPreset> p = FindPreset(name);
    ASSERT_TRUE(p.ok());
    auto m = SparseKVCacheManager::Create(testing::SmallPresetOptions(*p), CreateCpuBackend());
    ASSERT_TRUE(m.ok()) << name << ": " << m.status().ToString();
    // The host pool: 1024 tokens are 256 entries, a row of the offloaded (CSA) layers each.
    EXPECT_EQ((*m)->host_pool().bytes(),
              int64_t{256} * p->layers_of(LayerKind::kOffloaded) * p->row_bytes)
        << name;
    EXPECT_EQ((*m)->host_pool().page_bytes(),
              int64_t{64} * p->layers_of(LayerKind::kOffloaded) * p->row_bytes)
        << name;
    EXPECT_TRUE((*m)->Admit(1, 600, 100, nullptr).ok());
    const CacheStats s = *(*m)->ReadStats(nullptr);
    EXPECT_EQ(s.device_memory.windows, int64_t{p->num_layers} * p->raw_window * p->row_bytes)
        << name;
    EXPECT_EQ(s.device_memory.resident_entries,
              int64_t{p->layers_of(LayerKind::kResident)} * 64 * p->row_bytes)
        << name;  // 700 tokens: 5 entries of 128, one page of 64
  }
}

TEST(ManagerLayerKindsTest, TheStoreTakesItsShareOfTheBudgetAndIsCounted) {
  CacheOptions o = V4Shaped(false);
  o.hot_slots = 0;  // as many as the budget leaves
  o.device_budget_bytes = 1 << 20;
  auto m = SparseKVCacheManager::Create(o, CreateCpuBackend());
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  CacheStats s = *(*m)->ReadStats(nullptr);
  EXPECT_EQ(s.device_memory.resident_entries, 0);
  EXPECT_EQ(s.device_memory.windows, 0);
  EXPECT_EQ(s.device_memory.sum(), s.device_bytes);
  ASSERT_TRUE((*m)->Admit(1, 300, 212, nullptr).ok());  // 512 tokens
  s = *(*m)->ReadStats(nullptr);
  // 2 resident layers of 4 entries (2 pages of 2), 5 rings of 8 rows; 16-B rows.
  EXPECT_EQ(s.device_memory.resident_entries, 2 * 4 * kStride);
  EXPECT_EQ(s.device_memory.windows, 5 * kRawWindow * kStride);
  EXPECT_EQ(s.device_memory.sum(), s.device_bytes);
  // A budget that the store's share alone fills (4 requests of 640 tokens: 2 x 3 pages of 2
  // entries and 5 rings each, 3,328 B, and the tables) is refused, naming the option.
  o.device_budget_bytes = 3000;
  const auto small = SparseKVCacheManager::Create(o, CreateCpuBackend());
  EXPECT_EQ(small.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(small.status().message().find("device_budget_bytes"), std::string::npos);
  EXPECT_NE(small.status().message().find("raw windows"), std::string::npos)
      << small.status().message();
}

}  // namespace
}  // namespace sparsekv
