// The semantics of the prefetch predictor (sparsekv/prefetch.h) on its CPU reference.
#include "sparsekv/prefetch.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <set>
#include <vector>

namespace sparsekv {
namespace {

struct Rows {
  std::vector<BatchEntry> batch;
  std::vector<int32_t> topk;  // [rows, top_k]
  std::vector<uint8_t> fill;  // [rows, top_k]
};

std::vector<int32_t> Predict(const Rows& in, int32_t top_k, int32_t window, int32_t budget,
                             int32_t batch_size) {
  std::vector<int32_t> out(in.batch.size() * budget, -7);
  const PrefetchView view{&batch_size,    in.batch.data(), in.topk.data(), top_k,     top_k,
                          in.fill.data(), window,          budget,         out.data()};
  PredictPrefetchReference(view);
  return out;
}

std::vector<int32_t> PredictOne(std::vector<int32_t> row, std::vector<uint8_t> fill,
                                int32_t seq_len, int32_t window, int32_t budget) {
  const int32_t top_k = static_cast<int32_t>(row.size());
  return Predict({{{0, seq_len, 0}}, row, fill}, top_k, window, budget, 1);
}

TEST(PrefetchReferenceTest, WindowExitThenNeighboursOfMissesByDistance) {
  // Valid entries 10, 50, 11, 30; misses 10 and 50 (200 is out of range, -1 is padding).
  const std::vector<int32_t> row = {10, 50, 11, -1, 200, 30};
  const std::vector<uint8_t> fill = {1, 1, 0, 1, 1, 0};
  // 99 leaves the window; 11 is an entry of the row, so not a candidate.
  EXPECT_EQ(PredictOne(row, fill, 100, 1, 6), (std::vector<int32_t>{99, 9, 51, 49, 12, 8}));
  EXPECT_EQ(PredictOne(row, fill, 100, 1, 10),
            (std::vector<int32_t>{99, 9, 51, 49, 12, 8, 52, 48, -1, -1}));
  EXPECT_EQ(PredictOne(row, fill, 100, 1, 1), (std::vector<int32_t>{99}));
}

TEST(PrefetchReferenceTest, StaysInRangeAndBelowTheNextWindow) {
  // W = 3, seq_len 20: 17 leaves the window, the next step's window is [18, 21); limit 18.
  // Miss 0: 1 (an entry), -1, 2, -2 -> only 2. Miss 16: 17 (taken), 15, 18 (>= limit), 14.
  const std::vector<int32_t> row = {0, 16, 1, 19};
  const std::vector<uint8_t> fill = {1, 1, 0, 0};
  EXPECT_EQ(PredictOne(row, fill, 20, 3, 8), (std::vector<int32_t>{17, 15, 2, 14, -1, -1, -1, -1}));
  // No window: nothing leaves it, and positions up to seq_len - 1 are candidates.
  EXPECT_EQ(PredictOne({5}, {1}, 7, 0, 4), (std::vector<int32_t>{6, 4, 3, -1}));
  // A history shorter than the window: nothing can be predicted.
  EXPECT_EQ(PredictOne({0, 1}, {1, 1}, 2, 4, 2), (std::vector<int32_t>{-1, -1}));
}

TEST(PrefetchReferenceTest, AMissFlaggedTwiceCountsOnceAtItsFirstFlag) {
  // 40 repeats at k = 2 (flagged: share_duplicates), 60 is flagged only at its repeat (k = 3).
  const std::vector<int32_t> row = {40, 60, 40, 60};
  const std::vector<uint8_t> fill = {1, 0, 1, 1};
  EXPECT_EQ(PredictOne(row, fill, 100, 1, 9),
            (std::vector<int32_t>{99, 41, 39, 61, 59, 42, 38, 62, 58}));
  // Adjacent misses make the same candidate twice in one round (11 = 10 + 1 = 12 - 1).
  EXPECT_EQ(PredictOne({10, 12}, {1, 1}, 100, 1, 7),
            (std::vector<int32_t>{99, 11, 9, 13, 8, 14, -1}));
}

TEST(PrefetchReferenceTest, UnusedRowsAreEmptyAndRowsPastTheBatchUntouched) {
  Rows in{{{0, 100, 0}, {-1, 100, 1}, {2, 100, 2}}, {10, 20, 10, 20, 10, 20}, {1, 0, 1, 0, 1, 0}};
  const std::vector<int32_t> out = Predict(in, 2, 1, 3, 2);
  EXPECT_EQ(out, (std::vector<int32_t>{99, 11, 9, -1, -1, -1, -7, -7, -7}));
}

// Random rows with padding, duplicates and out-of-range entries: every output row is a prefix of
// distinct positions in [0, limit), none of them an entry of the row below exit_begin except the
// exit position, followed by -1.
TEST(PrefetchReferenceTest, RandomRowsKeepTheContract) {
  std::mt19937 rng(5);
  for (int trial = 0; trial < 200; ++trial) {
    const int32_t top_k = 1 + static_cast<int32_t>(rng() % 64);
    const int32_t seq_len = static_cast<int32_t>(rng() % 200);
    const int32_t window = static_cast<int32_t>(rng() % 4);
    const int32_t budget = 1 + static_cast<int32_t>(rng() % 40);
    std::vector<int32_t> row(top_k);
    std::vector<uint8_t> fill(top_k);
    for (int32_t k = 0; k < top_k; ++k) {
      row[k] = static_cast<int32_t>(rng() % (seq_len + 8)) - 2;
      fill[k] = static_cast<uint8_t>(rng() % 3);
    }
    const std::vector<int32_t> out = PredictOne(row, fill, seq_len, window, budget);
    const int32_t exit_begin = std::max(0, seq_len - window);
    const int32_t limit = std::clamp(seq_len + 1 - window, 0, seq_len);
    std::set<int32_t> seen;
    bool ended = false;
    for (int32_t p : out) {
      if (p == -1) {
        ended = true;
        continue;
      }
      ASSERT_FALSE(ended) << "a prediction after -1";
      ASSERT_GE(p, 0);
      ASSERT_LT(p, limit);
      ASSERT_TRUE(seen.insert(p).second) << "repeated " << p;
      if (p < exit_begin) {
        ASSERT_EQ(std::count(row.begin(), row.end(), p), 0) << p << " is in the row";
      }
    }
  }
}

}  // namespace
}  // namespace sparsekv
