// A manager over DeepSeek-V4's layer kinds: offloaded layers (an entry per 4 tokens, through the
// host pool and the hot cache), resident layers (an entry per 128 tokens, all on the device) and a
// window-only layer, every layer with a raw window. Random lifecycles are checked after every step
// against a model that keeps every entry and raw row in plain arrays; then the refusals.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <vector>

#include "sparsekv/host_kv_pool.h"
#include "sparsekv/kernel_views.h"
#include "sparsekv/manager.h"
#include "testing/harness.h"

namespace sparsekv {
namespace {

using testing::Bytes;

constexpr int32_t kStride = 16;
constexpr int32_t kRawWindow = 8;
constexpr int32_t kTopK = 3;
constexpr int32_t kMaxBatch = 3;

// Layers 0 and 2: CSA (offloaded, r = 4); 1 and 3: HCA (resident, r = 128); 4: window-only.
CacheOptions V4Shaped(bool hybrid) {
  CacheOptions o;
  for (int32_t l = 0; l < 5; ++l) {
    LayerShape s{kStride, kStride};
    if (l == 0 || l == 2) s.entry_tokens = 4;
    if (l == 1 || l == 3) {
      s.kind = LayerKind::kResident;
      s.entry_tokens = 128;
    }
    if (l == 4) s.kind = LayerKind::kWindowOnly;
    if (l != 0 && l != 2) s.indexer_keys = false;
    o.geometry.layers.push_back(s);
  }
  o.raw_window = kRawWindow;
  o.top_k = kTopK;
  o.hot_slots = 6;
  o.window = 2;
  o.max_requests = 4;
  o.max_host_requests = 5;
  o.max_batch = kMaxBatch;
  o.max_context = 640;
  o.host_page_tokens = 16;
  o.host_capacity_tokens = 1600;  // 400 entries: admissions are sometimes refused
  o.resident_page_rows = 2;
  o.hybrid_residency = hybrid;
  return o;
}

int32_t Cadence(const CacheOptions& o, int32_t layer) {
  return o.geometry.layers[layer].entry_tokens;
}
bool HasEntries(const CacheOptions& o, int32_t layer) {
  return o.geometry.layers[layer].kind != LayerKind::kWindowOnly;
}

// A request's history: per layer every entry, and every raw row by token (rows before the
// prompt's window were never given and are not checked).
struct History {
  int32_t tokens = 0;
  int32_t reserved = 0;
  bool retracted = false;
  std::vector<std::vector<Bytes>> entries;    // [layer][entry]
  std::vector<std::map<int32_t, Bytes>> raw;  // [layer] token -> row
};

Bytes Row(std::mt19937_64& rng) {
  Bytes b(kStride);
  for (std::byte& x : b) x = static_cast<std::byte>(rng() & 0xff);
  return b;
}

class LayerKindsModel {
 public:
  explicit LayerKindsModel(uint64_t seed, bool hybrid) : rng_(seed), o_(V4Shaped(hybrid)) {
    backend_ = CreateCpuBackend();
    auto m = SparseKVCacheManager::Create(o_, backend_);
    EXPECT_TRUE(m.ok()) << m.status().ToString();
    m_ = std::move(*m);
  }

  void Run(int32_t ops) {
    for (int32_t i = 0; i < ops && !::testing::Test::HasFailure(); ++i) {
      const uint64_t pick = rng_() % 20;
      if (pick < 4) {
        Admit();
      } else if (pick < 12) {
        Step();
      } else if (pick < 14) {
        Fork();
      } else if (pick < 16) {
        Retract();
      } else if (pick < 18) {
        Resume();
      } else if (pick < 19) {
        Release();
      } else {
        Promote();
      }
    }
  }

  int32_t steps() const { return steps_; }

 private:
  int32_t Layers() const { return o_.geometry.num_layers(); }

  std::vector<RequestId> Live(bool on_device) const {
    std::vector<RequestId> ids;
    for (const auto& [id, h] : model_) {
      if (h.retracted != on_device) ids.push_back(id);
    }
    return ids;
  }
  RequestId Any(const std::vector<RequestId>& ids) { return ids[rng_() % ids.size()]; }

  void Admit() {
    const RequestId id = next_id_++;
    const int32_t prompt = 1 + static_cast<int32_t>(rng_() % 300);
    const int32_t new_tokens = static_cast<int32_t>(rng_() % 300);
    const Status s = m_->Admit(id, prompt, new_tokens, nullptr);
    if (s.code() == StatusCode::kResourceExhausted) return;
    ASSERT_TRUE(s.ok()) << s.ToString();
    History h;
    h.tokens = prompt;
    h.reserved = prompt + new_tokens;
    h.entries.resize(Layers());
    h.raw.resize(Layers());
    for (int32_t l = 0; l < Layers(); ++l) {
      Bytes entries, window;
      if (HasEntries(o_, l)) {
        for (int32_t e = 0; e < prompt / Cadence(o_, l); ++e) {
          h.entries[l].push_back(Row(rng_));
          entries.insert(entries.end(), h.entries[l].back().begin(), h.entries[l].back().end());
        }
      }
      for (int32_t t = prompt - std::min(prompt, kRawWindow); t < prompt; ++t) {
        h.raw[l][t] = Row(rng_);
        window.insert(window.end(), h.raw[l][t].begin(), h.raw[l][t].end());
      }
      const PromptRows rows{.entries = entries.empty() ? nullptr : entries.data(),
                            .window = window.data()};
      const Status ingested = m_->IngestPrompt(id, l, rows, nullptr);
      ASSERT_TRUE(ingested.ok()) << ingested.ToString();
    }
    model_[id] = std::move(h);
  }

  void Fork() {
    std::vector<RequestId> ids = Live(true);
    if (ids.empty()) return;
    const RequestId parent = Any(ids), child = next_id_++;
    const int32_t new_tokens = static_cast<int32_t>(rng_() % 100);
    const Status s = m_->Fork(parent, child, new_tokens, nullptr);
    if (s.code() == StatusCode::kResourceExhausted || s.code() == StatusCode::kOutOfRange) return;
    ASSERT_TRUE(s.ok()) << s.ToString();
    History h = model_.at(parent);
    h.reserved = h.tokens + new_tokens;
    model_[child] = std::move(h);
  }

  void Retract() {
    std::vector<RequestId> ids = Live(true);
    if (ids.empty()) return;
    const RequestId id = Any(ids);
    ASSERT_TRUE(m_->Retract(id).ok());
    model_.at(id).retracted = true;
  }

  void Resume() {
    std::vector<RequestId> ids = Live(false);
    if (ids.empty()) return;
    const RequestId id = Any(ids);
    const Status s = m_->Resume(id, nullptr);
    if (s.code() == StatusCode::kResourceExhausted) return;
    ASSERT_TRUE(s.ok()) << s.ToString();
    model_.at(id).retracted = false;
  }

  void Release() {
    if (model_.empty()) return;
    std::vector<RequestId> ids;
    for (const auto& [id, h] : model_) ids.push_back(id);
    const RequestId id = Any(ids);
    ASSERT_TRUE(m_->Release(id).ok());
    model_.erase(id);
  }

  void Promote() {
    std::vector<RequestId> ids = Live(true);
    if (ids.empty() || !o_.hybrid_residency) return;
    const RequestId id = Any(ids);
    if (m_->IsResident(id)) return;
    const Status s = m_->Promote(id, nullptr);
    // Forked children stay in hot-cache mode; a full device leaves the request where it is.
    ASSERT_TRUE(s.ok() || s.code() == StatusCode::kResourceExhausted ||
                s.code() == StatusCode::kFailedPrecondition)
        << s.ToString();
  }

  void Step() {
    std::vector<RequestId> batch;
    for (RequestId id : Live(true)) {
      const History& h = model_.at(id);
      if (h.tokens < h.reserved && batch.size() < kMaxBatch && rng_() % 4 != 0) batch.push_back(id);
    }
    if (batch.empty()) return;
    ASSERT_TRUE(m_->PlanStep(batch, nullptr).ok());
    ++steps_;
    const int32_t n = static_cast<int32_t>(batch.size());
    for (RequestId id : batch) ++model_.at(id).tokens;
    for (int32_t l = 0; l < Layers(); ++l) {
      // The step's rows: entry b of the batch (kept only if the token completes one) and raw row.
      Bytes entries(kMaxBatch * kStride), window(kMaxBatch * kStride);
      for (int32_t b = 0; b < n; ++b) {
        History& h = model_.at(batch[b]);
        const Bytes e = Row(rng_), w = Row(rng_);
        std::memcpy(entries.data() + b * kStride, e.data(), kStride);
        std::memcpy(window.data() + b * kStride, w.data(), kStride);
        if (HasEntries(o_, l) && h.tokens % Cadence(o_, l) == 0) h.entries[l].push_back(e);
        h.raw[l][h.tokens - 1] = w;
      }
      const Status appended =
          m_->AppendToken(l, StepRows{.entries = entries.data(), .window = window.data()}, nullptr);
      ASSERT_TRUE(appended.ok()) << appended.ToString();
      if (o_.geometry.layers[l].kind == LayerKind::kOffloaded) {
        CheckOffloaded(l, batch);
      } else if (o_.geometry.layers[l].kind == LayerKind::kResident) {
        CheckResident(l, batch);
      }
      CheckWindow(l, batch);
    }
    const Status finished = m_->FinishStep(nullptr);
    ASSERT_TRUE(finished.ok()) << finished.ToString();
  }

  // A random top-k of each row's entries is assembled as the model holds them.
  void CheckOffloaded(int32_t l, const std::vector<RequestId>& batch) {
    std::vector<int32_t> topk(kMaxBatch * kTopK, -1), slots(kMaxBatch * kTopK, -1);
    Bytes assembled(kMaxBatch * kTopK * kStride);
    for (size_t b = 0; b < batch.size(); ++b) {
      const int32_t count = static_cast<int32_t>(model_.at(batch[b]).entries[l].size());
      for (int32_t k = 0; k < kTopK; ++k) {
        const int32_t e = count > 0 ? static_cast<int32_t>(rng_() % count) : -1;
        const auto row = topk.begin() + b * kTopK;
        // Distinct entries (a repeated one is skipped: ResolveView); some padding.
        if (rng_() % 5 != 0 && std::find(row, row + k, e) == row + k) topk[b * kTopK + k] = e;
      }
    }
    const Status run = m_->RunLayer(l, topk.data(), slots.data(), assembled.data(), nullptr);
    ASSERT_TRUE(run.ok()) << run.ToString();
    for (size_t b = 0; b < batch.size(); ++b) {
      for (int32_t k = 0; k < kTopK; ++k) {
        const int32_t e = topk[b * kTopK + k];
        if (e < 0) continue;
        ASSERT_EQ(std::memcmp(assembled.data() + (b * kTopK + k) * kStride,
                              model_.at(batch[b]).entries[l][e].data(), kStride),
                  0)
            << "layer " << l << " request " << batch[b] << " entry " << e;
      }
    }
  }

  void CheckResident(int32_t l, const std::vector<RequestId>& batch) {
    const StatusOr<DenseEntriesView> view = m_->DenseEntries(l);
    ASSERT_TRUE(view.ok()) << view.status().ToString();
    ASSERT_EQ(*view->batch_size, static_cast<int32_t>(batch.size()));
    for (size_t b = 0; b < batch.size(); ++b) {
      const History& h = model_.at(batch[b]);
      ASSERT_EQ(view->Count(static_cast<int32_t>(b)), static_cast<int32_t>(h.entries[l].size()));
      for (int32_t e = 0; e < view->Count(static_cast<int32_t>(b)); ++e) {
        ASSERT_EQ(
            std::memcmp(view->Entry(static_cast<int32_t>(b), e), h.entries[l][e].data(), kStride),
            0)
            << "layer " << l << " request " << batch[b] << " entry " << e;
      }
    }
  }

  void CheckWindow(int32_t l, const std::vector<RequestId>& batch) {
    const StatusOr<RawWindowView> view = m_->RawWindow(l);
    ASSERT_TRUE(view.ok()) << view.status().ToString();
    for (size_t b = 0; b < batch.size(); ++b) {
      const History& h = model_.at(batch[b]);
      const int32_t valid = std::min(h.tokens, kRawWindow);
      ASSERT_EQ(view->Valid(static_cast<int32_t>(b)), valid);
      for (int32_t i = 0; i < valid; ++i) {
        ASSERT_EQ(std::memcmp(view->Row(static_cast<int32_t>(b), i),
                              h.raw[l].at(h.tokens - valid + i).data(), kStride),
                  0)
            << "layer " << l << " request " << batch[b] << " window row " << i;
      }
    }
  }

  std::mt19937_64 rng_;
  CacheOptions o_;
  std::shared_ptr<Backend> backend_;
  std::unique_ptr<SparseKVCacheManager> m_;
  std::map<RequestId, History> model_;
  RequestId next_id_ = 1;
  int32_t steps_ = 0;
};

TEST(ManagerLayerKindsTest, RandomLifecyclesMatchTheDenseModel) {
  for (uint64_t seed = 1; seed <= 12; ++seed) {
    SCOPED_TRACE(seed);
    LayerKindsModel model(seed, /*hybrid=*/seed % 3 == 0);
    model.Run(600);
    if (::testing::Test::HasFailure()) return;
    EXPECT_GT(model.steps(), 100);
  }
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

TEST_F(ManagerLayerKindsRefusalTest, WhatAddressesThePoolByTokenIsRefused) {
  const std::vector<int32_t> ids(16, 7);
  EXPECT_EQ(m_->AdmitWithPrefix(2, ids, 4, nullptr).status().code(), StatusCode::kUnimplemented);
  EXPECT_EQ(m_->Retain(1).status().code(), StatusCode::kUnimplemented);
  EXPECT_EQ(m_->AdmitSealedPrompt(3, 0, 0, 4, nullptr).code(), StatusCode::kUnimplemented);
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

  const CacheOptions v4 = V4Shaped(false);
  std::shared_ptr<Backend> backend = CreateCpuBackend();
  auto pool = HostKVPool::CreateShared(v4, 2 * v4.effective_max_host_requests(), backend);
  ASSERT_TRUE(pool.ok()) << pool.status().ToString();
  const auto shared = SparseKVCacheManager::Create(v4, backend, *pool);
  EXPECT_EQ(shared.status().code(), StatusCode::kUnimplemented);
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
