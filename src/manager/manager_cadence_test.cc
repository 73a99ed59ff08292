// Layers that gain an entry every r tokens (LayerShape::entry_tokens, DeepSeek-V4's CSA layers'
// cadence): only the steps that complete an entry append, the top-k names entries, the host
// pool holds entries, and what is served only at one entry per token is refused. The random
// lifecycles at r = 4 are in manager_model_test.cc.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <vector>

#include "sparsekv/host_kv_pool.h"
#include "sparsekv/manager.h"
#include "testing/harness.h"
#include "testing/workload.h"

namespace sparsekv {
namespace {

using testing::Bytes;

// Entry e's row: eight bytes equal to e + 1.
Bytes Entries(int32_t first, int32_t n) {
  Bytes b(static_cast<size_t>(n) * 8);
  for (int32_t i = 0; i < n; ++i) std::memset(b.data() + i * 8, first + i + 1, 8);
  return b;
}

// One layer of 8-byte rows, an entry per 4 tokens; K = 2, C = 3, W = 1; 8-entry pages; 128 tokens
// (32 entries, 4 pages) in the pool; requests of up to 32 tokens (8 entries).
CacheOptions CadenceFour() {
  CacheOptions o = testing::SmallOptions();
  o.geometry.layers[0].entry_tokens = 4;
  o.host_capacity_tokens = 128;
  return o;
}

class ManagerCadenceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto m = SparseKVCacheManager::Create(CadenceFour(), CreateCpuBackend());
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    m_ = std::move(*m);
    driver_ = std::make_unique<testing::StepDriver>(*m_);
  }
  // A step of request 1 selecting `topk`; the step's new row is entry `entry`'s, appended only
  // if this step's token completes it. Returns the slots.
  std::vector<int32_t> Step(int32_t entry, std::vector<int32_t> topk) {
    const testing::LayerResult r = driver_->Step({1}, {Entries(entry, 1)}, {topk})[0];
    return std::vector<int32_t>(r.slots.begin(), r.slots.begin() + topk.size());
  }
  std::unique_ptr<SparseKVCacheManager> m_;
  std::unique_ptr<testing::StepDriver> driver_;
};

TEST_F(ManagerCadenceTest, OnlyTheStepThatCompletesAnEntryAppendsIt) {
  // A 6-token prompt holds one entry (tokens 0-3); the engine ingests that one.
  ASSERT_TRUE(m_->Admit(1, 6, 10, nullptr).ok());
  const Bytes prompt = Entries(0, 1);
  ASSERT_TRUE(m_->IngestPrompt(1, 0, prompt.data(), nullptr).ok());
  EXPECT_EQ(*m_->SequenceLength(1), 6);     // tokens
  EXPECT_EQ(m_->HostPages(1)->size(), 1u);  // 16 tokens: 4 entries, one page of 8
  // Token 7 completes nothing: entry 1 is out of range, entry 0 is read.
  std::vector<int32_t> slots = Step(1, {0, 1});
  EXPECT_GE(slots[0], 0);
  EXPECT_EQ(slots[1], -1);
  // Token 8 completes entry 1, which is in the window at once.
  slots = Step(1, {1, 0});
  EXPECT_GE(slots[0], 0);
  EXPECT_GE(slots[1], 0);
  CacheStats s = *m_->ReadStats(nullptr);
  EXPECT_EQ(s.total.window_hits, 2u);  // entry 0, then entry 1: the newest entry
  EXPECT_EQ(s.total.misses, 1u);       // entry 0, out of the window once entry 1 came
  EXPECT_EQ(s.total.out_of_range, 1u);
  EXPECT_EQ(s.bytes_device_to_host, 8u);  // one entry written back, not two
  // Tokens 9-12 complete entry 2 at the fourth; 16 tokens is the reservation.
  for (int32_t t = 9; t <= 12; ++t) slots = Step(2, {2, 1});
  EXPECT_GE(slots[0], 0);
  for (int32_t t = 13; t <= 16; ++t) Step(3, {3, 0});
  EXPECT_EQ(*m_->SequenceLength(1), 16);
  EXPECT_EQ(m_->PlanStep({1}, nullptr).code(), StatusCode::kOutOfRange);
  s = *m_->ReadStats(nullptr);
  EXPECT_EQ(s.bytes_device_to_host, 3u * 8);  // entries 1, 2 and 3
}

// The rows each step reads are the entries the model holds, with the top-k in entry units.
TEST_F(ManagerCadenceTest, ResolvedRowsAreTheEntriesTheyName) {
  ASSERT_TRUE(m_->Admit(1, 13, 10, nullptr).ok());  // entries 0-2
  const Bytes prompt = Entries(0, 3);
  ASSERT_TRUE(m_->IngestPrompt(1, 0, prompt.data(), nullptr).ok());
  testing::DenseModel model(m_->options().geometry);
  model.Add(1, {prompt}, 3);
  for (int32_t token = 14; token <= 23; ++token) {
    const int32_t entry = token / 4 - 1;  // the entry this token completes, if any
    const Bytes row = Entries(token % 4 == 0 ? entry : 99, 1);
    if (token % 4 == 0) model.Append(1, 0, row.data());
    const std::vector<int32_t> topk = {token % 3, model.Length(1, 0) - 1};
    const testing::LayerResult r = driver_->Step({1}, {row}, {topk})[0];
    EXPECT_EQ(testing::CheckLayer(model, m_->options().geometry, 0, {1}, topk, r, 2), 0)
        << "token " << token;
  }
}

// A fork shares the parent's entry pages (the partial one copied on the first write) and counts
// tokens from the parent's: the child completes its next entry where the parent would, and
// neither sees the other's.
TEST_F(ManagerCadenceTest, AForkContinuesTheParentsEntries) {
  ASSERT_TRUE(m_->Admit(1, 9, 12, nullptr).ok());  // entries 0-1, token 9 pending
  const Bytes prompt = Entries(0, 2);
  ASSERT_TRUE(m_->IngestPrompt(1, 0, prompt.data(), nullptr).ok());
  const Status forked = m_->Fork(1, 2, 7, nullptr);  // the child may reach 16 tokens: 4 entries
  ASSERT_TRUE(forked.ok()) << forked.ToString();
  EXPECT_EQ(*m_->SequenceLength(2), 9);
  testing::DenseModel model(m_->options().geometry);
  model.Add(1, {prompt}, 2);
  model.Copy(1, 2);
  for (int32_t token = 10; token <= 16; ++token) {
    for (RequestId id : {RequestId{1}, RequestId{2}}) {
      // Distinct rows per request: 40 + entry for the parent, 80 + entry for the child.
      const int32_t entry = token / 4 - 1;
      const Bytes row = Entries((id == 1 ? 40 : 80) + entry, 1);
      if (token % 4 == 0) model.Append(id, 0, row.data());
      const std::vector<int32_t> topk = {0, model.Length(id, 0) - 1};
      const testing::LayerResult r = driver_->Step({id}, {row}, {topk})[0];
      EXPECT_EQ(testing::CheckLayer(model, m_->options().geometry, 0, {id}, topk, r, 2), 0)
          << "request " << id << " token " << token;
    }
  }
  EXPECT_EQ(m_->PlanStep({2}, nullptr).code(), StatusCode::kOutOfRange);  // 16 tokens reached
  EXPECT_EQ(model.Length(2, 0), 4);
}

TEST_F(ManagerCadenceTest, WhatAddressesPagesByTokenIsRefused) {
  ASSERT_TRUE(m_->Admit(1, 8, 4, nullptr).ok());
  const Status sealed = m_->AdmitSealedPrompt(3, 0, 1, 4, nullptr);
  EXPECT_EQ(sealed.code(), StatusCode::kUnimplemented);
  EXPECT_NE(sealed.message().find("every 4 tokens (entry_tokens)"), std::string::npos)
      << sealed.message();
  auto pool = HostKVPool::CreateShared(CadenceFour(), 2, CreateCpuBackend());
  ASSERT_TRUE(pool.ok()) << pool.status().ToString();
  EXPECT_EQ(SparseKVCacheManager::Create(CadenceFour(), CreateCpuBackend(), *pool).status().code(),
            StatusCode::kUnimplemented);
}

// Ids 0, 1, ... n - 1 from `first` on.
std::vector<int32_t> Ids(int32_t n, int32_t first = 0) {
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) ids[i] = first + i;
  return ids;
}

// CadenceFour with requests of up to 64 tokens: two pages of 8 entries, 32 tokens each.
class ManagerCadencePrefixTest : public ManagerCadenceTest {
 protected:
  void SetUp() override {
    CacheOptions o = CadenceFour();
    o.max_context = 64;
    auto m = SparseKVCacheManager::Create(o, CreateCpuBackend());
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    m_ = std::move(*m);
    driver_ = std::make_unique<testing::StepDriver>(*m_);
  }
  // AdmitWithPrefix of `ids` and the ingestion of its uncached entries (rows Entries(e, 1) for
  // entry e); returns cached, or -1 on error.
  int32_t AdmitAndIngest(RequestId id, const std::vector<int32_t>& ids, int32_t max_new) {
    const StatusOr<int32_t> cached = m_->AdmitWithPrefix(id, ids, max_new, nullptr);
    EXPECT_TRUE(cached.ok()) << cached.status().ToString();
    if (!cached.ok()) return -1;
    const int32_t first = *cached / 4, entries = static_cast<int32_t>(ids.size()) / 4;
    const Bytes rows = Entries(first, entries - first);
    const Status ingested =
        m_->IngestPromptSuffix(id, 0, entries > first ? rows.data() : nullptr, nullptr);
    EXPECT_TRUE(ingested.ok()) << ingested.ToString();
    return *cached;
  }
};

// A host page of 8 entries covers 32 tokens, and the prefix index keys it by all 32 ids: a
// retained conversation's first page is shared by the next prompt that starts with those 32
// tokens, and only the entries past it are ingested.
TEST_F(ManagerCadencePrefixTest, APageIsSharedByPromptsThatStartWithAllTheTokensItCovers) {
  EXPECT_EQ(AdmitAndIngest(1, Ids(40), 8), 0);  // entries 0-9
  EXPECT_EQ(*m_->Retain(1), 32);                // page 0 only: page 1 is partial
  const std::vector<int32_t> retained = *m_->HostPages(1);
  ASSERT_EQ(retained.size(), 1u);

  std::vector<int32_t> next = Ids(40);
  next.push_back(99);
  EXPECT_EQ(AdmitAndIngest(2, next, 8), 32);
  EXPECT_EQ(m_->HostPages(2)->front(), retained[0]);
  testing::DenseModel model(m_->options().geometry);
  model.Add(2, {Entries(0, 10)}, 10);
  const std::vector<int32_t> topk = {0, 9};
  const testing::LayerResult r = driver_->Step({2}, {Entries(50, 1)}, {topk}, {7})[0];
  EXPECT_EQ(testing::CheckLayer(model, m_->options().geometry, 0, {2}, topk, r, 2), 0);
  ASSERT_TRUE(m_->Release(2).ok());

  // The last token the page covers differs: a miss.
  std::vector<int32_t> changed = Ids(40);
  changed[31] = 77;
  EXPECT_EQ(AdmitAndIngest(3, changed, 0), 0);
  ASSERT_TRUE(m_->Release(3).ok());
  // 33 tokens: the page is shared and the prompt's 8 entries are all in it, so nothing is
  // ingested; 32 tokens: the last token is never cached, so no whole page is.
  EXPECT_EQ(AdmitAndIngest(4, Ids(33), 4), 32);
  EXPECT_EQ(AdmitAndIngest(5, Ids(32), 4), 0);
  const CacheStats s = *m_->ReadStats(nullptr);
  EXPECT_EQ(s.prefix_lookup_tokens, 40u + 41 + 40 + 33 + 32);
  EXPECT_EQ(s.prefix_hit_tokens, 64u);
}

// Decode fills a page once its last entry is appended, and indexes it once the ids of every
// token its entries cover are known (PlanStep with token ids); a step without ids ends that.
TEST_F(ManagerCadencePrefixTest, DecodedPagesAreIndexedByTheirTokensIds) {
  EXPECT_EQ(AdmitAndIngest(1, Ids(20), 20), 0);  // entries 0-4
  EXPECT_EQ(AdmitAndIngest(2, Ids(20, 100), 20), 0);
  for (int32_t token = 20; token < 32; ++token) {
    const Bytes row = Entries(token / 4 - 1, 1);
    if (token == 24) {
      driver_->Step({1}, {row}, {{0, 0}}, {token});
      driver_->Step({2}, {row}, {{0, 0}});  // without ids: request 2's end here
      continue;
    }
    Bytes rows = row;
    rows.insert(rows.end(), row.begin(), row.end());
    driver_->Step({1, 2}, {rows}, {{0, 0, 0, 0}}, {token, 100 + token});
  }
  EXPECT_EQ(*m_->SequenceLength(1), 32);
  EXPECT_EQ(*m_->Retain(1), 32);
  EXPECT_EQ(*m_->Retain(2), 0);
  EXPECT_TRUE(m_->IsRetained(1));
  EXPECT_FALSE(m_->IsRetained(2));
  EXPECT_EQ(AdmitAndIngest(3, Ids(36), 0), 32);
  EXPECT_EQ(AdmitAndIngest(4, Ids(36, 100), 0), 0);
}

}  // namespace
}  // namespace sparsekv
