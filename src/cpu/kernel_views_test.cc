// The semantics kernel_views.h defines as functions: the cadence rule.
#include "sparsekv/kernel_views.h"

#include <gtest/gtest.h>

#include <vector>

namespace sparsekv {
namespace {

TEST(CadenceTest, OneEntryPerTokenAtCadenceOne) {
  for (int32_t n = 1; n < 10; ++n) {
    EXPECT_EQ(EntriesAt(n, 1).count, n);
    EXPECT_EQ(EntriesAt(n, 1).completed, n - 1);
  }
  EXPECT_EQ(EntriesAt(0, 1).count, 0);
  EXPECT_EQ(EntriesAt(0, 1).completed, kNoEntry);
}

// Entry c covers tokens [4c, 4c + 4) and appears with token 4c + 3, at 4c + 4 tokens.
TEST(CadenceTest, EntryCompletesWithItsLastToken) {
  const std::vector<int32_t> completed = {kNoEntry, kNoEntry, kNoEntry, 0,       kNoEntry,
                                          kNoEntry, kNoEntry, 1,        kNoEntry};
  for (int32_t n = 1; n <= 9; ++n) {
    EXPECT_EQ(EntriesAt(n, 4).completed, completed[n - 1]) << n;
    EXPECT_EQ(EntriesAt(n, 4).count, n / 4) << n;
  }
}

// Every entry of a request that grows one token per step is completed exactly once, in order.
TEST(CadenceTest, EachEntryIsCompletedOnceInOrder) {
  for (int32_t r : {1, 4, 128}) {
    int32_t next = 0;
    for (int32_t n = 1; n <= 1000; ++n) {
      const LayerEntries e = EntriesAt(n, r);
      if (e.completed != kNoEntry) {
        EXPECT_EQ(e.completed, next++) << r << " " << n;
      }
      EXPECT_EQ(e.count, next) << r << " " << n;
    }
  }
}

// docs/deepseek-v4.md's worked example: DeepSeek-V4-Pro at 1,048,576 tokens.
TEST(CadenceTest, DeepSeekV4ProAtOneMillionTokens) {
  EXPECT_EQ(EntriesAt(1048575, 4).completed, kNoEntry);
  EXPECT_EQ(EntriesAt(1048575, 128).completed, kNoEntry);
  EXPECT_EQ(EntriesAt(1048576, 4).completed, 262143);
  EXPECT_EQ(EntriesAt(1048576, 128).completed, 8191);
  EXPECT_EQ(RawWindowSlot(1048576, 128), 127);
  EXPECT_EQ(EntriesAt(1048577, 4).completed, kNoEntry);
  EXPECT_EQ(RawWindowSlot(1048577, 128), 0);
}

// A resolve's copy chunks: chunk_rows rows of its own top-k, or the stride of the largest top-k
// where one list serves groups of several.
TEST(ResolveViewTest, ChunkEntriesFollowTheStrideWhereSet) {
  ResolveView v{};
  v.chunk_rows = 3;
  v.top_k = 5;
  EXPECT_EQ(v.chunk_entries(), 15);
  v.chunk_stride = 24;
  EXPECT_EQ(v.chunk_entries(), 24);
}

}  // namespace
}  // namespace sparsekv
