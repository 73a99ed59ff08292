// PrefetchMarks on its own, over the CPU backend: nothing without a prefetch, the views it sets,
// which step resolve counts its misses, and what Reset clears.
#include "manager/prefetch_marks.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <vector>

namespace sparsekv {
namespace {

// Three layers in index groups of two: groups 0 (layers 0, 1) and 1 (layer 2).
CacheOptions Options(int32_t max_prefetch) {
  CacheOptions o;
  o.geometry = KVGeometry::Uniform(3, 16);
  o.layers_per_index = 2;
  o.max_prefetch = max_prefetch;
  return o;
}

TEST(PrefetchMarksTest, WithoutAPrefetchHoldsNothingAndLeavesViewsAlone) {
  const CacheOptions options = Options(0);
  std::shared_ptr<Backend> backend = CreateCpuBackend();
  const IndexGroups groups(options);
  PrefetchMarks marks(options, groups, *backend);
  ASSERT_TRUE(marks.Allocate(4, 8).ok());
  EXPECT_FALSE(marks.enabled());
  EXPECT_EQ(marks.device_bytes(), 0);
  ResolveView v{};
  marks.Attach(v, 0, /*prefetch=*/true);
  EXPECT_TRUE(marks.AfterResolve(0, /*prefetch=*/true, nullptr).ok());
  marks.Attach(v, 0, /*prefetch=*/false);
  EXPECT_TRUE(marks.AfterResolve(0, /*prefetch=*/false, nullptr).ok());
  EXPECT_EQ(v.prefetch_mark, nullptr);
  EXPECT_FALSE(v.prefetch_fills);
  EXPECT_EQ(v.count_prefetch_misses, nullptr);
  EXPECT_EQ(marks.prefetched(0), nullptr);
  EXPECT_TRUE(marks.Reset(nullptr).ok());
}

// The group's byte, as the resolves after which AfterResolve ran leave it (the CPU backend's
// device memory is read in place).
uint8_t Prefetched(const PrefetchMarks& marks, Backend& backend, int32_t group) {
  EXPECT_TRUE(backend.Synchronize(nullptr).ok());
  return *marks.prefetched(group);
}

TEST(PrefetchMarksTest, GivesEachGroupItsMarksAndCountsMissesOnlyAfterAPrefetch) {
  const CacheOptions options = Options(2);
  std::shared_ptr<Backend> backend = CreateCpuBackend();
  const IndexGroups groups(options);
  PrefetchMarks marks(options, groups, *backend);
  ASSERT_TRUE(marks.Allocate(4, 8).ok());
  ASSERT_TRUE(marks.enabled());
  // Two groups of 4 blocks of 8 slots, and a byte per group.
  EXPECT_EQ(marks.device_bytes(), 2 * 4 * 8 + 2);

  ResolveView step0{};
  marks.Attach(step0, 0, /*prefetch=*/false);
  ASSERT_NE(step0.prefetch_mark, nullptr);
  EXPECT_FALSE(step0.prefetch_fills);
  EXPECT_EQ(step0.count_prefetch_misses, marks.prefetched(0));  // read on the device
  EXPECT_EQ(Prefetched(marks, *backend, 0), 0);                 // no prefetch before it
  ASSERT_TRUE(marks.AfterResolve(0, /*prefetch=*/false, nullptr).ok());

  ResolveView prefetch2{};
  marks.Attach(prefetch2, 2, /*prefetch=*/true);
  EXPECT_EQ(prefetch2.prefetch_mark, step0.prefetch_mark + 4 * 8);  // group 1's marks
  EXPECT_TRUE(prefetch2.prefetch_fills);
  EXPECT_EQ(prefetch2.count_prefetch_misses, nullptr);
  ASSERT_TRUE(marks.AfterResolve(2, /*prefetch=*/true, nullptr).ok());

  EXPECT_EQ(Prefetched(marks, *backend, 0), 0);  // group 0 was not prefetched
  ResolveView step2{};
  marks.Attach(step2, 2, /*prefetch=*/false);
  EXPECT_EQ(step2.count_prefetch_misses, marks.prefetched(1));
  EXPECT_EQ(Prefetched(marks, *backend, 1), 1);  // the resolve that follows group 1's prefetch
  ASSERT_TRUE(marks.AfterResolve(2, /*prefetch=*/false, nullptr).ok());
  EXPECT_EQ(Prefetched(marks, *backend, 1), 0);  // and only that one
}

TEST(PrefetchMarksTest, ResetClearsTheMarksAndThePendingPrefetches) {
  const CacheOptions options = Options(2);
  std::shared_ptr<Backend> backend = CreateCpuBackend();
  const IndexGroups groups(options);
  PrefetchMarks marks(options, groups, *backend);
  ASSERT_TRUE(marks.Allocate(1, 4).ok());
  ResolveView prefetch{};
  marks.Attach(prefetch, 0, /*prefetch=*/true);
  ASSERT_TRUE(marks.AfterResolve(0, /*prefetch=*/true, nullptr).ok());
  std::fill_n(prefetch.prefetch_mark, 2 * 4, uint8_t{1});  // as resolves would set them
  ASSERT_TRUE(marks.Reset(nullptr).ok());
  ASSERT_TRUE(backend->Synchronize(nullptr).ok());
  EXPECT_EQ(std::vector<uint8_t>(prefetch.prefetch_mark, prefetch.prefetch_mark + 8),
            std::vector<uint8_t>(8, 0));
  EXPECT_EQ(Prefetched(marks, *backend, 0), 0);
}

}  // namespace
}  // namespace sparsekv
