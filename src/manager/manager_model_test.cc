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

}  // namespace
}  // namespace sparsekv
