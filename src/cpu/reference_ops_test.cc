// The reference operators' own semantics, checked on hand-built cases.
#include "cpu/reference_ops.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "sparsekv/backend.h"

namespace sparsekv {
namespace {

TEST(ReferenceIndexCopyTest, CopiesValidEntriesAndCountsInvalidOnes) {
  constexpr int kRow = 3;  // odd row size, strides larger than the row
  std::vector<std::byte> src(5 * 4), dst(4 * 5, std::byte{0xAA});
  for (size_t i = 0; i < src.size(); ++i) src[i] = std::byte(i);
  const std::vector<int32_t> src_index = {4, -1, 0, 2, 7};
  const std::vector<int32_t> dst_index = {0, 1, 3, 9, 2};
  const int32_t count = 5;
  unsigned long long invalid = 0;
  IndexCopyView v{src.data(), dst.data(), src_index.data(), dst_index.data(), &count, 5, kRow, 4, 5,
                  5,          4,          &invalid,         /*max_blocks=*/0};
  reference::IndexCopy(v);
  EXPECT_EQ(invalid, 3u);                                            // src -1, dst 9, src 7
  EXPECT_EQ(std::memcmp(dst.data(), src.data() + 16, kRow), 0);      // row 0 <- row 4
  EXPECT_EQ(std::memcmp(dst.data() + 15, src.data() + 0, kRow), 0);  // row 3 <- row 0
  EXPECT_EQ(dst[3], std::byte{0xAA});  // bytes past row_bytes untouched
  EXPECT_EQ(dst[5], std::byte{0xAA});  // row 1 untouched (invalid source)
}

TEST(ReferenceIndexCopyTest, CountIsClampedToCapacity) {
  std::vector<std::byte> src(8, std::byte{1}), dst(8, std::byte{0});
  const std::vector<int32_t> index = {0, 1};
  const int32_t count = 100;
  IndexCopyView v{src.data(), dst.data(), index.data(), index.data(),    &count, 2, 4, 4, 4,
                  2,          2,          nullptr,      /*max_blocks=*/0};
  reference::IndexCopy(v);
  EXPECT_EQ(dst, src);
}

// A step's append with indexer keys: rows of 24 B into slots of a layer of 32-B rows, and keys of
// 12 B into 4-byte words of the same layer's key pages, both from one list of batch rows (a
// count below the capacity, an invalid batch row and an invalid key word among them). The pair
// writes exactly what the two copies write, in either order, and counts the same invalid entries.
TEST(ReferenceIndexCopyTest, APairIsItsTwoCopies) {
  constexpr int32_t kBatch = 6, kRowBytes = 24, kStride = 32, kKeyBytes = 12, kLayerRows = 40;
  std::mt19937_64 rng(11);
  std::vector<std::byte> rows(kBatch * kStride), keys(kBatch * kKeyBytes);
  for (auto& b : rows) b = std::byte(rng());
  for (auto& b : keys) b = std::byte(rng());
  // Batch rows (one past the batch: invalid), their slots in rows [0, 20), their key words in
  // rows [20, 40) (a key page), one word past the layer.
  const std::vector<int32_t> src = {3, 0, 5, 9, 1, 2};
  const std::vector<int32_t> slot = {7, 2, 19, 4, 11, 0};
  const int32_t words = kLayerRows * kStride / 4;
  const std::vector<int32_t> word = {20 * 8 + 3, 21 * 8, 25 * 8 + 5, 30 * 8, words, 22 * 8 + 1};
  const int32_t count = 5;  // the last entry is not read
  const auto run = [&](bool pair, bool keys_first, unsigned long long* invalid_rows,
                       unsigned long long* invalid_keys) {
    std::vector<std::byte> layer(kLayerRows * kStride, std::byte{0x5C});
    IndexCopyView to_slots{rows.data(), layer.data(), src.data(), slot.data(), &count,
                           kBatch,      kRowBytes,    kStride,    kStride,     kBatch,
                           kLayerRows,  invalid_rows, 0};
    IndexCopyView to_keys{keys.data(),
                          layer.data(),
                          src.data(),
                          word.data(),
                          &count,
                          kBatch,
                          kKeyBytes,
                          kKeyBytes,
                          4,
                          kBatch,
                          (kLayerRows * kStride - kKeyBytes) / 4 + 1,
                          invalid_keys,
                          0};
    if (pair) {
      EXPECT_TRUE(CreateCpuBackend()->IndexCopyPair({to_slots, to_keys}, nullptr).ok());
    } else if (keys_first) {
      reference::IndexCopy(to_keys);
      reference::IndexCopy(to_slots);
    } else {
      reference::IndexCopy(to_slots);
      reference::IndexCopy(to_keys);
    }
    return layer;
  };
  unsigned long long pair_rows = 1, pair_keys = 2;
  const std::vector<std::byte> fused = run(true, false, &pair_rows, &pair_keys);
  for (bool keys_first : {false, true}) {
    unsigned long long rows_invalid = 1, keys_invalid = 2;
    EXPECT_EQ(run(false, keys_first, &rows_invalid, &keys_invalid), fused);
    EXPECT_EQ(rows_invalid, pair_rows);
    EXPECT_EQ(keys_invalid, pair_keys);
  }
  EXPECT_EQ(pair_rows, 2u);  // batch row 9
  EXPECT_EQ(pair_keys, 4u);  // batch row 9 and the word past the layer
  EXPECT_EQ(std::memcmp(fused.data() + 7 * kStride, rows.data() + 3 * kStride, kRowBytes), 0);
  EXPECT_EQ(std::memcmp(fused.data() + (21 * 8) * 4, keys.data(), kKeyBytes), 0);
  EXPECT_EQ(fused[0 * kStride], std::byte{0x5C});  // entry 5 (past the count) not copied
}

// One request, C = 4 LRU slots, W = 1, K = 3; positions are their own host rows.
class ReferenceResolveTest : public ::testing::Test {
 protected:
  void SetUp() override {
    slot_token_.assign(kC, -1);
    lru_.resize(kC);
    std::iota(lru_.begin(), lru_.end(), 0);
    page_table_ = {0, 1, 2, 3};  // page i -> host page i; 16-token pages
  }
  std::vector<int32_t> Run(std::vector<int32_t> topk, int32_t seq_len) {
    const int32_t batch_size = 1;
    BatchEntry entry{0, seq_len, 0};
    std::vector<int32_t> out(kK, 12345);
    miss_rows_.assign(kK, -7);
    miss_slots_.assign(kK, -7);
    miss_count_ = 0;
    ResolveView v{};
    v.batch_size = &batch_size;
    v.batch = &entry;
    v.topk = topk.data();
    v.top_k = kK;
    v.topk_stride = kK;
    v.slots_out = out.data();
    v.slot_token = slot_token_.data();
    v.lru_order = lru_.data();
    if (protected_capacity_ >= 0) {
      v.lru_protected = &lru_protected_;
      v.protected_capacity = protected_capacity_;
    }
    if (clock_) {
      v.lru_order = nullptr;
      v.clock_uses = uses_.data();
      v.clock_hand = &hand_;
      v.position_slot = position_slot_.data();
      v.positions = kPositions;
    }
    v.hot_slots = kC;
    v.window = 1;
    v.page_table = page_table_.data();
    v.pages_per_request = 4;
    v.page_tokens = 16;
    v.miss_host_row = miss_rows_.data();
    v.miss_slot = miss_slots_.data();
    v.miss_count = &miss_count_;
    v.miss_capacity = kK;
    v.counters = &counters_;
    v.share_duplicates = share_duplicates_;
    fill_.assign(kK, 0xEE);
    v.fill_mask = fill_.data();
    if (fused_) {
      v.copy_src = pool_.data();
      v.copy_dst = hot_.data();
      v.copy_row_bytes = kRowBytes;
      v.copy_src_stride = kPoolStride;
      v.copy_dst_stride = kHotStride;
      v.copy_src_rows = kPoolRows;
      v.copy_dst_rows = kC + 1;
      v.copy_invalid = &copy_invalid_;
      v.fused_copy_min_batch = fused_min_batch_;
    }
    if (!marks_.empty()) {
      v.prefetch_mark = marks_.data();
      v.prefetch_fills = prefetch_fills_;
      v.count_prefetch_misses = count_prefetch_misses_ ? &kPrefetched : nullptr;
    }
    reference::Resolve(v);
    return out;
  }
  // A prefetch's resolve of `topk` (its fills set the marks), then the next resolves are a step's.
  std::vector<int32_t> Prefetch(std::vector<int32_t> topk, int32_t seq_len) {
    prefetch_fills_ = true;
    std::vector<int32_t> out = Run(std::move(topk), seq_len);
    prefetch_fills_ = false;
    return out;
  }
  // A fused copy from pool_ (kPoolRows rows; row r's bytes are r + 1, r + 2, r + 3, then 0xBB)
  // into hot_ (its C + W rows start as 0xCC).
  void EnableFusedCopy(int32_t min_batch) {
    fused_ = true;
    fused_min_batch_ = min_batch;
    pool_.assign(kPoolRows * kPoolStride, std::byte{0xBB});
    for (int32_t r = 0; r < kPoolRows; ++r) {
      for (int32_t i = 0; i < kRowBytes; ++i) pool_[r * kPoolStride + i] = std::byte(r + 1 + i);
    }
    hot_.assign((kC + 1) * kHotStride, std::byte{0xCC});
  }
  // Whether hot row `slot` holds pool row `host_row` (and its padding is untouched).
  bool HotRowHolds(int32_t slot, int32_t host_row) const {
    return std::memcmp(hot_.data() + slot * kHotStride, pool_.data() + host_row * kPoolStride,
                       kRowBytes) == 0 &&
           hot_[slot * kHotStride + kRowBytes] == std::byte{0xCC};
  }
  bool HotRowUntouched(int32_t slot) const {
    return std::all_of(hot_.begin() + slot * kHotStride, hot_.begin() + (slot + 1) * kHotStride,
                       [](std::byte b) { return b == std::byte{0xCC}; });
  }
  // The clock's state (EnableClock), over kPositions positions.
  void EnableClock() {
    clock_ = true;
    uses_.assign(kC, 0);
    position_slot_.assign(kPositions, -1);
  }
  // The position map agrees with slot_token: position p is in slot s iff position_slot[p] = s.
  bool MapMatchesSlots() const {
    for (int32_t p = 0; p < kPositions; ++p) {
      const int32_t s = position_slot_[p];
      if (s >= 0 && slot_token_[s] != p) return false;
    }
    for (int32_t s = 0; s < kC; ++s) {
      if (slot_token_[s] >= 0 && position_slot_[slot_token_[s]] != s) return false;
    }
    return true;
  }
  static constexpr int32_t kC = 4, kK = 3, kPositions = 64;
  bool clock_ = false;
  std::vector<uint8_t> uses_;
  int32_t hand_ = 0;
  std::vector<int32_t> position_slot_;
  std::vector<int32_t> slot_token_, lru_, page_table_, miss_rows_, miss_slots_;
  int32_t miss_count_ = 0;
  ResolveCounters counters_{};
  bool share_duplicates_ = false;
  int32_t protected_capacity_ = -1;  // >= 0: segmented LRU
  int32_t lru_protected_ = 0;
  std::vector<uint8_t> fill_;
  // The fused miss copy (EnableFusedCopy): 3-byte rows, pool stride 4, hot stride 5.
  static constexpr int32_t kRowBytes = 3, kPoolStride = 4, kHotStride = 5, kPoolRows = 48;
  bool fused_ = false;
  int32_t fused_min_batch_ = 0;
  std::vector<std::byte> pool_, hot_;
  unsigned long long copy_invalid_ = 0;
  // A prefetched row hit, one evicted unused, one miss the prefetch did not bring; every policy
  // picks the same slots here, and counts the same.
  void ExpectPrefetchOutcome() {
    marks_.assign(kC, 0);
    // The prefetch brings 10 and 20 into slots 0 and 1.
    EXPECT_EQ(Prefetch({10, 20, -1}, 40), (std::vector<int32_t>{0, 1, kNullSlot}));
    EXPECT_EQ(marks_, (std::vector<uint8_t>{1, 1, 0, 0}));
    const ResolveCounters& n = counters_;
    EXPECT_EQ(n.prefetch_useful + n.prefetch_wasted + n.prefetch_missed, 0u);
    // The step's resolve after it: 10 hits its prefetched slot (useful), 30 misses (missed).
    count_prefetch_misses_ = true;
    EXPECT_EQ(Run({10, 30, -1}, 40), (std::vector<int32_t>{0, 2, kNullSlot}));
    EXPECT_EQ(n.prefetch_useful, 1u);
    EXPECT_EQ(n.prefetch_missed, 1u);
    EXPECT_EQ(marks_, (std::vector<uint8_t>{0, 1, 0, 0}));
    // A resolve that follows no prefetch does not count its misses as missed. 10 hits again: its
    // row was used once, it counts once.
    count_prefetch_misses_ = false;
    Run({10, -1, -1}, 40);
    EXPECT_EQ(n.prefetch_useful, 1u);
    // Three misses take slots 3, 1 and 2: slot 1 (20, prefetched, never hit) is wasted.
    EXPECT_EQ(Run({41, 42, 43}, 50), (std::vector<int32_t>{3, 1, 2}));
    EXPECT_EQ(n.prefetch_wasted, 1u);
    EXPECT_EQ(n.prefetch_missed, 1u);
    EXPECT_EQ(n.prefetch_useful, 1u);
    EXPECT_EQ(marks_, (std::vector<uint8_t>{0, 0, 0, 0}));
  }

  // Prefetch accounting: not empty, kC marks of the block.
  std::vector<uint8_t> marks_;
  bool prefetch_fills_ = false;
  bool count_prefetch_misses_ = false;  // the launch's byte: kPrefetched, else none
  static constexpr uint8_t kPrefetched = 1;
};

TEST_F(ReferenceResolveTest, MissesFillLeastRecentlyUsedSlotsInOrder) {
  EXPECT_EQ(Run({10, 20, 30}, 40), (std::vector<int32_t>{0, 1, 2}));
  EXPECT_EQ(miss_count_, 3);
  EXPECT_EQ(counters_.misses, 3u);
  EXPECT_EQ(miss_rows_[1], 20);
  EXPECT_EQ(slot_token_, (std::vector<int32_t>{10, 20, 30, -1}));
  EXPECT_EQ(lru_, (std::vector<int32_t>{3, 0, 1, 2}));
}

TEST_F(ReferenceResolveTest, HitsAreNeverEvictedAndLruOrderFollowsUse) {
  Run({10, 20, 30}, 40);             // order now 3,0,1,2 (slot 3 empty)
  auto out = Run({30, 11, 12}, 40);  // 30 hits slot 2; misses take slots 3 then 0
  EXPECT_EQ(out, (std::vector<int32_t>{2, 3, 0}));
  EXPECT_EQ(counters_.hits, 1u);
  // Untouched (slot 1) first, then touched slots in their previous order: 3, 0, 2.
  EXPECT_EQ(lru_, (std::vector<int32_t>{1, 3, 0, 2}));
  out = Run({40, 30, 50}, 60);  // slot 1 (20) is the least recently used
  EXPECT_EQ(out, (std::vector<int32_t>{1, 2, 3}));
}

TEST_F(ReferenceResolveTest, SegmentedLruEvictsProbationarySlotsFirst) {
  protected_capacity_ = 2;
  Run({10, 20, 30}, 40);  // fills slots 0, 1, 2: order 3,0,1,2, nothing protected
  EXPECT_EQ(lru_protected_, 0);
  Run({10, 20, -1}, 40);  // 10 and 20 hit again: protected
  EXPECT_EQ(lru_, (std::vector<int32_t>{3, 2, 0, 1}));
  EXPECT_EQ(lru_protected_, 2);
  Run({40, -1, -1}, 50);  // fills the empty slot 3, which enters the probationary part
  EXPECT_EQ(lru_, (std::vector<int32_t>{2, 3, 0, 1}));
  // Two misses take the probationary slots 2 (30) and 3 (40); LRU would have evicted 10.
  EXPECT_EQ(Run({50, 60, -1}, 64), (std::vector<int32_t>{2, 3, kNullSlot}));
  EXPECT_EQ(slot_token_, (std::vector<int32_t>{10, 20, 50, 60}));
  EXPECT_EQ(lru_, (std::vector<int32_t>{2, 3, 0, 1}));
  EXPECT_EQ(lru_protected_, 2);
  // Untouched probationary, filled, untouched protected, hit.
  EXPECT_EQ(Run({10, 45, -1}, 64), (std::vector<int32_t>{0, 2, kNullSlot}));
  EXPECT_EQ(lru_, (std::vector<int32_t>{3, 2, 1, 0}));
  EXPECT_EQ(lru_protected_, 2);
}

TEST_F(ReferenceResolveTest, ClockFillsSlotsFromTheHandAndFindsHitsInThePositionMap) {
  EnableClock();
  EXPECT_EQ(Run({10, 20, 30}, 40), (std::vector<int32_t>{0, 1, 2}));
  EXPECT_EQ(hand_, 3);
  EXPECT_EQ(slot_token_, (std::vector<int32_t>{10, 20, 30, -1}));
  EXPECT_EQ(uses_, (std::vector<uint8_t>{0, 0, 0, 0}));  // a fill starts unused
  EXPECT_TRUE(MapMatchesSlots());
  // 20 hits slot 1 (its count rises to 1); the misses take slot 3 (empty) and, wrapping, slot 0.
  EXPECT_EQ(Run({20, 11, 12}, 40), (std::vector<int32_t>{1, 3, 0}));
  EXPECT_EQ(counters_.hits, 1u);
  EXPECT_EQ(hand_, 1);
  EXPECT_EQ(uses_, (std::vector<uint8_t>{0, 1, 0, 0}));
  EXPECT_EQ(slot_token_, (std::vector<int32_t>{12, 20, 30, 11}));
  EXPECT_EQ(position_slot_[10], -1);  // evicted
  EXPECT_TRUE(MapMatchesSlots());
  // From the hand at 1: slot 1 (count 1) is passed and decremented, slot 2 (30) is the victim.
  EXPECT_EQ(Run({40, -1, -1}, 50), (std::vector<int32_t>{2, kNullSlot, kNullSlot}));
  EXPECT_EQ(uses_, (std::vector<uint8_t>{0, 0, 0, 0}));
  EXPECT_EQ(hand_, 3);
  EXPECT_TRUE(MapMatchesSlots());
}

TEST_F(ReferenceResolveTest, ClockPassesThisStepsHitsAndCapsTheUseCount) {
  EnableClock();
  Run({10, 20, 30}, 40);
  Run({10, -1, -1}, 40);
  Run({10, -1, -1}, 40);
  Run({10, -1, -1}, 40);
  Run({10, -1, -1}, 40);  // four hits: the count stops at kClockMaxUses
  EXPECT_EQ(uses_[0], kClockMaxUses);
  // Hand at 3 (empty slot): it takes slot 3, then passes slot 0 (hit in this step) and takes 1.
  EXPECT_EQ(Run({10, 41, 42}, 50), (std::vector<int32_t>{0, 3, 1}));
  EXPECT_EQ(uses_[0], kClockMaxUses);  // passed as a hit of this step: not decremented
  EXPECT_EQ(hand_, 2);
  EXPECT_TRUE(MapMatchesSlots());
}

TEST_F(ReferenceResolveTest, ClockTreatsPositionsPastItsMapAsOutOfRange) {
  EnableClock();
  EXPECT_EQ(Run({kPositions, 5, -1}, kPositions + 8),
            (std::vector<int32_t>{kNullSlot, 0, kNullSlot}));
  EXPECT_EQ(counters_.out_of_range, 1u);
  EXPECT_EQ(counters_.misses, 1u);
}

TEST_F(ReferenceResolveTest, PrefetchedRowsCountAsUsefulWastedOrMissedUnderLru) {
  ExpectPrefetchOutcome();
}

TEST_F(ReferenceResolveTest, PrefetchedRowsCountTheSameUnderSegmentedLru) {
  protected_capacity_ = 2;
  ExpectPrefetchOutcome();
}

TEST_F(ReferenceResolveTest, PrefetchedRowsCountTheSameUnderTheClock) {
  EnableClock();
  ExpectPrefetchOutcome();
}

TEST_F(ReferenceResolveTest, APrefetchKeepsMarksItHitsAndCountsTheOnesItEvicts) {
  marks_.assign(kC, 0);
  Prefetch({10, 20, 30}, 40);  // slots 0, 1, 2
  Prefetch({10, 11, 12}, 40);  // 10 hits (still unused); 11, 12 take slots 3 and 1 (20: wasted)
  EXPECT_EQ(counters_.prefetch_useful, 0u);
  EXPECT_EQ(counters_.prefetch_wasted, 1u);
  EXPECT_EQ(marks_, (std::vector<uint8_t>{1, 1, 1, 1}));
  // Only a step's resolve uses a row, and it counts no misses without count_prefetch_misses.
  Run({10, 12, 50}, 60);
  EXPECT_EQ(counters_.prefetch_useful, 2u);
  EXPECT_EQ(counters_.prefetch_missed, 0u);
}

TEST_F(ReferenceResolveTest, WithoutMarksNothingIsCountedForThePrefetch) {
  count_prefetch_misses_ = true;  // ignored without marks
  Prefetch({10, 20, -1}, 40);
  Run({10, 30, -1}, 40);
  Run({41, 42, 43}, 50);
  EXPECT_EQ(counters_.prefetch_useful + counters_.prefetch_wasted + counters_.prefetch_missed, 0u);
}

TEST_F(ReferenceResolveTest, WindowPaddingDuplicatesAndOutOfRange) {
  // seq_len 40, W 1: position 39 is the window slot C + 39 % 1 = 4.
  auto out = Run({39, -1, 39}, 40);
  EXPECT_EQ(out, (std::vector<int32_t>{4, -1, -1}));
  EXPECT_EQ(counters_.window_hits, 1u);
  EXPECT_EQ(counters_.padding, 1u);
  EXPECT_EQ(counters_.duplicates, 1u);
  out = Run({40, -5, 7}, 40);
  EXPECT_EQ(out, (std::vector<int32_t>{-1, -1, 0}));
  EXPECT_EQ(counters_.out_of_range, 2u);
  EXPECT_EQ(miss_rows_[0], 7);
}

TEST_F(ReferenceResolveTest, FillMaskMarksTheEntriesTheMissCopyFills) {
  Run({10, 20, 10}, 40);
  EXPECT_EQ(fill_, (std::vector<uint8_t>{1, 1, 0}));  // the repeat is skipped, not filled
  Run({10, 30, -1}, 40);                              // 10 hits, 30 misses
  EXPECT_EQ(fill_, (std::vector<uint8_t>{0, 1, 0}));
}

TEST_F(ReferenceResolveTest, SharedDuplicatesTakeTheFirstEntrysSlot) {
  share_duplicates_ = true;
  // Two query tokens' selections in one row: 10 twice (a miss), 39 twice (the window).
  auto out = Run({10, 10, 39}, 40);
  EXPECT_EQ(out, (std::vector<int32_t>{0, 0, 4}));
  EXPECT_EQ(fill_, (std::vector<uint8_t>{1, 1, 0}));
  EXPECT_EQ(miss_count_, 1);  // fetched once
  EXPECT_EQ(counters_.misses, 1u);
  EXPECT_EQ(counters_.duplicates, 1u);
  out = Run({39, 10, 39}, 40);  // a hit, and a repeated window position
  EXPECT_EQ(out, (std::vector<int32_t>{4, 0, 4}));
  EXPECT_EQ(fill_, (std::vector<uint8_t>{0, 0, 0}));
}

TEST_F(ReferenceResolveTest, HostRowComesFromThePageTable) {
  page_table_ = {3, 0, 2, 1};
  Run({17, 2, 33}, 40);  // page 1 -> host page 0; page 0 -> 3; page 2 -> 2
  EXPECT_EQ(miss_rows_[0], 0 * 16 + 1);
  EXPECT_EQ(miss_rows_[1], 3 * 16 + 2);
  EXPECT_EQ(miss_rows_[2], 2 * 16 + 1);
}

TEST_F(ReferenceResolveTest, FusedCopyFillsTheRowsAndAppendsNothing) {
  EnableFusedCopy(/*min_batch=*/1);
  page_table_ = {2, 0, 1, 9};  // page 0 -> host page 2, page 1 -> 0
  EXPECT_EQ(Run({17, 3, 39}, 40), (std::vector<int32_t>{0, 1, 4}));  // 39: the window
  EXPECT_EQ(miss_count_, 0);
  EXPECT_EQ(miss_rows_, std::vector<int32_t>(kK, -7));  // nothing appended
  EXPECT_EQ(miss_slots_, std::vector<int32_t>(kK, -7));
  EXPECT_EQ(counters_.misses, 2u);
  EXPECT_EQ(fill_, (std::vector<uint8_t>{1, 1, 0}));
  EXPECT_TRUE(HotRowHolds(0, 0 * 16 + 1));  // 17: page 1 -> host page 0
  EXPECT_TRUE(HotRowHolds(1, 2 * 16 + 3));  // 3: page 0 -> host page 2
  for (int32_t slot : {2, 3, 4}) EXPECT_TRUE(HotRowUntouched(slot)) << slot;
  EXPECT_EQ(copy_invalid_, 0u);
}

TEST_F(ReferenceResolveTest, FusedCopyBelowItsBatchThresholdAppendsAsBefore) {
  EnableFusedCopy(/*min_batch=*/2);  // the batch has one row
  EXPECT_EQ(Run({10, 20, 30}, 40), (std::vector<int32_t>{0, 1, 2}));
  EXPECT_EQ(miss_count_, 3);
  EXPECT_EQ(miss_rows_, (std::vector<int32_t>{10, 20, 30}));
  for (int32_t slot = 0; slot <= kC; ++slot) EXPECT_TRUE(HotRowUntouched(slot)) << slot;
}

TEST_F(ReferenceResolveTest, FusedCopyCountsAndSkipsRowsOutsideThePool) {
  EnableFusedCopy(/*min_batch=*/0);
  page_table_ = {0, 3, -1, 1};  // host page 3 ends past the pool's 48 rows; -1 is before it
  // 20 -> host row 3 * 16 + 4 = 52 (invalid); 33 -> -16 + 1 (invalid); 50 -> 16 + 2.
  EXPECT_EQ(Run({20, 33, 50}, 60), (std::vector<int32_t>{0, 1, 2}));
  EXPECT_EQ(copy_invalid_, 2u);
  EXPECT_TRUE(HotRowUntouched(0));
  EXPECT_TRUE(HotRowUntouched(1));
  EXPECT_TRUE(HotRowHolds(2, 16 + 2));
  EXPECT_EQ(miss_count_, 0);
  EXPECT_EQ(slot_token_, (std::vector<int32_t>{20, 33, 50, -1}));  // the slots are taken anyway
}

// Over random steps of a batch: a fused launch leaves exactly the state that the same launch
// without the fused copy, followed by an IndexCopy of its miss list, leaves.
TEST(ReferenceFusedCopyTest, EqualsResolveThenIndexCopy) {
  constexpr int32_t kBatch = 6, kTopK = 24, kC = 32, kW = 2, kPageTokens = 8, kPages = 40;
  constexpr int32_t kRowBytes = 6, kSrcStride = 8, kDstStride = 7;
  constexpr int32_t kSrcRows = kBatch * kPages * kPageTokens - 20;  // the last pages are cut off
  constexpr int32_t kDstRows = kBatch * (kC + kW);
  std::mt19937_64 rng(11);
  std::vector<BatchEntry> batch(kBatch);
  std::vector<int32_t> page_table(kBatch * kPages);
  std::iota(page_table.begin(), page_table.end(), 0);
  std::shuffle(page_table.begin(), page_table.end(), rng);
  page_table[5] = -1;  // an unmapped page: its rows are invalid copies
  for (int32_t b = 0; b < kBatch; ++b) batch[b] = {b, 200, b};
  batch[4].block = -1;  // an unused row
  std::vector<std::byte> src(kSrcRows * kSrcStride);
  for (auto& x : src) x = static_cast<std::byte>(rng());

  struct Side {
    std::vector<int32_t> slot_token = std::vector<int32_t>(kBatch * kC, -1);
    std::vector<int32_t> lru = std::vector<int32_t>(kBatch * kC);
    std::vector<std::byte> hot = std::vector<std::byte>(kDstRows * kDstStride, std::byte{0x5A});
    ResolveCounters counters{};
    unsigned long long invalid = 0;
  };
  Side plain, fused;
  for (Side* side : {&plain, &fused}) {
    for (int32_t b = 0; b < kBatch; ++b) {
      std::iota(side->lru.begin() + b * kC, side->lru.begin() + (b + 1) * kC, 0);
    }
  }
  for (int step = 0; step < 8; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    const int32_t batch_size = step == 3 ? 2 : kBatch;  // step 3: below the threshold
    std::vector<int32_t> topk(kBatch * kTopK);
    for (int32_t b = 0; b < kBatch; ++b) {
      batch[b].seq_len = std::min(batch[b].seq_len + 7, kPages * kPageTokens);
      for (int32_t k = 0; k < kTopK; ++k) {
        const uint64_t pick = rng() % 10;
        topk[b * kTopK + k] = pick == 0   ? kPaddingPosition
                              : pick == 1 ? batch[b].seq_len + 3
                                          : static_cast<int32_t>(rng() % batch[b].seq_len);
      }
    }
    const auto run = [&](Side& side, bool with_fused_copy, std::vector<int32_t>& out,
                         std::vector<uint8_t>& fill) {
      out.assign(kBatch * kTopK, 12345);
      fill.assign(kBatch * kTopK, 7);
      std::vector<int32_t> miss_row(kBatch * kTopK, -3), miss_slot(kBatch * kTopK, -3);
      int32_t miss_count = 0;
      ResolveView v{};
      v.batch_size = &batch_size;
      v.batch = batch.data();
      v.topk = topk.data();
      v.top_k = kTopK;
      v.topk_stride = kTopK;
      v.slots_out = out.data();
      v.slot_token = side.slot_token.data();
      v.lru_order = side.lru.data();
      v.hot_slots = kC;
      v.window = kW;
      v.page_table = page_table.data();
      v.pages_per_request = kPages;
      v.page_tokens = kPageTokens;
      v.miss_host_row = miss_row.data();
      v.miss_slot = miss_slot.data();
      v.miss_count = &miss_count;
      v.miss_capacity = kBatch * kTopK;
      v.counters = &side.counters;
      v.fill_mask = fill.data();
      v.sort_misses = true;
      v.share_duplicates = step % 2 == 1;
      if (with_fused_copy) {
        v.copy_src = src.data();
        v.copy_dst = side.hot.data();
        v.copy_row_bytes = kRowBytes;
        v.copy_src_stride = kSrcStride;
        v.copy_dst_stride = kDstStride;
        v.copy_src_rows = kSrcRows;
        v.copy_dst_rows = kDstRows;
        v.copy_invalid = &side.invalid;
        v.fused_copy_min_batch = 3;
      }
      reference::Resolve(v);
      if (with_fused_copy && batch_size >= 3) {
        EXPECT_EQ(miss_count, 0);
      }
      IndexCopyView copy{src.data(),      side.hot.data(), miss_row.data(), miss_slot.data(),
                         &miss_count,     kBatch * kTopK,  kRowBytes,       kSrcStride,
                         kDstStride,      kSrcRows,        kDstRows,        &side.invalid,
                         /*max_blocks=*/0};
      reference::IndexCopy(copy);
    };
    std::vector<int32_t> plain_out, fused_out;
    std::vector<uint8_t> plain_fill, fused_fill;
    run(plain, false, plain_out, plain_fill);
    run(fused, true, fused_out, fused_fill);
    EXPECT_EQ(fused_out, plain_out);
    EXPECT_EQ(fused_fill, plain_fill);
    EXPECT_EQ(fused.slot_token, plain.slot_token);
    EXPECT_EQ(fused.lru, plain.lru);
    EXPECT_TRUE(fused.hot == plain.hot);
    EXPECT_EQ(fused.invalid, plain.invalid);
    EXPECT_EQ(fused.counters.misses, plain.counters.misses);
    EXPECT_EQ(fused.counters.hits, plain.counters.hits);
  }
  EXPECT_GT(plain.invalid, 0u);  // the unmapped page and the cut-off pages were hit
  EXPECT_GT(plain.counters.misses, 100u);
}

TEST(ReferenceAssembleTest, GathersRowsAndZeroFillsSkippedEntries) {
  std::vector<std::byte> hot(3 * 4);
  for (size_t i = 0; i < hot.size(); ++i) hot[i] = std::byte(i + 1);
  const std::vector<int32_t> slots = {2, -1, 0, 9};
  std::vector<std::byte> out(4 * 4, std::byte{0xEE});
  const int32_t batch_size = 2;
  AssembleView v{&batch_size, hot.data(), 3, slots.data(), out.data(), 2, 3, 4};
  reference::Assemble(v);
  EXPECT_EQ(std::memcmp(out.data(), hot.data() + 8, 3), 0);
  EXPECT_EQ(out[4], std::byte{0});
  EXPECT_EQ(std::memcmp(out.data() + 8, hot.data(), 3), 0);
  EXPECT_EQ(out[12], std::byte{0});    // out-of-range slot: zero row
  EXPECT_EQ(out[3], std::byte{0xEE});  // stride padding untouched
}

// A resident row: positions map through the residency table, pages of R = 4 positions.
TEST(ReferenceResolveResidentTest, MapsPositionsAndSkipsAsAHotRowWould) {
  const int32_t batch_size = 2;
  // Row 0 is resident (residency row 1), row 1 unused: neither a block nor a residency row.
  const BatchEntry batch[2] = {BatchEntry{-1, 10, 0, 1}, BatchEntry{-1, 0, 0}};
  const std::vector<int32_t> table = {900, 901, 902,             // residency row 0 (unused here)
                                      40,  8,   100};            // row 1: pages at slots 40, 8, 100
  const std::vector<int32_t> topk = {9, -1, 3, 10, 4, 3, -2, 0,  // row 0
                                     1, 1,  1, 1,  1, 1, 1,  1};  // row 1 (unused)
  for (bool share : {false, true}) {
    std::vector<int32_t> out(16, 12345);
    std::vector<uint8_t> fill(16, 7);
    ResolveCounters counters{};
    int32_t miss_count = 0;
    ResolveView v{};
    v.batch_size = &batch_size;
    v.batch = batch;
    v.topk = topk.data();
    v.top_k = 8;
    v.topk_stride = 8;
    v.slots_out = out.data();
    v.counters = &counters;
    v.fill_mask = fill.data();
    v.miss_count = &miss_count;
    v.share_duplicates = share;
    v.resident_table = table.data();
    v.resident_pages = 3;
    v.resident_page_rows = 4;
    reference::Resolve(v);
    // 9 -> page 2 (slot 100) + 1; 3 -> page 0 (40) + 3; 4 -> page 1 (8) + 0; 0 -> 40.
    const std::vector<int32_t> expected = {101, -1, 43, -1, 8, share ? 43 : -1, -1, 40};
    EXPECT_EQ(std::vector<int32_t>(out.begin(), out.begin() + 8), expected);
    EXPECT_EQ(std::vector<int32_t>(out.begin() + 8, out.end()), std::vector<int32_t>(8, 12345));
    EXPECT_EQ(std::vector<uint8_t>(fill.begin(), fill.begin() + 8), std::vector<uint8_t>(8, 0));
    EXPECT_EQ(counters.resident_hits, 4u);
    EXPECT_EQ(counters.padding, 1u);
    EXPECT_EQ(counters.out_of_range, 2u);  // 10 (>= seq_len) and -2
    EXPECT_EQ(counters.duplicates, 1u);
    EXPECT_EQ(counters.hits + counters.window_hits + counters.misses, 0u);
    EXPECT_EQ(miss_count, 0);
  }
}

// Two table rows of two pages of 2 entries (row 1's second page null) and two rings of 4 rows
// (row 1's null); rows of 3 bytes at a stride of 4. Cadence 2.
TEST(ReferenceDenseAppendTest, WritesCompletedEntriesAndWindowSlotsAndCountsSkips) {
  constexpr int32_t kStride = 4, kRow = 3;
  std::vector<std::byte> pages(4 * 2 * kStride, std::byte{0xAA});
  std::vector<std::byte> ring(4 * kStride, std::byte{0xAA});
  std::vector<std::byte*> page_table = {pages.data(), pages.data() + 2 * kStride,
                                        pages.data() + 4 * kStride, nullptr};
  std::vector<std::byte*> ring_table = {ring.data(), nullptr};
  std::vector<std::byte> entry_rows(5 * kStride), window_rows(5 * kStride);
  for (size_t i = 0; i < entry_rows.size(); ++i) entry_rows[i] = std::byte(i);
  for (size_t i = 0; i < window_rows.size(); ++i) window_rows[i] = std::byte(100 + i);
  // Batch rows: 0 -> table row 0 at 6 tokens (completes entry 2: page 1, row 0; window slot 1);
  // 1 -> table row 1 at 6 tokens (entry 2 lies in the null page; the ring is null: two skips);
  // 2 -> unused; 3 -> table row 1 at 3 tokens (no entry; null ring: a skip); 4 past the batch.
  const int32_t batch_size = 4;
  const std::vector<int32_t> table_row = {0, 1, -1, 1, 0};
  const std::vector<int32_t> seq_len = {6, 6, 6, 3, 2};
  unsigned long long invalid = 0;
  DenseAppendView v{};
  v.batch_size = &batch_size;
  v.table_row = table_row.data();
  v.seq_len = seq_len.data();
  v.entry_rows = entry_rows.data();
  v.entry_stride = kStride;
  v.window_rows = window_rows.data();
  v.window_stride = kStride;
  v.pages = page_table.data();
  v.pages_per_row = 2;
  v.page_rows = 2;
  v.rings = ring_table.data();
  v.raw_window = 4;
  v.entry_tokens = 2;
  v.row_bytes = kRow;
  v.row_stride = kStride;
  v.invalid = &invalid;
  reference::DenseAppend(v, 5);
  EXPECT_EQ(invalid, 3u);
  std::vector<std::byte> want_pages(pages.size(), std::byte{0xAA});
  std::memcpy(want_pages.data() + 2 * kStride, entry_rows.data(), kRow);
  EXPECT_EQ(pages, want_pages);
  std::vector<std::byte> want_ring(ring.size(), std::byte{0xAA});
  std::memcpy(want_ring.data() + 1 * kStride, window_rows.data(), kRow);
  EXPECT_EQ(ring, want_ring);
  // Without entry rows only the windows are written; a step of 5 tokens completes no entry.
  const std::vector<int32_t> odd = {5, 6, 6, 3, 2};
  v.seq_len = odd.data();
  v.entry_rows = nullptr;
  invalid = 0;
  reference::DenseAppend(v, 5);
  EXPECT_EQ(invalid, 2u);  // the null rings of batch rows 1 and 3
  EXPECT_EQ(pages, want_pages);
  std::memcpy(want_ring.data() + 0 * kStride, window_rows.data(), kRow);
  EXPECT_EQ(ring, want_ring);
}

TEST(ReferenceDenseAppendTest, TheCpuBackendRefusesUnsupportedShapes) {
  const int32_t batch_size = 0;
  DenseAppendView v{};
  v.batch_size = &batch_size;
  v.entry_tokens = 1;
  v.page_rows = 2;
  v.row_bytes = 8;
  v.row_stride = 8;
  auto cpu = CreateCpuBackend();
  EXPECT_TRUE(cpu->DenseAppend(v, 4, nullptr).ok());
  v.row_stride = 4;  // < row_bytes
  EXPECT_EQ(cpu->DenseAppend(v, 4, nullptr).code(), StatusCode::kInvalidArgument);
  v.row_stride = 8;
  const std::byte row[8] = {};
  v.window_rows = row;  // a window without raw_window
  EXPECT_EQ(cpu->DenseAppend(v, 4, nullptr).code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace sparsekv
