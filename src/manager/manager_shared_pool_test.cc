// Node-level sharing on the CPU backend: several managers on one HostKVPool, each driven by its
// own thread, exhaustion of the shared pool, and pools that do not match a manager's options.
#include <gtest/gtest.h>

#include <cstring>
#include <thread>

#include "sparsekv/host_kv_pool.h"
#include "sparsekv/manager.h"
#include "testing/harness.h"
#include "testing/workload.h"

namespace sparsekv {
namespace {

using testing::Bytes;
using testing::SmallOptions;

std::shared_ptr<HostKVPool> MustCreatePool(const CacheOptions& o, int32_t max_owners) {
  auto pool = HostKVPool::CreateShared(o, max_owners, CreateCpuBackend());
  EXPECT_TRUE(pool.ok()) << pool.status().ToString();
  return pool.ok() ? *pool : nullptr;
}

std::unique_ptr<SparseKVCacheManager> MustCreate(const CacheOptions& o,
                                                 std::shared_ptr<HostKVPool> pool) {
  auto m = SparseKVCacheManager::Create(o, CreateCpuBackend(), std::move(pool));
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  return m.ok() ? std::move(*m) : nullptr;
}

// Admits `id` with a prompt of `len` tokens of its own (no prefix in common with another id) and
// ingests it.
void AdmitAndIngest(SparseKVCacheManager& m, RequestId id, int32_t len) {
  std::vector<int32_t> tokens(len);
  for (int32_t i = 0; i < len; ++i) tokens[i] = static_cast<int32_t>(id) * 100 + i;
  StatusOr<int32_t> cached = m.AdmitWithPrefix(id, tokens, 0, nullptr);
  ASSERT_TRUE(cached.ok()) << cached.status().ToString();
  const Bytes rows(static_cast<size_t>(len - *cached) * 8, std::byte{0x11});
  ASSERT_TRUE(m.IngestPromptSuffix(id, 0, rows.data(), nullptr).ok());
}

// Runs `ops` random operations on each of three managers sharing one pool of
// `pool_capacity_tokens`, one thread per manager, each checked against its own model. Returns the
// decode steps each manager made.
std::vector<int> RunConcurrently(CacheOptions o, int64_t pool_capacity_tokens, uint64_t seed,
                                 int ops) {
  constexpr int kManagers = 3;
  o.host_capacity_tokens = pool_capacity_tokens;
  std::shared_ptr<HostKVPool> pool = MustCreatePool(o, kManagers * o.effective_max_host_requests());
  if (pool == nullptr) return {};
  std::vector<std::unique_ptr<SparseKVCacheManager>> managers;
  for (int i = 0; i < kManagers; ++i) {
    managers.push_back(MustCreate(o, pool));
    if (managers.back() == nullptr) return {};
  }
  std::vector<int> steps(kManagers, 0);
  std::vector<std::thread> threads;
  for (int i = 0; i < kManagers; ++i) {
    threads.emplace_back([&, i] {
      testing::RandomWorkload w(o, seed * 100 + i, {managers[i].get()});
      steps[i] = w.Run(ops);
      w.CheckStats();
    });
  }
  for (std::thread& t : threads) t.join();
  // Whatever the managers still hold, destroying them gives every page and owner back.
  managers.clear();
  EXPECT_EQ(pool->free_pages(), pool->total_pages());
  EXPECT_EQ(pool->free_owners(), pool->max_owners());
  EXPECT_EQ(pool->shared_pages(), 0);
  return steps;
}

TEST(SharedPoolTest, ManagersOnOnePoolRunConcurrentlyAndExactly) {
  for (uint64_t seed : testing::TestSeeds(4)) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    const CacheOptions o = testing::RandomSmallOptions(seed);
    // Room for all three managers' largest demand: no admission depends on the others, so
    // every manager makes progress.
    const int64_t room =
        int64_t{3} * o.effective_max_host_requests() * (o.max_context + o.host_page_tokens);
    const std::vector<int> steps = RunConcurrently(o, room, seed, 1000);
    ASSERT_EQ(steps.size(), 3u);
    for (size_t i = 0; i < steps.size(); ++i) EXPECT_GT(steps[i], 0) << "manager " << i;
  }
}

// A pool smaller than the three managers' demand: admissions and growth fail with
// ResourceExhausted depending on what the other threads hold at that moment. Which ones fail is
// a matter of timing, so only exactness and the final accounting are checked; progress is not
// (one manager may find the pool full every time it asks).
TEST(SharedPoolTest, ManagersCompetingForATightPoolStayExact) {
  for (uint64_t seed : testing::TestSeeds(4)) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    const CacheOptions o = testing::RandomSmallOptions(seed);
    EXPECT_EQ(RunConcurrently(o, o.host_capacity_tokens, seed, 600).size(), 3u);
  }
}

TEST(SharedPoolTest, AdmissionFailsCleanlyWhenAnotherManagerHoldsThePool) {
  const CacheOptions o = SmallOptions();
  std::shared_ptr<HostKVPool> pool = MustCreatePool(o, 3);
  ASSERT_NE(pool, nullptr);
  auto a = MustCreate(o, pool);
  auto b = MustCreate(o, pool);
  ASSERT_TRUE(a && b);
  // a: a retained conversation of 2 pages and live requests of 4 + 2 pages: the pool is full.
  AdmitAndIngest(*a, 1, 16);
  ASSERT_EQ(*a->Retain(1), 16);
  AdmitAndIngest(*a, 2, 32);
  AdmitAndIngest(*a, 3, 16);
  ASSERT_EQ(pool->free_pages(), 0);
  const std::vector<int32_t> pages_of_2 = *a->HostPages(2);

  // b cannot evict a's conversation: it fails and changes nothing.
  EXPECT_EQ(b->Admit(7, 8, 0, nullptr).code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(pool->free_pages(), 0);
  EXPECT_EQ(pool->free_owners(), 1);
  EXPECT_TRUE(a->IsRetained(1));
  EXPECT_EQ(b->SequenceLength(7).status().code(), StatusCode::kNotFound);
  StatusOr<CacheStats> stats = b->ReadStats(nullptr);
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->hot_blocks_used, 0);
  EXPECT_EQ(stats->evictions, 0u);

  // Once a releases a request, b gets pages of it.
  ASSERT_TRUE(a->Release(2).ok());
  ASSERT_TRUE(b->Admit(7, 8, 0, nullptr).ok());
  EXPECT_EQ(*b->HostPages(7), std::vector<int32_t>{pages_of_2[0]});
  // a makes room by evicting its own conversation (4 pages needed, 3 free).
  ASSERT_TRUE(a->Admit(4, 32, 0, nullptr).ok());
  EXPECT_FALSE(a->IsRetained(1));
  // All three owners are in use: a fourth live request fails.
  EXPECT_EQ(b->Admit(8, 1, 0, nullptr).code(), StatusCode::kResourceExhausted);

  for (RequestId id : {3, 4}) ASSERT_TRUE(a->Release(id).ok());
  ASSERT_TRUE(b->Release(7).ok());
  EXPECT_EQ(pool->free_pages(), pool->total_pages());
  EXPECT_EQ(pool->free_owners(), 3);
}

// Each manager holds at most max_host_requests owners of a shared pool, retracted requests
// included, however many the pool has free: the others' share stays theirs.
TEST(SharedPoolTest, AManagerTakesNoMoreOwnersThanItsMaxHostRequests) {
  const CacheOptions o = SmallOptions();  // max_requests 2, so 2 host requests per manager
  std::shared_ptr<HostKVPool> pool = MustCreatePool(o, 6);
  ASSERT_NE(pool, nullptr);
  auto a = MustCreate(o, pool);
  auto b = MustCreate(o, pool);
  ASSERT_TRUE(a && b);
  AdmitAndIngest(*a, 1, 8);
  AdmitAndIngest(*a, 2, 8);
  ASSERT_TRUE(a->Retract(1).ok());  // frees its hot-cache block, keeps its owner
  const Status third = a->Admit(3, 8, 0, nullptr);
  EXPECT_EQ(third.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(third.message().find("this manager"), std::string::npos) << third.ToString();
  EXPECT_EQ(pool->free_owners(), 4);
  ASSERT_TRUE(b->Admit(7, 8, 0, nullptr).ok());
  ASSERT_TRUE(b->Admit(8, 8, 0, nullptr).ok());
  EXPECT_EQ(pool->free_owners(), 2);
}

TEST(SharedPoolTest, PoolMustMatchTheOptions) {
  const CacheOptions o = SmallOptions();
  std::shared_ptr<HostKVPool> pool = MustCreatePool(o, 2);
  ASSERT_NE(pool, nullptr);
  const auto create = [&](const CacheOptions& other) {
    return SparseKVCacheManager::Create(other, CreateCpuBackend(), pool).status().code();
  };
  EXPECT_EQ(create(o), StatusCode::kOk);
  CacheOptions other = o;
  other.geometry = KVGeometry::Uniform(2, 8);
  EXPECT_EQ(create(other), StatusCode::kInvalidArgument);
  other = o;
  other.geometry = KVGeometry::Uniform(1, 8, 16);
  EXPECT_EQ(create(other), StatusCode::kInvalidArgument);
  other = o;
  other.host_page_tokens = 16;
  EXPECT_EQ(create(other), StatusCode::kInvalidArgument);
  other = o;
  other.host_capacity_tokens = 128;
  EXPECT_EQ(create(other), StatusCode::kInvalidArgument);
  other = o;
  other.max_context = 16;
  EXPECT_EQ(create(other), StatusCode::kInvalidArgument);
  EXPECT_EQ(SparseKVCacheManager::Create(o, CreateCpuBackend(), nullptr).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(HostKVPool::CreateShared(o, 0, CreateCpuBackend()).status().code(),
            StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace sparsekv
