// Model-based randomized test of the manager on the CPU backend: thousands of random operations
// over several requests and layers, every delivered row checked byte for byte against a dense
// model of each request's history. Run one seed with SPARSEKV_TEST_SEED=<n>.
#include <gtest/gtest.h>

#include "sparsekv/manager.h"
#include "testing/workload.h"

namespace sparsekv {
namespace {

TEST(ManagerModelTest, RandomOperationsMatchTheDenseModel) {
  int total_steps = 0;
  for (uint64_t seed : testing::TestSeeds(24)) {
    SCOPED_TRACE("seed " + std::to_string(seed) + " (rerun with SPARSEKV_TEST_SEED=" +
                 std::to_string(seed) + ")");
    const CacheOptions options = testing::RandomSmallOptions(seed);
    auto m = SparseKVCacheManager::Create(options, CreateCpuBackend());
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    testing::RandomWorkload w(options, seed, {m->get()});
    total_steps += w.Run(400);
    w.CheckStats();
    w.ReleaseAll();
    if (HasFailure()) break;
  }
  RecordProperty("steps", total_steps);
  EXPECT_GT(total_steps, 1000);
}

// The same with shared prefixes, continued turns, forks, retained conversations and eviction:
// every request still reads exactly its own history, shared pages never change while shared,
// and the pool is empty once everything is released and evicted.
TEST(ManagerModelTest, RandomSharingOperationsMatchTheDenseModel) {
  int total_steps = 0;
  uint64_t hits = 0, evictions = 0, copies = 0;
  for (uint64_t seed : testing::TestSeeds(24)) {
    SCOPED_TRACE("seed " + std::to_string(seed) +
                 " (rerun with SPARSEKV_TEST_SEED=" + std::to_string(seed) + ")");
    const CacheOptions options = testing::RandomSmallOptions(seed);
    auto m = SparseKVCacheManager::Create(options, CreateCpuBackend());
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    testing::WorkloadShape shape;
    shape.sharing = true;
    shape.vocabulary = 2 + static_cast<int32_t>(seed % 3);
    testing::RandomWorkload w(options, seed, {m->get()}, shape);
    total_steps += w.Run(400);
    w.CheckStats();
    const CacheStats s = *(*m)->ReadStats(nullptr);
    hits += s.prefix_hit_tokens;
    evictions += s.evictions;
    copies += s.copy_on_write_pages;
    w.ReleaseAll();
    if (HasFailure()) break;
  }
  RecordProperty("steps", total_steps);
  EXPECT_GT(total_steps, 1000);
  // The operations the test is about did happen.
  EXPECT_GT(hits, 0u);
  EXPECT_GT(evictions, 0u);
  EXPECT_GT(copies, 0u);
}

}  // namespace
}  // namespace sparsekv
