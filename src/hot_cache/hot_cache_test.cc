// HotCache's block and resident-page bookkeeping, and the state it uploads, on the CPU backend.
#include "sparsekv/hot_cache.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <vector>

namespace sparsekv {
namespace {

// C = 6 LRU slots + W = 2 window slots per block: 8 rows, two pages of R = 4 rows (or one of 5).
std::unique_ptr<HotCache> MakeCache(std::shared_ptr<Backend> backend, int32_t blocks,
                                    int32_t page_rows) {
  auto cache =
      HotCache::Create(KVGeometry::Uniform(2, 16), 6, 2, blocks, backend.get(), 1, page_rows);
  EXPECT_TRUE(cache.ok()) << cache.status().ToString();
  return std::move(*cache);
}

std::vector<int32_t> Read(const int32_t* p, int32_t n) { return std::vector<int32_t>(p, p + n); }

TEST(HotCacheTest, PagesAndBlocksShareTheBlocks) {
  auto backend = CreateCpuBackend();
  auto cache = MakeCache(backend, 3, 4);
  EXPECT_EQ(cache->pages_per_block(), 2);
  EXPECT_EQ(cache->free_pages(), 6);
  // Pages come from the highest block, blocks from the lowest.
  auto pages = cache->AcquirePages(3);
  ASSERT_TRUE(pages.ok());
  EXPECT_EQ(*pages, (std::vector<int32_t>{16, 20, 8}));  // block 2's pages, then block 1's
  EXPECT_EQ(cache->split_blocks(), 2);
  EXPECT_EQ(cache->free_pages(), 3);  // block 1's second page and block 0
  auto block = cache->Acquire(nullptr);
  ASSERT_TRUE(block.ok());
  EXPECT_EQ(*block, 0);
  EXPECT_EQ(cache->used_blocks(), 1);
  EXPECT_EQ(cache->free_pages(), 1);
  EXPECT_EQ(cache->AcquirePages(2).status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(cache->free_pages(), 1);  // all or nothing
  EXPECT_EQ(cache->Acquire(nullptr).status().code(), StatusCode::kResourceExhausted);
  // Block 2's pages freed: the block is whole again and can be a hot-cache block.
  const std::vector<int32_t> block2 = {16, 20};
  cache->ReleasePages(block2);
  EXPECT_EQ(cache->split_blocks(), 1);
  EXPECT_EQ(cache->free_blocks(), 1);
  auto again = cache->Acquire(nullptr);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, 2);
  // The split block's free page is taken before any whole block.
  cache->Release(0);
  auto one = cache->AcquirePages(1);
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(*one, (std::vector<int32_t>{12}));
}

TEST(HotCacheTest, PagesNeedResidentPageRows) {
  auto backend = CreateCpuBackend();
  auto cache = MakeCache(backend, 2, 0);
  EXPECT_EQ(cache->free_pages(), 0);
  EXPECT_EQ(cache->AcquirePages(1).status().code(), StatusCode::kFailedPrecondition);
  EXPECT_FALSE(HotCache::Create(KVGeometry::Uniform(2, 16), 6, 2, 2, backend.get(), 1, 9).ok());
  EXPECT_EQ(MakeCache(backend, 1, 5)->pages_per_block(), 1);  // the rest of the block unused
}

TEST(HotCacheTest, SeededBlockHoldsThePositionsMostRecentLast) {
  auto backend = CreateCpuBackend();
  auto cache = MakeCache(backend, 2, 4);
  auto block = cache->AcquireSeeded(std::vector<int32_t>{30, 31, 32, 33}, nullptr);
  ASSERT_TRUE(block.ok());
  EXPECT_EQ(*block, 0);
  for (int32_t layer : {0, 1}) {
    EXPECT_EQ(Read(cache->slot_token(layer), 6), (std::vector<int32_t>{30, 31, 32, 33, -1, -1}));
    EXPECT_EQ(Read(cache->lru_order(layer), 6), (std::vector<int32_t>{4, 5, 0, 1, 2, 3}));
    EXPECT_EQ(cache->lru_protected(layer)[0], 0);
  }
  EXPECT_EQ(cache->AcquireSeeded(std::vector<int32_t>(7, 1), nullptr).status().code(),
            StatusCode::kInvalidArgument);
  // A plain Acquire of the next block resets it.
  auto next = cache->Acquire(nullptr);
  ASSERT_TRUE(next.ok());
  EXPECT_EQ(Read(cache->slot_token(0) + 6, 6), std::vector<int32_t>(6, -1));
  std::vector<int32_t> order(6);
  std::iota(order.begin(), order.end(), 0);
  EXPECT_EQ(Read(cache->lru_order(0) + 6, 6), order);
}

CacheOptions BudgetOptions() {
  CacheOptions o;
  o.geometry = KVGeometry::Uniform(4, 100);
  o.top_k = 8;
  o.window = 2;
  o.max_requests = 3;
  o.hot_slots = 0;
  return o;
}

TEST(ChooseHotCacheShapeTest, WithoutABudgetTheOptionsDecide) {
  CacheOptions o = BudgetOptions();
  o.hot_slots = 16;
  auto shape = ChooseHotCacheShape(o);
  ASSERT_TRUE(shape.ok());
  EXPECT_EQ(shape->hot_slots, 16);
  EXPECT_EQ(shape->blocks, 3);
  EXPECT_EQ(shape->block_bytes, HotCache::BlockBytes(o.geometry, 16, 2));
}

TEST(ChooseHotCacheShapeTest, TheBudgetIsSpentOnMaxRequestsBlocks) {
  CacheOptions o = BudgetOptions();
  // A block of C slots: 4 layers x 100 B x (C + 2) rows + 4 states x (2C + 1) x 4 B = 432 C + 816.
  ASSERT_EQ(HotCache::BlockBytes(o.geometry, 10, 2), 432 * 10 + 816);
  o.device_budget_bytes = 3 * (432 * 40 + 816) + 431;  // C = 40 fits, 41 does not
  auto shape = ChooseHotCacheShape(o);
  ASSERT_TRUE(shape.ok()) << shape.status().ToString();
  EXPECT_EQ(shape->hot_slots, 40);
  EXPECT_EQ(shape->blocks, 3);
  // Given slots: as many blocks as fit.
  o.hot_slots = 10;
  shape = ChooseHotCacheShape(o);
  ASSERT_TRUE(shape.ok());
  EXPECT_EQ(shape->blocks, o.device_budget_bytes / (432 * 10 + 816));
  // Capped at the kernels' limit.
  o.hot_slots = 0;
  o.device_budget_bytes = int64_t{1} << 40;
  shape = ChooseHotCacheShape(o);
  ASSERT_TRUE(shape.ok());
  EXPECT_EQ(shape->hot_slots, kMaxHotSlots);
}

TEST(ChooseHotCacheShapeTest, ABudgetTooSmallIsRefused) {
  CacheOptions o = BudgetOptions();
  o.device_budget_bytes = 3 * (432 * 8 + 816) - 1;  // not three blocks of top_k = 8 slots
  const auto shape = ChooseHotCacheShape(o);
  EXPECT_EQ(shape.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(shape.status().message().find("cannot hold max_requests (3) blocks of 8 slots"),
            std::string::npos)
      << shape.status().message();
  o.device_budget_bytes += 1;
  EXPECT_TRUE(ChooseHotCacheShape(o).ok());
  o.hot_slots = 9;
  EXPECT_FALSE(ChooseHotCacheShape(o).ok());
}

}  // namespace
}  // namespace sparsekv
