// full-hbm's DeepSeek-V4 scopes (entry_scopes.h) name, row for row and in the same order, what the
// manager's views name for the same requests: its contiguous buffers described as views of one
// page per request and one ring per request.
#include "tools/sparsekv/bench/entry_scopes.h"

#include <gtest/gtest.h>

#include <cstddef>
#include <vector>

namespace sparsekv::tools {
namespace {

constexpr int32_t kStride = 8;
constexpr int32_t kBatch = 3;

TEST(EntryScopesTest, EveryEntryScopeReadsWhatDenseEntriesViewReads) {
  const int32_t entry_rows = 40, r = 4;
  std::vector<std::byte> entries(size_t(kBatch) * entry_rows * kStride);
  std::vector<std::byte*> pages;  // one page of entry_rows entries per request
  for (int32_t b = 0; b < kBatch; ++b) pages.push_back(entries.data() + b * entry_rows * kStride);
  const int32_t batch = kBatch, table_row[kBatch] = {0, 1, 2}, seq_len[kBatch] = {3, 64, 159};
  const DenseEntriesView view{&batch, table_row, seq_len, pages.data(), 1, entry_rows, kStride, r};
  for (int32_t b = 0; b < kBatch; ++b) {
    for (int32_t k = 0; k < entry_rows; ++k) {
      const int32_t index = EveryEntryIndex(b, k, seq_len[b], r, entry_rows);
      if (k < view.Count(b)) {
        EXPECT_EQ(entries.data() + int64_t{index} * kStride, view.Entry(b, k)) << b << " " << k;
      } else {
        EXPECT_EQ(index, -1) << b << " " << k;
      }
    }
  }
}

TEST(EntryScopesTest, WindowScopeReadsWhatRawWindowViewReadsOldestFirst) {
  const int32_t w = 8;
  std::vector<std::byte> rings(size_t(kBatch) * w * kStride);
  std::vector<std::byte*> ring;
  for (int32_t b = 0; b < kBatch; ++b) ring.push_back(rings.data() + b * w * kStride);
  const int32_t batch = kBatch, table_row[kBatch] = {0, 1, 2}, seq_len[kBatch] = {5, 8, 29};
  const RawWindowView view{&batch, table_row, seq_len, ring.data(), w, kStride};
  for (int32_t b = 0; b < kBatch; ++b) {
    for (int32_t i = 0; i < w; ++i) {
      const int32_t index = WindowIndex(b, i, seq_len[b], w);
      if (i < view.Valid(b)) {
        EXPECT_EQ(rings.data() + int64_t{index} * kStride, view.Row(b, i)) << b << " " << i;
      } else {
        EXPECT_EQ(index, -1) << b << " " << i;
      }
    }
    // The step that reached seq_len wrote the newest row, the window's last.
    EXPECT_EQ(AppendedWindowRow(b, seq_len[b], w),
              WindowIndex(b, view.Valid(b) - 1, seq_len[b], w));
  }
}

TEST(EntryScopesTest, TheAppendWritesTheEntryItsTokenCompletes) {
  const int32_t entry_rows = 40, r = 4;
  for (int32_t tokens = 1; tokens <= 20; ++tokens) {
    const int32_t row = AppendedEntryRow(2, tokens, r, entry_rows);
    if (tokens % r == 0) {
      EXPECT_EQ(row, 2 * entry_rows + tokens / r - 1) << tokens;
      // The new entry is the last of the every-entry scope.
      EXPECT_EQ(row, EveryEntryIndex(2, tokens / r - 1, tokens, r, entry_rows)) << tokens;
    } else {
      EXPECT_EQ(row, -1) << tokens;
    }
  }
}

}  // namespace
}  // namespace sparsekv::tools
