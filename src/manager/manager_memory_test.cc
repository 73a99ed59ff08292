// CacheStats::device_memory and host_memory: every byte the manager allocated, by use, through
// admissions (resident and hot-cache), demotion, indexer keys, prefix sharing, forks, retained
// conversations and releases; the parts always add up to what was allocated.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "sparsekv/hot_cache.h"
#include "sparsekv/manager.h"
#include "testing/harness.h"
#include "testing/workload.h"

namespace sparsekv {
namespace {

constexpr int32_t kLayers = 2;
constexpr int32_t kRow = 16;
constexpr int32_t kKey = 8;
constexpr int32_t kPageRows = 4;  // a device page: 4 rows of every layer = 128 bytes
constexpr int32_t kPrompt = 16;   // two host pages of 8 tokens
constexpr int64_t kDevicePage = int64_t{kPageRows} * kRow * kLayers;
constexpr int64_t kHostPage = int64_t{8} * kRow * kLayers;

class ManagerMemoryTest : public ::testing::Test {
 protected:
  // Hybrid residency with indexer keys; room for about two resident requests.
  static CacheOptions Options() {
    CacheOptions o = testing::SmallOptions();
    o.geometry = KVGeometry::Uniform(kLayers, kRow);
    o.top_k = 2;
    o.hot_slots = 6;
    o.window = 2;
    o.max_requests = 4;
    o.max_host_requests = 6;
    o.max_context = 24;
    o.host_capacity_tokens = 6 * 24;
    o.host_page_tokens = 8;
    o.hybrid_residency = true;
    o.resident_page_rows = kPageRows;
    o.indexer_key_bytes = kKey;
    const int64_t state = 4 * (HotCache::StateBytes(o.geometry, 6, 1, ReplacementOf(o)) + 2 * 4);
    // Four blocks (2 pages each) with their keys (24 positions: 3 pages), and 8 pages more.
    o.device_budget_bytes = (4 * 5 + 8) * kDevicePage + state;
    return o;
  }

  void SetUp() override {
    auto m = SparseKVCacheManager::Create(Options(), CreateCpuBackend());
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    m_ = std::move(*m);
  }

  void Admit(RequestId id, const std::vector<int32_t>* token_ids = nullptr) {
    if (token_ids == nullptr) {
      ASSERT_TRUE(m_->Admit(id, kPrompt, 4, nullptr).ok());
    } else {
      ASSERT_TRUE(m_->AdmitWithPrefix(id, *token_ids, 4, nullptr).ok());
    }
    const testing::Bytes rows(size_t{kPrompt} * kRow, std::byte{1});
    const std::vector<std::byte> keys(size_t{kPrompt} * kKey, std::byte{2});
    for (int32_t l = 0; l < kLayers; ++l) {
      ASSERT_TRUE(m_->IngestPrompt(id, l, rows.data(), nullptr).ok());
      ASSERT_TRUE(m_->IngestIndexerKeys(id, l, keys.data(), nullptr).ok());
    }
  }

  // The stats now, checked to add up.
  CacheStats Read() {
    StatusOr<CacheStats> s = m_->ReadStats(nullptr);
    EXPECT_TRUE(s.ok());
    const DeviceMemoryUse& d = s->device_memory;
    EXPECT_EQ(d.sum(), s->device_bytes);
    for (int64_t part : {d.resident_rows, d.hot_cache_rows, d.indexer_keys, d.free_rows,
                         d.replacement_state, d.tables, d.plan, d.counters}) {
      EXPECT_GE(part, 0);
    }
    const HostMemoryUse& h = s->host_memory;
    EXPECT_EQ(h.sum(), h.total);
    EXPECT_EQ(h.total, int64_t{s->host_pages_total} * kHostPage);
    EXPECT_EQ(h.free_pages, int64_t{s->host_pages_total - s->host_pages_used} * kHostPage);
    for (int64_t part : {h.private_pages, h.shared_pages, h.retained_pages, h.free_pages}) {
      EXPECT_GE(part, 0);
    }
    EXPECT_FALSE(h.node_pool);
    return *s;
  }

  std::unique_ptr<SparseKVCacheManager> m_;
};

TEST_F(ManagerMemoryTest, DeviceMemoryByUseAddsUpThroughResidencyAndKeys) {
  const CacheStats empty = Read();
  EXPECT_EQ(empty.device_memory.resident_rows, 0);
  EXPECT_EQ(empty.device_memory.hot_cache_rows, 0);
  EXPECT_EQ(empty.device_memory.indexer_keys, 0);
  const int64_t free_at_start = empty.device_memory.free_rows;
  EXPECT_GT(free_at_start, 0);
  EXPECT_GT(empty.device_memory.replacement_state, 0);
  EXPECT_GT(empty.device_memory.tables, 0);
  EXPECT_GT(empty.device_memory.plan, 0);
  EXPECT_GT(empty.device_memory.counters, 0);

  // A resident request: its 20 positions in 5 pages, its keys (24 reserved positions, 8 keys a
  // page of a layer) in 3.
  Admit(1);
  ASSERT_TRUE(m_->IsResident(1));
  CacheStats s = Read();
  EXPECT_EQ(s.device_memory.resident_rows, 5 * kDevicePage);
  EXPECT_EQ(s.device_memory.indexer_keys, 3 * kDevicePage);
  EXPECT_EQ(s.device_memory.hot_cache_rows, 0);
  EXPECT_EQ(s.device_memory.free_rows, free_at_start - 8 * kDevicePage);

  // Admissions until some request is in hot-cache mode: blocks of 2 pages each.
  for (RequestId id = 2; id <= 4; ++id) Admit(id);
  s = Read();
  EXPECT_GT(s.hot_blocks_used, 0);
  EXPECT_EQ(s.device_memory.hot_cache_rows, int64_t{s.hot_blocks_used} * 2 * kDevicePage);
  EXPECT_EQ(s.device_memory.resident_rows, int64_t{s.resident_requests} * 5 * kDevicePage);
  EXPECT_EQ(s.device_memory.indexer_keys, 4 * 3 * kDevicePage);

  // A step, a retraction (keys stay in HBM) and releases give every page back.
  ASSERT_TRUE(m_->Retract(4).ok());
  s = Read();
  EXPECT_EQ(s.device_memory.indexer_keys, 4 * 3 * kDevicePage);
  for (RequestId id = 1; id <= 4; ++id) ASSERT_TRUE(m_->Release(id).ok());
  s = Read();
  EXPECT_EQ(
      s.device_memory.resident_rows + s.device_memory.hot_cache_rows + s.device_memory.indexer_keys,
      0);
  EXPECT_EQ(s.device_memory.free_rows, free_at_start);
}

TEST_F(ManagerMemoryTest, HostMemoryByUseFollowsSharingAndRetention) {
  std::vector<int32_t> ids(kPrompt);
  for (int32_t i = 0; i < kPrompt; ++i) ids[i] = 100 + i;
  // Three pages reserved (16 + 4 tokens), all private.
  Admit(1, &ids);
  CacheStats s = Read();
  EXPECT_EQ(s.host_memory.private_pages, 3 * kHostPage);
  EXPECT_EQ(s.host_memory.shared_pages + s.host_memory.retained_pages, 0);

  // A second request with the same prompt shares its first full page (the last prompt token is
  // always ingested, so the second page is its own) and reserves two pages: 1 shared, 2 + 2
  // private.
  Admit(2, &ids);
  s = Read();
  EXPECT_EQ(s.host_memory.shared_pages, 1 * kHostPage);
  EXPECT_EQ(s.host_memory.private_pages, 4 * kHostPage);

  // The first ends retained: its full pages stay for the next turn; the shared one has the second
  // request as holder too, so only its own second page is retained-only.
  ASSERT_TRUE(m_->Retain(1).ok());
  s = Read();
  EXPECT_EQ(s.host_memory.shared_pages, 1 * kHostPage);
  EXPECT_EQ(s.host_memory.retained_pages, 1 * kHostPage);
  EXPECT_EQ(s.host_memory.private_pages, 2 * kHostPage);

  // Once the second is released too, both retained pages are the conversation's alone.
  ASSERT_TRUE(m_->Release(2).ok());
  s = Read();
  EXPECT_EQ(s.host_memory.retained_pages, 2 * kHostPage);
  EXPECT_EQ(s.host_memory.shared_pages + s.host_memory.private_pages, 0);
  EXPECT_EQ(m_->EvictRetained(), 1);
  s = Read();
  EXPECT_EQ(s.host_memory.free_pages, s.host_memory.total);
}

}  // namespace
}  // namespace sparsekv
