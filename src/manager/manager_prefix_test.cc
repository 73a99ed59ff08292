// Shared prefixes, forks and retained conversations through the manager's public API, on the CPU
// backend: what is shared, what is copied on write, what is evicted and when admission fails.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <numeric>

#include "sparsekv/manager.h"
#include "testing/harness.h"

namespace sparsekv {
namespace {

using testing::Bytes;
using Ids = std::vector<int32_t>;

constexpr int32_t kPage = 4;

// One layer of 8-byte rows; K = 4, C = 4, W = 1; 4-token pages; 16 pages in the pool.
CacheOptions Options() {
  CacheOptions o;
  o.geometry = KVGeometry::Uniform(1, 8);
  o.top_k = 4;
  o.hot_slots = 4;
  o.window = 1;
  o.host_capacity_tokens = 64;
  o.max_requests = 4;
  o.max_host_requests = 6;
  o.max_context = 32;
  o.host_page_tokens = kPage;
  return o;
}

// The KV row of a token: a function of the token ids up to and including it, as in a real model
// (equal prefixes give equal rows, and a row tells which prefix it was computed from).
Bytes RowOf(std::span<const int32_t> prefix) {
  uint64_t h = 1469598103934665603ull;
  for (int32_t id : prefix) h = (h ^ static_cast<uint32_t>(id)) * 1099511628211ull;
  Bytes row(8);
  std::memcpy(row.data(), &h, 8);
  return row;
}

Bytes RowsOf(const Ids& ids, int32_t first) {
  Bytes out;
  for (size_t p = first; p < ids.size(); ++p) {
    const Bytes row = RowOf(std::span(ids).first(p + 1));
    out.insert(out.end(), row.begin(), row.end());
  }
  return out;
}

Ids Iota(int32_t n, int32_t first) {
  Ids ids(n);
  std::iota(ids.begin(), ids.end(), first);
  return ids;
}

Ids Concat(Ids a, const Ids& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

class ManagerPrefixTest : public ::testing::Test {
 protected:
  void SetUp() override { Create(Options()); }
  void Create(const CacheOptions& o) {
    driver_.reset();
    auto m = SparseKVCacheManager::Create(o, CreateCpuBackend());
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    m_ = std::move(*m);
    driver_ = std::make_unique<testing::StepDriver>(*m_);
  }
  // AdmitWithPrefix + ingest of the suffix; returns the cached tokens.
  int32_t Admit(RequestId id, const Ids& prompt, int32_t max_new = 8) {
    StatusOr<int32_t> cached = m_->AdmitWithPrefix(id, prompt, max_new, nullptr);
    EXPECT_TRUE(cached.ok()) << cached.status().ToString();
    if (!cached.ok()) return -1;
    const Bytes rows = RowsOf(prompt, *cached);
    EXPECT_TRUE(m_->IngestPromptSuffix(id, 0, rows.data(), nullptr).ok());
    history_[id] = prompt;
    return *cached;
  }
  // One decode step of `id` appending token `token`, reading the newest positions.
  void Step(RequestId id, int32_t token) {
    Ids& h = history_[id];
    h.push_back(token);
    const int32_t len = static_cast<int32_t>(h.size());
    // The newest, a middle and the first positions (-1 where they coincide).
    Ids topk = {len - 1, len - 2, len / 2, 0};
    for (int32_t k = 1; k < 4; ++k) {
      if (std::find(topk.begin(), topk.begin() + k, topk[k]) != topk.begin() + k) topk[k] = -1;
    }
    auto r = driver_->Step({id}, {RowOf(h)}, {topk}, {token});
    for (int32_t k = 0; k < 4; ++k) {
      if (topk[k] < 0) continue;
      const Bytes want = RowOf(std::span(h).first(topk[k] + 1));
      EXPECT_EQ(std::memcmp(r[0].gathered.data() + k * 8, want.data(), 8), 0)
          << "request " << id << " position " << topk[k];
    }
  }
  // Every row of `id`'s history, read from the host pool through its pages.
  void ExpectHistoryInPool(RequestId id) {
    StatusOr<Ids> pages = m_->HostPages(id);
    ASSERT_TRUE(pages.ok());
    const Ids& h = history_.at(id);
    for (size_t p = 0; p < h.size(); ++p) {
      const std::byte* row = m_->host_pool().row(0, (*pages)[p / kPage] * kPage + p % kPage);
      EXPECT_EQ(std::memcmp(row, RowOf(std::span(h).first(p + 1)).data(), 8), 0)
          << "request " << id << " position " << p;
    }
  }
  CacheStats Stats() { return *m_->ReadStats(nullptr); }

  std::unique_ptr<SparseKVCacheManager> m_;
  std::unique_ptr<testing::StepDriver> driver_;
  std::map<RequestId, Ids> history_;
};

TEST_F(ManagerPrefixTest, PrefixHitSharesFullPagesAndIngestsOnlyTheSuffix) {
  const Ids system = Iota(9, 100);
  EXPECT_EQ(Admit(1, Concat(system, {1, 2})), 0);
  EXPECT_EQ(Admit(2, Concat(system, {3})), 8);  // two full pages; page 2 differs
  const Ids a = *m_->HostPages(1), b = *m_->HostPages(2);
  EXPECT_EQ(a[0], b[0]);
  EXPECT_EQ(a[1], b[1]);
  EXPECT_NE(a[2], b[2]);
  Step(2, 7);
  Step(1, 8);
  ExpectHistoryInPool(1);
  ExpectHistoryInPool(2);
  const CacheStats s = Stats();
  EXPECT_EQ(s.prefix_lookup_tokens, 21u);
  EXPECT_EQ(s.prefix_hit_tokens, 8u);
  EXPECT_EQ(s.pages_shared, 2);
  EXPECT_EQ(s.bytes_saved, 2 * kPage * 8);
  EXPECT_EQ(s.bytes_ingested, (11u + 2u) * 8);
}

TEST_F(ManagerPrefixTest, LastPromptTokenIsAlwaysIngested) {
  const Ids prompt = Iota(8, 0);
  EXPECT_EQ(Admit(1, prompt), 0);
  EXPECT_EQ(Admit(2, prompt), 4);  // not 8: the last page holds the last prompt token
  EXPECT_EQ(Admit(3, Ids{0, 1, 2}), 0);
}

TEST_F(ManagerPrefixTest, WholePromptRowsMayBeGivenToIngestPrompt) {
  const Ids prompt = Iota(10, 0);
  Admit(1, prompt);
  ASSERT_EQ(*m_->AdmitWithPrefix(2, prompt, 4, nullptr), 8);
  const Bytes all = RowsOf(prompt, 0);
  ASSERT_TRUE(m_->IngestPrompt(2, 0, all.data(), nullptr).ok());  // skips the cached rows
  history_[2] = prompt;
  Step(2, 5);
  ExpectHistoryInPool(2);
}

TEST_F(ManagerPrefixTest, ForkSharesThePartialPageUntilEachWritesIt) {
  Admit(1, Iota(6, 0));  // pages: [0..3] full, [4, 5] partial
  Step(1, 6);            // 7 tokens
  const Ids parent_pages = *m_->HostPages(1);
  ASSERT_TRUE(m_->Fork(1, 2, 6, nullptr).ok());
  history_[2] = history_[1];
  const Ids child_pages = *m_->HostPages(2);
  EXPECT_EQ(child_pages[0], parent_pages[0]);
  EXPECT_EQ(child_pages[1], parent_pages[1]);  // the partial page, shared for now
  const Bytes partial(m_->host_pool().row(0, parent_pages[1] * kPage),
                      m_->host_pool().row(0, parent_pages[1] * kPage) + kPage * 8);
  EXPECT_EQ(Stats().pages_shared, 2);

  Step(2, 40);  // the child writes first: it copies the partial page
  EXPECT_NE((*m_->HostPages(2))[1], parent_pages[1]);
  EXPECT_EQ(Stats().copy_on_write_pages, 1u);
  EXPECT_EQ(
      std::memcmp(partial.data(), m_->host_pool().row(0, parent_pages[1] * kPage), partial.size()),
      0)
      << "the page the parent still holds was modified";
  Step(1, 50);  // now the parent is the only holder: it writes in place
  EXPECT_EQ((*m_->HostPages(1))[1], parent_pages[1]);
  EXPECT_EQ(Stats().copy_on_write_pages, 1u);
  EXPECT_EQ(Stats().pages_shared, 1);
  for (int i = 0; i < 5; ++i) Step(1 + i % 2, 60 + i);
  ExpectHistoryInPool(1);
  ExpectHistoryInPool(2);
  ASSERT_TRUE(m_->Release(1).ok());
  ASSERT_TRUE(m_->Release(2).ok());
  EXPECT_EQ(Stats().host_pages_used, 0);
}

TEST_F(ManagerPrefixTest, ForkErrors) {
  EXPECT_EQ(m_->Fork(1, 2, 4, nullptr).code(), StatusCode::kNotFound);
  ASSERT_TRUE(m_->Admit(1, 5, 4, nullptr).ok());
  EXPECT_EQ(m_->Fork(1, 2, 4, nullptr).code(), StatusCode::kFailedPrecondition);  // not ingested
  const Bytes rows = RowsOf(Iota(5, 0), 0);
  ASSERT_TRUE(m_->IngestPrompt(1, 0, rows.data(), nullptr).ok());
  EXPECT_EQ(m_->Fork(1, 1, 4, nullptr).code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(m_->Fork(1, 2, 28, nullptr).code(), StatusCode::kOutOfRange);
  const std::vector<RequestId> batch = {1};
  ASSERT_TRUE(m_->PlanStep(batch, nullptr).ok());
  EXPECT_EQ(m_->Fork(1, 2, 4, nullptr).code(), StatusCode::kFailedPrecondition);  // open step
}

TEST_F(ManagerPrefixTest, RetainedConversationIsContinuedByTheNextTurn) {
  const Ids turn1 = Iota(6, 0);
  Admit(1, turn1);
  for (int32_t t = 0; t < 5; ++t) Step(1, 50 + t);  // 11 tokens: 2 full pages
  const Ids history = history_[1];
  StatusOr<int32_t> kept = m_->Retain(1);
  ASSERT_TRUE(kept.ok());
  EXPECT_EQ(*kept, 8);
  EXPECT_TRUE(m_->IsRetained(1));
  EXPECT_EQ(m_->SequenceLength(1).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(Stats().retained_conversations, 1);
  EXPECT_EQ(Stats().host_pages_used, 2);  // partial page and unused reservation were freed
  EXPECT_EQ(Stats().hot_blocks_used, 0);

  EXPECT_EQ(Admit(2, Concat(history, {7, 7, 7})), 8);
  for (int32_t t = 0; t < 3; ++t) Step(2, 80 + t);
  ExpectHistoryInPool(2);
  EXPECT_EQ(m_->Admit(1, 1, 1, nullptr).code(), StatusCode::kAlreadyExists);
  ASSERT_TRUE(m_->Release(1).ok());  // drops the conversation; request 2 keeps the pages
  EXPECT_FALSE(m_->IsRetained(1));
  ExpectHistoryInPool(2);
  ASSERT_TRUE(m_->Release(2).ok());
  EXPECT_EQ(Stats().host_pages_used, 0);
}

TEST_F(ManagerPrefixTest, StepsWithoutTokenIdsEndSharing) {
  ASSERT_TRUE(m_->Admit(1, 6, 8, nullptr).ok());  // no ids at all
  const Bytes rows = RowsOf(Iota(6, 0), 0);
  ASSERT_TRUE(m_->IngestPrompt(1, 0, rows.data(), nullptr).ok());
  EXPECT_EQ(*m_->Retain(1), 0);
  EXPECT_FALSE(m_->IsRetained(1));
  EXPECT_EQ(Stats().host_pages_used, 0);

  Admit(2, Iota(6, 0));
  const std::vector<RequestId> batch = {2};
  history_[2].push_back(0);  // a step whose token id is not given
  ASSERT_TRUE(m_->PlanStep(batch, nullptr).ok());
  const Bytes row = RowOf(history_[2]);
  ASSERT_TRUE(m_->AppendToken(0, row.data(), nullptr).ok());
  const int32_t topk[4] = {0, 1, 2, 3};
  int32_t slots[4];
  ASSERT_TRUE(m_->RunLayer(0, topk, slots, nullptr, nullptr).ok());
  ASSERT_TRUE(m_->FinishStep(nullptr).ok());
  for (int t = 0; t < 4; ++t) Step(2, t);
  EXPECT_EQ(*m_->Retain(2), 4);  // only the page before the unknown token
  const Ids mismatch = {1, 2};
  EXPECT_EQ(m_->PlanStep(std::vector<RequestId>{}, mismatch, nullptr).code(),
            StatusCode::kInvalidArgument);
}

TEST_F(ManagerPrefixTest, AdmissionEvictsRetainedConversationsLeastRecentlyUsedFirst) {
  // Three retained conversations of 3 pages each (12 tokens + 1 in a partial page, freed).
  for (RequestId id = 1; id <= 3; ++id) {
    Admit(id, Iota(13, 100 * static_cast<int32_t>(id)), 0);
    ASSERT_EQ(*m_->Retain(id), 12);
  }
  EXPECT_EQ(Stats().host_pages_used, 9);
  // Conversation 1 is used again: a lookup shares its pages (then the request goes away).
  EXPECT_EQ(Admit(4, Iota(13, 100), 0), 12);
  ASSERT_TRUE(m_->Release(4).ok());
  // 7 pages free; 8 needed: the least recently used conversation, 2, goes.
  Admit(5, Iota(30, 1000), 2);
  EXPECT_TRUE(m_->IsRetained(1));
  EXPECT_FALSE(m_->IsRetained(2));
  EXPECT_TRUE(m_->IsRetained(3));
  CacheStats s = Stats();
  EXPECT_EQ(s.evictions, 1u);
  EXPECT_EQ(s.evicted_pages, 3u);
  // An evicted prefix is a miss, never stale; a retained one still hits (2 pages are free).
  EXPECT_EQ(*m_->AdmitWithPrefix(6, Iota(5, 200), 0, nullptr), 0);
  ASSERT_TRUE(m_->Release(6).ok());
  EXPECT_EQ(Admit(6, Concat(Iota(4, 300), {1}), 0), 4);
  ASSERT_TRUE(m_->Release(6).ok());
  EXPECT_EQ(Stats().evictions, 1u);
}

TEST_F(ManagerPrefixTest, AdmissionFailsCleanlyOnlyWhenEvictionCannotMakeRoom) {
  Admit(1, Iota(13, 100), 0);
  ASSERT_EQ(*m_->Retain(1), 12);  // 3 pages
  Admit(2, Iota(20, 500), 4);     // 6 pages
  Admit(3, Iota(10, 700), 2);     // 3 pages: 4 of 16 are free
  // 32 tokens sharing conversation 1's 3 pages need 5 fresh ones; evicting conversation 1 would
  // free nothing, since the new request shares its pages: no room, and nothing is evicted.
  const Status s = m_->AdmitWithPrefix(4, Concat(Iota(12, 100), Iota(18, 0)), 2, nullptr).status();
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted) << s.ToString();
  EXPECT_TRUE(m_->IsRetained(1)) << "a failed admission evicted something";
  // 28 private tokens need 7 pages: 4 free plus conversation 1's 3, evicted.
  EXPECT_EQ(Admit(4, Iota(26, 900), 2), 0);
  EXPECT_FALSE(m_->IsRetained(1));
  EXPECT_EQ(Stats().evictions, 1u);
  // Nothing is retained and the pool is full: a clean failure.
  EXPECT_EQ(m_->Admit(5, 4, 0, nullptr).code(), StatusCode::kResourceExhausted);
  for (RequestId id = 2; id <= 4; ++id) ExpectHistoryInPool(id);
}

TEST_F(ManagerPrefixTest, NothingLeaksAfterReleaseAndEviction) {
  Admit(1, Iota(10, 0));
  Step(1, 1);
  ASSERT_TRUE(m_->Fork(1, 2, 5, nullptr).ok());
  history_[2] = history_[1];
  Step(2, 2);
  ASSERT_EQ(*m_->Retain(1), 8);
  Admit(3, Concat(Iota(8, 0), {9}));
  ASSERT_EQ(*m_->Retain(3), 8);
  ASSERT_TRUE(m_->Release(2).ok());
  EXPECT_EQ(Stats().retained_conversations, 2);
  EXPECT_EQ(m_->EvictRetained(), 2);
  const CacheStats s = Stats();
  EXPECT_EQ(s.host_pages_used, 0);
  EXPECT_EQ(s.pages_shared, 0);
  EXPECT_EQ(s.bytes_saved, 0);
  EXPECT_EQ(s.retained_conversations, 0);
}

}  // namespace
}  // namespace sparsekv
