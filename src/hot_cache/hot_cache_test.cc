// HotCache's block and resident-page bookkeeping, and the state it uploads, on the CPU backend.
#include "sparsekv/hot_cache.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <vector>

#include "sparsekv/index_groups.h"
#include "testing/counting_backend.h"

namespace sparsekv {
namespace {

// C = 6 LRU slots + W = 2 window slots per block: 8 slots, two pages of R = 4 rows (or one page of
// 8 rows).
std::unique_ptr<HotCache> MakeCache(std::shared_ptr<Backend> backend, int32_t blocks, int64_t pages,
                                    int32_t page_rows) {
  auto cache =
      HotCache::Create(KVGeometry::Uniform(2, 16), 6, 2, blocks, pages, page_rows, backend.get());
  EXPECT_TRUE(cache.ok()) << cache.status().ToString();
  return std::move(*cache);
}

std::vector<int32_t> Read(const int32_t* p, int32_t n) { return std::vector<int32_t>(p, p + n); }

TEST(HotCacheTest, BlocksAndResidentPagesShareThePages) {
  auto backend = CreateCpuBackend();
  auto cache = MakeCache(backend, 3, 6, 4);
  EXPECT_EQ(cache->pages_per_block(), 2);
  EXPECT_EQ(cache->free_pages(), 6);
  EXPECT_EQ(cache->layer_rows(), 24);
  // Pages come from the high end, blocks from the low end.
  auto pages = cache->AcquirePages(3);
  ASSERT_TRUE(pages.ok());
  EXPECT_EQ(*pages, (std::vector<int32_t>{20, 16, 12}));
  EXPECT_EQ(cache->free_pages(), 3);
  auto block = cache->Acquire(nullptr);
  ASSERT_TRUE(block.ok());
  EXPECT_EQ(*block, 0);
  EXPECT_EQ(cache->used_blocks(), 1);
  EXPECT_EQ(cache->free_pages(), 1);
  // Block 0 is pages 0 and 1: slot s is row s % 4 of page s / 4.
  EXPECT_EQ(cache->Slot(0, 0), 0);
  EXPECT_EQ(cache->Slot(0, 5), 5);
  EXPECT_EQ(cache->WindowSlot(0, 9), 7);  // slot C + 9 % W
  EXPECT_EQ(Read(cache->block_pages(), 2), (std::vector<int32_t>{0, 4}));
  EXPECT_EQ(cache->Locate(6).block, 0);
  EXPECT_EQ(cache->Locate(6).slot, 6);
  EXPECT_EQ(cache->Locate(16).block, -1);  // a resident page
  EXPECT_EQ(cache->AcquirePages(2).status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(cache->free_pages(), 1);  // all or nothing
  EXPECT_FALSE(cache->CanAcquire());
  EXPECT_EQ(cache->Acquire(nullptr).status().code(), StatusCode::kResourceExhausted);
  // Any two free pages make a block, wherever they are.
  const std::vector<int32_t> two = {20, 12};
  cache->ReleasePages(two);
  auto again = cache->Acquire(nullptr);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, 1);
  EXPECT_EQ(cache->Slot(1, 0), 8);   // the lowest free page, then the next
  EXPECT_EQ(cache->Slot(1, 6), 14);  // page 12's row 2
  EXPECT_EQ(cache->Locate(13).block, 1);
  EXPECT_EQ(cache->Locate(13).slot, 5);
  EXPECT_EQ(Read(cache->block_pages() + 2, 2), (std::vector<int32_t>{8, 12}));
  cache->Release(0);
  EXPECT_EQ(cache->free_pages(), 3);
  EXPECT_EQ(cache->free_blocks(), 2);
}

TEST(HotCacheTest, OnePagePerBlockIsTheContiguousLayout) {
  auto backend = CreateCpuBackend();
  auto cache = MakeCache(backend, 3, 3, 8);
  for (int32_t b = 0; b < 3; ++b) {
    auto block = cache->Acquire(nullptr);
    ASSERT_TRUE(block.ok());
    EXPECT_EQ(*block, b);
    EXPECT_EQ(cache->Slot(b, 3), b * 8 + 3);
  }
  cache->Release(1);
  auto block = cache->Acquire(nullptr);
  ASSERT_TRUE(block.ok());
  EXPECT_EQ(cache->Slot(*block, 0), *block * 8);
  EXPECT_FALSE(HotCache::Create(KVGeometry::Uniform(2, 16), 6, 2, 2, 2, 0, backend.get()).ok());
  EXPECT_EQ(MakeCache(backend, 1, 1, 5)->pages_per_block(), 2);  // 8 slots in pages of 5
}

TEST(HotCacheTest, SeededBlockHoldsThePositionsMostRecentLast) {
  auto backend = CreateCpuBackend();
  auto cache = MakeCache(backend, 2, 4, 4);
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

TEST(HotCacheTest, ClockBlockIsSeededWithItsHandAndPositionMap) {
  auto backend = CreateCpuBackend();
  const HotCacheReplacement clock{.policy = EvictionPolicy::kClock, .positions = 40};
  auto created = HotCache::Create(KVGeometry::Uniform(2, 16), 6, 2, 2, 4, 4, backend.get(),
                                  /*layers_per_state=*/1, clock);
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  HotCache& cache = **created;
  EXPECT_EQ(cache.lru_order(0), nullptr);
  EXPECT_EQ(cache.lru_protected(0), nullptr);
  auto block = cache.AcquireSeeded(std::vector<int32_t>{30, 31, 33, 32}, nullptr);
  ASSERT_TRUE(block.ok()) << block.status().ToString();
  for (int32_t layer : {0, 1}) {
    EXPECT_EQ(Read(cache.slot_token(layer), 6), (std::vector<int32_t>{30, 31, 33, 32, -1, -1}));
    EXPECT_EQ(std::vector<uint8_t>(cache.clock_uses(layer), cache.clock_uses(layer) + 6),
              std::vector<uint8_t>(6, 0));
    EXPECT_EQ(cache.clock_hand(layer)[0], 4);  // the empty slots go first
    std::vector<int32_t> map(40, -1);
    map[30] = 0;
    map[31] = 1;
    map[33] = 2;
    map[32] = 3;
    EXPECT_EQ(Read(cache.position_slot(layer), 40), map);
  }
  // A plain Acquire of the next block resets it: nothing mapped, the hand at 0.
  auto next = cache.Acquire(nullptr);
  ASSERT_TRUE(next.ok());
  EXPECT_EQ(Read(cache.position_slot(1) + 40, 40), std::vector<int32_t>(40, -1));
  EXPECT_EQ(cache.clock_hand(1)[1], 0);
  cache.Release(*next);
  EXPECT_EQ(cache.AcquireSeeded(std::vector<int32_t>{3, 40}, nullptr).status().code(),
            StatusCode::kInvalidArgument);  // outside the map
  EXPECT_EQ(cache.AcquireSeeded(std::vector<int32_t>{3, 3}, nullptr).status().code(),
            StatusCode::kInvalidArgument);  // repeated
  EXPECT_FALSE(HotCache::Create(KVGeometry::Uniform(2, 16), 6, 2, 2, 4, 4, backend.get(), 1,
                                {.policy = EvictionPolicy::kClock, .positions = 0})
                   .ok());
}

CacheOptions BudgetOptions() {
  CacheOptions o;
  o.eviction = EvictionPolicy::kLru;  // the figures below are the LRU order's state
  o.geometry = KVGeometry::Uniform(4, 100);
  o.top_k = 8;
  o.window = 2;
  o.max_requests = 3;
  o.max_context = 1000;
  o.hot_slots = 0;
  return o;
}

// Bytes kept beside the replacement state (the prefetch's marks) start cleared in every block the
// cache hands out, seeded or not, in every state; other blocks' bytes are left alone.
TEST(HotCacheTest, AttachedSlotBytesAreClearedWhenABlockIsAcquired) {
  auto backend = CreateCpuBackend();
  // Two layers, one state each: [2 states, 2 blocks, C = 6].
  auto cache = MakeCache(backend, 2, 4, 8);
  std::vector<uint8_t> bytes(2 * 2 * 6, 1);
  cache->AttachSlotBytes(bytes.data());
  auto first = cache->Acquire(nullptr);
  ASSERT_TRUE(first.ok());
  ASSERT_EQ(*first, 0);
  ASSERT_TRUE(backend->Synchronize(nullptr).ok());
  const std::vector<uint8_t> cleared(6, 0), set(6, 1);
  for (int32_t state = 0; state < 2; ++state) {
    const auto at = bytes.begin() + state * 12;
    EXPECT_EQ(std::vector<uint8_t>(at, at + 6), cleared) << "state " << state << ", block 0";
    EXPECT_EQ(std::vector<uint8_t>(at + 6, at + 12), set) << "state " << state << ", block 1";
  }
  std::fill(bytes.begin(), bytes.end(), 1);
  auto seeded = cache->AcquireSeeded(std::vector<int32_t>{3, 4}, nullptr);
  ASSERT_TRUE(seeded.ok());
  ASSERT_EQ(*seeded, 1);
  ASSERT_TRUE(backend->Synchronize(nullptr).ok());
  for (int32_t state = 0; state < 2; ++state) {
    const auto at = bytes.begin() + state * 12;
    EXPECT_EQ(std::vector<uint8_t>(at, at + 6), set) << "state " << state << ", block 0";
    EXPECT_EQ(std::vector<uint8_t>(at + 6, at + 12), cleared) << "state " << state << ", block 1";
  }
}

TEST(ChooseHotCacheShapeTest, WithoutABudgetTheOptionsDecide) {
  CacheOptions o = BudgetOptions();
  o.hot_slots = 16;
  auto shape = ChooseHotCacheShape(o);
  ASSERT_TRUE(shape.ok());
  EXPECT_EQ(shape->hot_slots, 16);
  EXPECT_EQ(shape->blocks, 3);
  EXPECT_EQ(shape->page_rows, 18);  // a block is one page
  EXPECT_EQ(shape->pages, 3);
  EXPECT_EQ(shape->keys_per_page, 0);
  // A page list entry per block comes on top of BlockBytes.
  EXPECT_EQ(shape->block_bytes, HotCache::BlockBytes(o.geometry, 16, 2) + 4);
  // Paged: blocks of ceil(18 / 4) = 5 pages, and each request's keys of max_context positions
  // in pages of 4 * 100 / 20 = 20 keys.
  o.hybrid_residency = true;
  o.resident_page_rows = 4;
  o.indexer_key_bytes = 20;
  shape = ChooseHotCacheShape(o);
  ASSERT_TRUE(shape.ok());
  EXPECT_EQ(shape->page_rows, 4);
  EXPECT_EQ(shape->keys_per_page, 20);
  EXPECT_EQ(shape->pages, 3 * (5 + 50));
}

TEST(ChooseHotCacheShapeTest, TheBudgetIsSpentOnMaxRequestsBlocks) {
  CacheOptions o = BudgetOptions();
  // A block of C slots: 4 layers x 100 B x (C + 2) rows + 4 states x (2C + 1) x 4 B + its page
  // list entry = 432 C + 820.
  ASSERT_EQ(HotCache::BlockBytes(o.geometry, 10, 2), 432 * 10 + 816);
  o.device_budget_bytes = 3 * (432 * 40 + 820) + 431;  // C = 40 fits, 41 does not
  auto shape = ChooseHotCacheShape(o);
  ASSERT_TRUE(shape.ok()) << shape.status().ToString();
  EXPECT_EQ(shape->hot_slots, 40);
  EXPECT_EQ(shape->blocks, 3);
  EXPECT_EQ(shape->pages, 3);
  // Given slots: the blocks' state, then as many pages as fit.
  o.hot_slots = 10;
  shape = ChooseHotCacheShape(o);
  ASSERT_TRUE(shape.ok());
  EXPECT_EQ(shape->blocks, 3);
  EXPECT_EQ(shape->pages, (o.device_budget_bytes - 3 * (4 * 21 * 4 + 4)) / (400 * 12));
  // Capped at the kernels' limit.
  o.hot_slots = 0;
  o.device_budget_bytes = int64_t{1} << 40;
  shape = ChooseHotCacheShape(o);
  ASSERT_TRUE(shape.ok());
  EXPECT_EQ(shape->hot_slots, kMaxHotSlots);
}

TEST(ChooseHotCacheShapeTest, TheClocksPositionMapIsChargedPerBlock) {
  CacheOptions o = BudgetOptions();
  o.eviction = EvictionPolicy::kClock;
  // Per state: C tokens (4 B), C counts (1 B), the hand (4 B), max_context map entries (4 B).
  const HotCacheReplacement clock = ReplacementOf(o);
  EXPECT_EQ(clock.positions, 1000);
  ASSERT_EQ(HotCache::StateBytes(o.geometry, 10, 1, clock), 4 * (10 * 5 + 4 + 1000 * 4));
  ASSERT_EQ(HotCache::BlockBytes(o.geometry, 10, 2, 1, clock),
            4 * 100 * 12 + HotCache::StateBytes(o.geometry, 10, 1, clock));
  // The budget of three such blocks of C = 40 (and their page list entries) chooses C = 40.
  o.device_budget_bytes = 3 * (HotCache::BlockBytes(o.geometry, 40, 2, 1, clock) + 4);
  auto shape = ChooseHotCacheShape(o);
  ASSERT_TRUE(shape.ok()) << shape.status().ToString();
  EXPECT_EQ(shape->hot_slots, 40);
}

TEST(ChooseHotCacheShapeTest, IndexerKeysAreChargedToTheBudget) {
  CacheOptions o = BudgetOptions();
  o.hybrid_residency = true;
  o.resident_page_rows = 5;
  o.indexer_key_bytes = 100;  // 5 keys per page: 200 pages of keys per request
  const int64_t page = 4 * 100 * 5;
  // C = 8: blocks of 2 pages; state 4 x 17 x 4 B + 2 page list entries per block.
  const int64_t state = 3 * (4 * 17 * 4 + 2 * 4);
  o.device_budget_bytes = 3 * (2 + 200) * page + state - 1;
  auto shape = ChooseHotCacheShape(o);
  EXPECT_EQ(shape.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(shape.status().message().find("and their indexer keys"), std::string::npos)
      << shape.status().message();
  o.device_budget_bytes += 1;
  shape = ChooseHotCacheShape(o);
  ASSERT_TRUE(shape.ok()) << shape.status().ToString();
  EXPECT_EQ(shape->hot_slots, 8);
  EXPECT_EQ(shape->pages, 3 * 202);
}

TEST(ChooseHotCacheShapeTest, ABudgetTooSmallIsRefused) {
  CacheOptions o = BudgetOptions();
  o.device_budget_bytes = 3 * (432 * 8 + 820) - 1;  // not three blocks of top_k = 8 slots
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

// DeepSeek-V4's layer kinds: offloaded layers 0 and 2 (strides 24 and 32), a resident layer 1
// and a window-only layer 3, whose entries the manager keeps outside the hot cache; each layer
// its own index group.
CacheOptions MixedKindsOptions() {
  CacheOptions o;
  o.geometry.layers = {LayerShape{24, 24}, LayerShape{16, 16}, LayerShape{24, 32},
                       LayerShape{40, 40}};
  o.geometry.layers[1].kind = LayerKind::kResident;
  o.geometry.layers[1].entry_tokens = 128;
  o.geometry.layers[3].kind = LayerKind::kWindowOnly;
  o.raw_window = 8;
  o.eviction = EvictionPolicy::kClock;
  o.top_k = 4;
  o.window = 2;
  o.max_requests = 3;
  o.max_context = 100;
  o.hot_slots = 0;
  return o;
}

// `o` as it was sized before its layers had kinds: every layer offloaded.
CacheOptions EveryLayerOffloaded(CacheOptions o) {
  for (LayerShape& l : o.geometry.layers) {
    l.kind = LayerKind::kOffloaded;
    l.entry_tokens = 1;
  }
  o.raw_window = 0;
  return o;
}

TEST(HotCacheLayerKindsTest, OnlyOffloadedLayersHaveRowsAndState) {
  auto backend = std::make_shared<testing::CountingBackend>();
  const CacheOptions o = MixedKindsOptions();
  const IndexGroups groups(o);
  ASSERT_EQ(groups.count(), 4);
  ASSERT_EQ(o.offloaded_index_groups(), 2);
  auto cache = HotCache::Create(o.geometry, 6, 2, /*max_blocks=*/3, /*pages=*/6, /*page_rows=*/4,
                                backend.get(), groups, ReplacementOf(o));
  ASSERT_TRUE(cache.ok()) << cache.status().ToString();
  HotCache& c = **cache;
  EXPECT_EQ(c.states(), 2);
  EXPECT_NE(c.layer_data(0), nullptr);
  EXPECT_EQ(c.layer_data(1), nullptr);
  EXPECT_NE(c.layer_data(2), nullptr);
  EXPECT_EQ(c.layer_data(3), nullptr);
  for (int32_t l : {1, 3}) {
    EXPECT_EQ(c.slot_token(l), nullptr);
    EXPECT_EQ(c.clock_uses(l), nullptr);
    EXPECT_EQ(c.clock_hand(l), nullptr);
    EXPECT_EQ(c.position_slot(l), nullptr);
  }
  EXPECT_EQ(c.slot_token(2), c.slot_token(0) + 3 * 6);  // the second state
  // 24 rows of 24 + 32 B, the two offloaded groups' state of 3 blocks, 3 page lists of 2 pages.
  const int64_t state = 3 * HotCache::StateBytesOf(2, 6, ReplacementOf(o));
  EXPECT_EQ(c.device_bytes(), 24 * (24 + 32) + state + 3 * 2 * 4);
  EXPECT_EQ(c.device_bytes(), backend->live_device_bytes());
  EXPECT_EQ(HotCache::BlockBytes(o.geometry, 6, 2, 1, ReplacementOf(o)),
            8 * (24 + 32) + HotCache::StateBytesOf(2, 6, ReplacementOf(o)));

  // A block's state is written in the offloaded groups only: every slot empty.
  auto block = c.Acquire(nullptr);
  ASSERT_TRUE(block.ok()) << block.status().ToString();
  ASSERT_TRUE(backend->Synchronize(nullptr).ok());
  for (int32_t l : {0, 2}) {
    EXPECT_EQ(Read(c.slot_token(l) + *block * 6, 6), std::vector<int32_t>(6, -1));
  }

  // The same layers all offloaded (as before they had kinds): 16 + 40 B more per row and a state
  // per layer.
  const CacheOptions every = EveryLayerOffloaded(o);
  auto all = HotCache::Create(every.geometry, 6, 2, 3, 6, 4, backend.get(), IndexGroups(every),
                              ReplacementOf(every));
  ASSERT_TRUE(all.ok()) << all.status().ToString();
  EXPECT_EQ((*all)->device_bytes() - c.device_bytes(),
            24 * (16 + 40) + 3 * HotCache::StateBytesOf(2, 6, ReplacementOf(o)));
}

TEST(ChooseHotCacheShapeTest, IndexerKeysArePagedByTheOffloadedLayersStride) {
  // Layer 0 resident with its own stride: the keys fill pages of the offloaded layers' rows.
  CacheOptions o = MixedKindsOptions();
  o.geometry.layers = {LayerShape{40, 40}, LayerShape{24, 32}, LayerShape{32, 32}};
  o.geometry.layers[0].kind = LayerKind::kResident;
  o.geometry.layers[0].entry_tokens = 128;
  o.geometry.layers[0].indexer_keys = false;
  o.hot_slots = 6;
  o.resident_page_rows = 4;
  o.indexer_key_bytes = 16;
  o.host_capacity_tokens = 1024;
  ASSERT_TRUE(ValidateOptions(o).ok()) << ValidateOptions(o).ToString();
  auto shape = ChooseHotCacheShape(o);
  ASSERT_TRUE(shape.ok()) << shape.status().ToString();
  // 4 rows x 32 B / 16 B = 8 keys a page (layer 0's 40 B stride would make it 10).
  EXPECT_EQ(shape->keys_per_page, 8);
  // Blocks of ceil(8 / 4) = 2 pages, and each request's keys of 100 positions in 13 pages.
  EXPECT_EQ(shape->pages, 3 * (2 + 13));
}

TEST(ChooseHotCacheShapeTest, TheBudgetBuysSlotsOfTheOffloadedLayersOnly) {
  CacheOptions o = MixedKindsOptions();
  o.device_budget_bytes = 40000;
  const HotCacheReplacement clock = ReplacementOf(o);
  // A block of C slots is one page of C + 2 rows of the offloaded layers, the offloaded groups'
  // states and its page list entry; the largest C of which max_requests blocks fit is chosen.
  const auto largest_c = [&](int64_t row_bytes, int32_t states) {
    int32_t c = 0;
    while (o.max_requests * ((c + 1 + o.window) * row_bytes +
                             HotCache::StateBytesOf(states, c + 1, clock) + 4) <=
           o.device_budget_bytes) {
      ++c;
    }
    return c;
  };
  const int32_t now = largest_c(24 + 32, 2);
  const int32_t before = largest_c(24 + 16 + 32 + 40, 4);
  auto shape = ChooseHotCacheShape(o);
  ASSERT_TRUE(shape.ok()) << shape.status().ToString();
  EXPECT_EQ(shape->hot_slots, now);
  EXPECT_EQ(shape->pages, 3);
  auto every = ChooseHotCacheShape(EveryLayerOffloaded(o));
  ASSERT_TRUE(every.ok()) << every.status().ToString();
  EXPECT_EQ(every->hot_slots, before);
  EXPECT_GT(now, before);

  // Given slots and paged memory: the blocks' state, then pages of R rows of the offloaded layers.
  o.hot_slots = 6;
  o.hybrid_residency = true;
  o.resident_page_rows = 4;
  shape = ChooseHotCacheShape(o);
  ASSERT_TRUE(shape.ok()) << shape.status().ToString();
  const int64_t state = 3 * (HotCache::StateBytesOf(2, 6, clock) + 2 * 4);
  EXPECT_EQ(shape->pages, (o.device_budget_bytes - state) / (4 * (24 + 32)));
  const CacheOptions all = EveryLayerOffloaded(o);
  every = ChooseHotCacheShape(all);
  ASSERT_TRUE(every.ok()) << every.status().ToString();
  EXPECT_EQ(every->pages,
            (o.device_budget_bytes - 3 * (HotCache::StateBytesOf(4, 6, clock) + 2 * 4)) /
                (4 * (24 + 16 + 32 + 40)));
  EXPECT_GT(shape->pages, every->pages);
}

}  // namespace
}  // namespace sparsekv
