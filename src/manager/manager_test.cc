// Targeted behaviour of the manager on the CPU backend: LRU and segmented-LRU replacement through
// the public API, the window, statistics, capacity errors and lifecycle errors.
#include "sparsekv/manager.h"

#include <gtest/gtest.h>

#include <cstring>

#include "sparsekv/hot_cache.h"
#include "testing/harness.h"
#include "testing/workload.h"

namespace sparsekv {
namespace {

using testing::Bytes;

using testing::SmallOptions;  // one layer of 8-byte rows; K = 2, C = 3, W = 1; 8-token pages

// Row of position p: eight bytes equal to p + 1.
Bytes Rows(int32_t first, int32_t n) {
  Bytes b(static_cast<size_t>(n) * 8);
  for (int32_t i = 0; i < n; ++i) std::memset(b.data() + i * 8, first + i + 1, 8);
  return b;
}

class ManagerTest : public ::testing::Test {
 protected:
  void SetUp() override { Create(SmallOptions()); }
  void Create(const CacheOptions& o) {
    driver_.reset();  // its buffers live on the old manager's backend
    auto m = SparseKVCacheManager::Create(o, CreateCpuBackend());
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    m_ = std::move(*m);
    driver_ = std::make_unique<testing::StepDriver>(*m_);
  }
  void AdmitWithPrompt(RequestId id, int32_t len, int32_t max_new = 8) {
    ASSERT_TRUE(m_->Admit(id, len, max_new, nullptr).ok());
    const Bytes rows = Rows(0, len);
    ASSERT_TRUE(m_->IngestPrompt(id, 0, rows.data(), nullptr).ok());
  }
  // One step of request `id` selecting `topk`; returns the slots.
  std::vector<int32_t> Step(RequestId id, std::vector<int32_t> topk) {
    const int32_t len = *m_->SequenceLength(id);
    auto r = driver_->Step({id}, {Rows(len, 1)}, {topk});
    std::vector<int32_t> slots(r[0].slots.begin(), r[0].slots.begin() + topk.size());
    for (size_t k = 0; k < topk.size(); ++k) {
      if (slots[k] < 0) continue;
      EXPECT_EQ(static_cast<int>(r[0].gathered[k * 8]), topk[k] + 1) << "position " << topk[k];
    }
    return slots;
  }
  std::unique_ptr<SparseKVCacheManager> m_;
  std::unique_ptr<testing::StepDriver> driver_;
};

TEST_F(ManagerTest, LeastRecentlyUsedSlotIsEvictedAndHitsAreKept) {
  CacheOptions o = SmallOptions();
  o.eviction = EvictionPolicy::kLru;
  Create(o);
  AdmitWithPrompt(1, 10);                                    // block 0: slots 0..2 LRU, 3 window
  EXPECT_EQ(Step(1, {0, 1}), (std::vector<int32_t>{0, 1}));  // misses fill slots 0, 1
  EXPECT_EQ(Step(1, {2, 0}), (std::vector<int32_t>{2, 0}));  // 0 hits; 2 -> empty slot 2
  // LRU order now: 1 (pos 1, untouched last step), 2, 0. A miss evicts slot 1.
  EXPECT_EQ(Step(1, {5, 0}), (std::vector<int32_t>{1, 0}));
  // LRU order now: 2, 1, 0. Position 2 hits slot 2; position 1 was evicted, so it misses and
  // takes the least recently used slot not hit in this step: slot 1.
  EXPECT_EQ(Step(1, {1, 2}), (std::vector<int32_t>{1, 2}));
}

TEST_F(ManagerTest, ClockPassesASlotHitSinceTheHandLastCame) {
  ASSERT_EQ(SmallOptions().eviction, EvictionPolicy::kClock);  // the default
  AdmitWithPrompt(1, 10);                                      // C = 3, the hand at slot 0
  EXPECT_EQ(Step(1, {0, 1}), (std::vector<int32_t>{0, 1}));    // fills slots 0, 1
  EXPECT_EQ(Step(1, {2, 0}), (std::vector<int32_t>{2, 0}));    // 0 hits (count 1); 2 -> slot 2
  // From slot 0: position 0's count falls to 0 and it is passed; slot 1 (position 1) is taken.
  EXPECT_EQ(Step(1, {5, -1}), (std::vector<int32_t>{1, -1}));
  // Position 0 hits again; position 1 misses and takes slot 2 (position 2, count 0).
  EXPECT_EQ(Step(1, {0, 1}), (std::vector<int32_t>{0, 2}));
}

TEST_F(ManagerTest, SegmentedLruEvictsANewFillBeforeASlotHitAgain) {
  CacheOptions o = SmallOptions();
  o.eviction = EvictionPolicy::kSegmentedLru;
  Create(o);
  AdmitWithPrompt(1, 10);  // C = 3, protected capacity 3 * 80 / 100 = 2
  EXPECT_EQ(Step(1, {0, 1}), (std::vector<int32_t>{0, 1}));  // fills: probationary
  EXPECT_EQ(Step(1, {0, 1}), (std::vector<int32_t>{0, 1}));  // hit again: protected
  EXPECT_EQ(Step(1, {2, 0}), (std::vector<int32_t>{2, 0}));  // 2 -> empty slot 2
  // LRU would now evict position 1 (slot 1, untouched for two steps); segmented LRU evicts the
  // probationary position 2 and keeps 1.
  EXPECT_EQ(Step(1, {3, -1}), (std::vector<int32_t>{2, -1}));
  EXPECT_EQ(Step(1, {1, 0}), (std::vector<int32_t>{1, 0}));
  auto s = m_->ReadStats(nullptr);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->layers[0].hits, 5u);
  EXPECT_EQ(s->layers[0].misses, 4u);
}

TEST_F(ManagerTest, WindowSlotHoldsTheNewestTokenAndIsNeverEvicted) {
  AdmitWithPrompt(1, 10);
  // Step 1 appends position 10: it is in the window slot (block 0 slot 3).
  EXPECT_EQ(Step(1, {10, 9}), (std::vector<int32_t>{3, 0}));
  // Misses never take the window slot, however many there are.
  EXPECT_EQ(Step(1, {1, 2}), (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(Step(1, {3, 4}), (std::vector<int32_t>{0, 1}));
  // Position 11 left the window at this step (now 12 is newest): it is read from the host pool.
  EXPECT_EQ(Step(1, {11, 13}), (std::vector<int32_t>{2, 3}));
}

TEST_F(ManagerTest, StatisticsCountEveryEntryAndTheBytesMoved) {
  AdmitWithPrompt(1, 10);
  Step(1, {0, 1});   // 2 misses
  Step(1, {0, -1});  // 1 hit, 1 padding
  Step(1, {12, 0});  // newest = 12: window hit; 0 hit
  Step(1, {99, 2});  // out of range, miss
  Step(1, {3, 3});   // miss, duplicate
  auto s = m_->ReadStats(nullptr);
  ASSERT_TRUE(s.ok());
  const LayerStats& l = s->layers[0];
  EXPECT_EQ(l.misses, 4u);
  EXPECT_EQ(l.hits, 2u);
  EXPECT_EQ(l.window_hits, 1u);
  EXPECT_EQ(l.padding, 1u);
  EXPECT_EQ(l.out_of_range, 1u);
  EXPECT_EQ(l.duplicates, 1u);
  EXPECT_DOUBLE_EQ(l.hit_rate(), 3.0 / 7.0);
  // 4 misses + 1 window row at ingest, 8 bytes each; 5 appended tokens written back.
  EXPECT_EQ(s->bytes_host_to_device, 5u * 8);
  EXPECT_EQ(s->bytes_device_to_host, 5u * 8);
  EXPECT_EQ(s->bytes_ingested, 10u * 8);
  EXPECT_EQ(s->bytes_assembled, 5u * 2 * 8);
  EXPECT_EQ(s->host_pages_used, 3);  // 18 tokens reserved in 8-token pages
  ASSERT_TRUE(m_->ResetStats(nullptr).ok());
  EXPECT_EQ(m_->ReadStats(nullptr)->total.misses, 0u);
}

TEST_F(ManagerTest, CapacityErrorsLeaveStoredDataIntact) {
  AdmitWithPrompt(1, 10, 22);  // 32 tokens: 4 of 8 pages
  AdmitWithPrompt(2, 20, 12);  // 4 more pages: the pool is full
  EXPECT_EQ(m_->Admit(3, 1, 0, nullptr).code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(m_->Admit(3, 40, 0, nullptr).code(), StatusCode::kOutOfRange);  // > max_context
  EXPECT_EQ(Step(1, {3, 9}), (std::vector<int32_t>{0, 1}));                 // rows still exact
  ASSERT_TRUE(m_->Release(2).ok());
  AdmitWithPrompt(3, 5);
  // Request 3 reuses block 1 (slots 4..7), fresh: both positions miss into its slots 0 and 1.
  EXPECT_EQ(Step(3, {4, 2}), (std::vector<int32_t>{4, 5}));
}

TEST_F(ManagerTest, ReservedLengthIsEnforced) {
  AdmitWithPrompt(1, 10, 1);
  Step(1, {0, 1});
  const std::vector<RequestId> batch = {1};
  EXPECT_EQ(m_->PlanStep(batch, nullptr).code(), StatusCode::kOutOfRange);
}

TEST_F(ManagerTest, UseAfterReleaseAndDoubleReleaseAreErrors) {
  AdmitWithPrompt(1, 10);
  ASSERT_TRUE(m_->Release(1).ok());
  EXPECT_EQ(m_->Release(1).code(), StatusCode::kNotFound);
  const Bytes rows = Rows(0, 10);
  EXPECT_EQ(m_->IngestPrompt(1, 0, rows.data(), nullptr).code(), StatusCode::kNotFound);
  const std::vector<RequestId> batch = {1};
  EXPECT_EQ(m_->PlanStep(batch, nullptr).code(), StatusCode::kNotFound);
  EXPECT_EQ(m_->SequenceLength(1).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(m_->Retract(1).code(), StatusCode::kNotFound);
}

TEST_F(ManagerTest, StepOrderIsEnforced) {
  AdmitWithPrompt(1, 10);
  const std::vector<RequestId> batch = {1};
  const int32_t topk[2] = {0, 1};
  int32_t slots[4];
  const Bytes row = Rows(10, 2);
  EXPECT_EQ(m_->RunLayer(0, topk, slots, nullptr, nullptr).code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(m_->PlanStep(batch, nullptr).ok());
  EXPECT_EQ(m_->PlanStep(batch, nullptr).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(m_->RunLayer(0, topk, slots, nullptr, nullptr).code(),
            StatusCode::kFailedPrecondition);  // before AppendToken
  EXPECT_EQ(m_->FinishStep(nullptr).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(m_->Release(1).code(), StatusCode::kFailedPrecondition);  // in the open step
  ASSERT_TRUE(m_->AppendToken(0, row.data(), nullptr).ok());
  EXPECT_EQ(m_->AppendToken(0, row.data(), nullptr).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(m_->RunLayer(1, topk, slots, nullptr, nullptr).code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(m_->RunLayer(0, topk, slots, nullptr, nullptr).ok());
  ASSERT_TRUE(m_->FinishStep(nullptr).ok());
}

TEST_F(ManagerTest, RetractedRequestKeepsItsHistoryAndResumes) {
  CacheOptions o = SmallOptions();
  o.max_requests = 1;
  o.max_host_requests = 2;
  o.window = 2;  // slots 0..2 LRU, 3..4 window
  Create(o);
  AdmitWithPrompt(1, 10);
  Step(1, {0, 1});
  EXPECT_EQ(m_->Admit(2, 4, 4, nullptr).code(), StatusCode::kResourceExhausted);  // no block
  ASSERT_TRUE(m_->Retract(1).ok());
  AdmitWithPrompt(2, 4);  // takes the block
  Step(2, {0, 4});
  EXPECT_EQ(m_->Resume(1, nullptr).code(), StatusCode::kResourceExhausted);
  ASSERT_TRUE(m_->Release(2).ok());
  ASSERT_TRUE(m_->Resume(1, nullptr).ok());
  // Fresh hot cache: position 1 misses again; position 10, still in the window after this
  // step's append of 11, was reloaded from the host pool into window slot 3 + 10 % 2.
  EXPECT_EQ(Step(1, {10, 1}), (std::vector<int32_t>{3, 0}));
}

// An engine may admit a whole batch first and ingest the prompts afterwards, layer by layer. With
// hybrid residency the first admission is resident and takes every block's pages; the later ones
// demote it while its prompt is still being ingested (it takes an empty block), and every row is
// still read back exactly.
TEST_F(ManagerTest, AdmissionsDemoteARequestWhosePromptIsBeingIngested) {
  CacheOptions o = SmallOptions();
  o.geometry = KVGeometry::Uniform(2, 8);
  o.max_requests = 3;
  o.host_capacity_tokens = 96;
  o.hybrid_residency = true;
  o.window = 2;
  o.resident_page_rows = 5;  // one page per block (C + W = 5 slots)
  // Three blocks and their page lists.
  o.device_budget_bytes =
      3 * (HotCache::BlockBytes(o.geometry, o.hot_slots, o.window, 1, ReplacementOf(o)) + 4);
  Create(o);
  // Row of position p in layer l of request id: eight bytes equal to p + 1 + 20 l + 40 (id - 1).
  auto rows = [](RequestId id, int32_t layer, int32_t first, int32_t n) {
    Bytes b = Rows(first, n);
    for (std::byte& x : b) x = std::byte(int(x) + 20 * layer + 40 * int(id - 1));
    return b;
  };
  constexpr int32_t kPrompt = 10;  // reserved 12 tokens: 3 resident pages, the whole budget
  ASSERT_TRUE(m_->Admit(1, kPrompt, 2, nullptr).ok());
  EXPECT_TRUE(m_->IsResident(1));
  ASSERT_TRUE(m_->IngestPrompt(1, 1, rows(1, 1, 0, kPrompt).data(), nullptr).ok());
  ASSERT_TRUE(m_->Admit(2, kPrompt, 2, nullptr).ok());  // demotes request 1, one layer in
  EXPECT_FALSE(m_->IsResident(1));
  ASSERT_TRUE(m_->Admit(3, kPrompt, 2, nullptr).ok());  // the last free block
  for (RequestId id : {1, 2, 3}) {
    for (int32_t l = 0; l < 2; ++l) {
      if (id == 1 && l == 1) continue;
      ASSERT_TRUE(m_->IngestPrompt(id, l, rows(id, l, 0, kPrompt).data(), nullptr).ok());
    }
  }
  const CacheStats before = *m_->ReadStats(nullptr);
  EXPECT_EQ(before.demotions, 1u);
  EXPECT_EQ(before.resident_requests, 0);
  // One step of all three, each selecting an old position and the last prompt position: the old
  // one misses (read from the pool); the last is still in the window after the step's append
  // (loaded from the pool at the demotion for request 1's layer 1, at ingestion for the rest).
  const std::vector<RequestId> batch = {1, 2, 3};
  std::vector<Bytes> appended;
  std::vector<std::vector<int32_t>> topk;
  for (int32_t l = 0; l < 2; ++l) {
    Bytes a;
    for (RequestId id : batch) {
      const Bytes r = rows(id, l, kPrompt, 1);
      a.insert(a.end(), r.begin(), r.end());
    }
    appended.push_back(a);
    topk.push_back({3, kPrompt - 1, 0, kPrompt - 1, 5, kPrompt - 1});
  }
  const std::vector<testing::LayerResult> result = driver_->Step(batch, appended, topk);
  for (int32_t l = 0; l < 2; ++l) {
    for (size_t b = 0; b < batch.size(); ++b) {
      for (int32_t k = 0; k < o.top_k; ++k) {
        const int32_t p = topk[l][b * o.top_k + k];
        ASSERT_GE(result[l].slots[b * o.top_k + k], 0);
        EXPECT_EQ(result[l].gathered[(b * o.top_k + k) * 8], rows(batch[b], l, p, 1)[0])
            << "request " << batch[b] << " layer " << l << " position " << p;
      }
    }
  }
}

// One step with a prefetch of {5, 6} before the resolve of {5, 9}, then one of {10, 11}: 5 is a
// prefetched row hit, 6 one evicted unused, 9 a miss the prefetch did not bring. C = 3: the two
// misses of the second step take slot 1 (6) and slot 2 (9) under each policy.
void ExpectPrefetchOutcome(EvictionPolicy policy) {
  SCOPED_TRACE(static_cast<int>(policy));
  CacheOptions o = SmallOptions();
  o.eviction = policy;
  o.max_prefetch = 2;
  auto created = SparseKVCacheManager::Create(o, CreateCpuBackend());
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  SparseKVCacheManager& m = **created;
  ASSERT_TRUE(m.Admit(1, 20, 8, nullptr).ok());
  const Bytes prompt = Rows(0, 20);
  ASSERT_TRUE(m.IngestPrompt(1, 0, prompt.data(), nullptr).ok());
  const auto step = [&](std::vector<int32_t> topk, const std::vector<int32_t>* prefetch) {
    const int32_t len = *m.SequenceLength(1);
    const Bytes row = Rows(len, 1);
    std::vector<int32_t> slots(2);
    ASSERT_TRUE(m.PlanStep(std::vector<RequestId>{1}, nullptr).ok());
    ASSERT_TRUE(m.AppendToken(0, row.data(), nullptr).ok());
    if (prefetch != nullptr) {
      const Status s = m.PrefetchLayer(0, prefetch->data(), 2, nullptr);
      ASSERT_TRUE(s.ok()) << s.ToString();
    }
    ASSERT_TRUE(m.ResolveLayer(0, topk.data(), slots.data(), nullptr, nullptr).ok());
    ASSERT_TRUE(m.CopyMisses(0, nullptr).ok());
    ASSERT_TRUE(m.FinishStep(nullptr).ok());
    for (int32_t k = 0; k < 2; ++k) {
      EXPECT_EQ(static_cast<int>(m.HotLayer(0)[int64_t{slots[k]} * 8]), topk[k] + 1);
    }
  };
  const std::vector<int32_t> prefetch = {5, 6};
  step({5, 9}, &prefetch);
  StatusOr<CacheStats> s = m.ReadStats(nullptr);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->prefetch_rows, 2u);
  EXPECT_EQ(s->prefetch_useful_rows, 1u);
  EXPECT_EQ(s->prefetch_wasted_rows, 0u);
  EXPECT_EQ(s->prefetch_missed_rows, 1u);
  step({10, 11}, nullptr);  // follows no prefetch: its misses are not the prefetch's
  s = m.ReadStats(nullptr);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->total.misses, 3u);
  EXPECT_EQ(s->prefetch_useful_rows, 1u);
  EXPECT_EQ(s->prefetch_wasted_rows, 1u);
  EXPECT_EQ(s->prefetch_missed_rows, 1u);
  EXPECT_DOUBLE_EQ(s->prefetch_precision(), 0.5);
  EXPECT_DOUBLE_EQ(s->prefetch_recall(), 0.5);
  // The marks are device memory of the statistics, and the uses still add up.
  EXPECT_EQ(s->device_memory.sum(), s->device_bytes);

  ASSERT_TRUE(m.ResetStats(nullptr).ok());
  step({6, 12}, nullptr);  // 6 was evicted; nothing is counted for a prefetch before the reset
  s = m.ReadStats(nullptr);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->prefetch_useful_rows + s->prefetch_wasted_rows + s->prefetch_missed_rows, 0u);
}

TEST_F(ManagerTest, PrefetchedRowsCountAsUsefulWastedOrMissedUnderEveryPolicy) {
  ExpectPrefetchOutcome(EvictionPolicy::kLru);
  ExpectPrefetchOutcome(EvictionPolicy::kSegmentedLru);
  ExpectPrefetchOutcome(EvictionPolicy::kClock);
}

// A request that leaves with a prefetched row unused takes its marks with it: the next request in
// its block counts its own fills of those slots as nothing of the prefetch's.
TEST_F(ManagerTest, ABlockHandedOutAgainStartsWithoutPrefetchMarks) {
  CacheOptions o = SmallOptions();
  o.max_prefetch = 2;
  Create(o);
  AdmitWithPrompt(1, 20);
  const std::vector<int32_t> prefetch = {5, 6};
  ASSERT_TRUE(m_->PlanStep(std::vector<RequestId>{1}, nullptr).ok());
  const Bytes row = Rows(20, 1);
  ASSERT_TRUE(m_->AppendToken(0, row.data(), nullptr).ok());
  ASSERT_TRUE(m_->PrefetchLayer(0, prefetch.data(), 2, nullptr).ok());
  const std::vector<int32_t> topk = {5, 9};  // 6 stays prefetched and unused
  std::vector<int32_t> slots(2);
  ASSERT_TRUE(m_->ResolveLayer(0, topk.data(), slots.data(), nullptr, nullptr).ok());
  ASSERT_TRUE(m_->CopyMisses(0, nullptr).ok());
  ASSERT_TRUE(m_->FinishStep(nullptr).ok());
  ASSERT_TRUE(m_->Release(1).ok());

  AdmitWithPrompt(2, 20);  // the same block
  Step(2, {10, 11});
  Step(2, {12, 13});
  Step(2, {14, 15});  // every slot filled again
  const StatusOr<CacheStats> s = m_->ReadStats(nullptr);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->prefetch_rows, 2u);
  EXPECT_EQ(s->prefetch_useful_rows, 1u);
  EXPECT_EQ(s->prefetch_wasted_rows, 0u);  // 6 left with request 1
}

TEST_F(ManagerTest, WithoutAPrefetchTheMarksTakeNoMemory) {
  CacheOptions o = SmallOptions();
  auto without = SparseKVCacheManager::Create(o, CreateCpuBackend());
  o.max_prefetch = 2;
  auto with = SparseKVCacheManager::Create(o, CreateCpuBackend());
  ASSERT_TRUE(without.ok() && with.ok());
  const StatusOr<CacheStats> a = (*without)->ReadStats(nullptr);
  const StatusOr<CacheStats> b = (*with)->ReadStats(nullptr);
  ASSERT_TRUE(a.ok() && b.ok());
  // One byte per slot of every block (max_requests 2 blocks of C = 3 slots), and one per index
  // group (one layer: one group).
  EXPECT_EQ(b->device_memory.counters - a->device_memory.counters, 2 * 3 + 1);
}

TEST_F(ManagerTest, CreateRejectsInvalidOptions) {
  CacheOptions o = SmallOptions();
  o.hot_slots = 1;
  auto m = SparseKVCacheManager::Create(o, CreateCpuBackend());
  EXPECT_EQ(m.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(SparseKVCacheManager::Create(SmallOptions(), nullptr).status().code(),
            StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace sparsekv
