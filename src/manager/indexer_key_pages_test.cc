// IndexerKeyPages on its own, over a CPU backend's hot cache: where a position's key lies, what
// Ingest and Copy write and refuse, and the views and copies it hands the step.
#include "manager/indexer_key_pages.h"

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

namespace sparsekv {
namespace {

constexpr int32_t kLayers = 2;
constexpr int32_t kStride = 16;
constexpr int32_t kKeyBytes = 4;
constexpr int32_t kKeysPerPage = 8;  // pages of 2 rows of 16 bytes

// Key of position p in layer l: four bytes equal to l * 60 + p + 1.
std::vector<std::byte> Keys(int32_t layer, int32_t n) {
  std::vector<std::byte> keys(static_cast<size_t>(n) * kKeyBytes);
  for (int32_t p = 0; p < n; ++p) {
    std::memset(keys.data() + p * kKeyBytes, layer * 60 + p + 1, kKeyBytes);
  }
  return keys;
}

class IndexerKeyPagesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    options_.geometry = KVGeometry::Uniform(kLayers, kStride);
    options_.indexer_key_bytes = kKeyBytes;
    auto hot = HotCache::Create(options_.geometry, 1, 1, 1, 8, 2, backend_.get());
    ASSERT_TRUE(hot.ok()) << hot.status().ToString();
    hot_ = std::move(*hot);
    ASSERT_TRUE(
        tables_.Allocate({.max_owners = 2, .pages_per_owner = 2, .key_pages_per_owner = 2}).ok());
    keys_.Attach(*hot_, tables_, kKeysPerPage);
  }
  // A request of `seq_len` positions holding key pages for them.
  RequestState Request(int32_t seq_len) {
    RequestState r{.owner = 0,
                   .block = -1,
                   .seq_len = seq_len,
                   .reserved = seq_len,
                   .ingested = std::vector<bool>(kLayers, true),
                   .ingested_layers = kLayers,
                   .keys_ingested = std::vector<bool>(kLayers, false)};
    StatusOr<std::vector<int32_t>> pages = hot_->AcquirePages(keys_.PagesFor(seq_len));
    EXPECT_TRUE(pages.ok());
    r.key_pages = *pages;
    return r;
  }
  // The first byte of the key of position p of `r` in `layer`.
  std::byte KeyByte(const RequestState& r, int32_t layer, int32_t p) {
    EXPECT_TRUE(backend_->Synchronize(nullptr).ok());
    return hot_->layer_data(layer)[int64_t{keys_.Word(r, p)} * 4];
  }

  CacheOptions options_;
  std::shared_ptr<Backend> backend_ = CreateCpuBackend();
  std::unique_ptr<HotCache> hot_;
  DeviceTables tables_{*backend_};
  IndexerKeyPages keys_{options_, *backend_};
};

TEST_F(IndexerKeyPagesTest, AKeyLiesInItsPageKeyBytesApart) {
  EXPECT_TRUE(keys_.enabled());
  EXPECT_EQ(keys_.PagesFor(8), 1);
  EXPECT_EQ(keys_.PagesFor(9), 2);
  RequestState r = Request(10);
  r.key_pages = {4, 10};  // first slots
  EXPECT_EQ(keys_.Word(r, 0), 4 * kStride / 4);
  EXPECT_EQ(keys_.Word(r, 7), (4 * kStride + 7 * kKeyBytes) / 4);
  EXPECT_EQ(keys_.Word(r, 9), (10 * kStride + 1 * kKeyBytes) / 4);
}

TEST_F(IndexerKeyPagesTest, IngestWritesThePromptsKeysOnce) {
  RequestState r = Request(10);
  const std::vector<std::byte> keys = Keys(1, 10);
  ASSERT_TRUE(keys_.Ingest(7, r, 1, keys.data(), nullptr).ok());
  for (int32_t p = 0; p < 10; ++p) {
    EXPECT_EQ(KeyByte(r, 1, p), static_cast<std::byte>(60 + p + 1)) << p;
  }
  EXPECT_TRUE(r.keys_ingested[1]);
  EXPECT_FALSE(r.keys_ingested[0]);
  EXPECT_EQ(r.keys_ingested_layers, 1);

  Status s = keys_.Ingest(7, r, 1, keys.data(), nullptr);
  EXPECT_EQ(s.code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(s.message(),
            "IngestIndexerKeys: the keys of layer 1 of request 7 were already ingested");
  s = keys_.Ingest(7, r, 2, keys.data(), nullptr);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "IngestIndexerKeys: layer 2 out of range");
  s = keys_.Ingest(7, r, 0, nullptr, nullptr);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "IngestIndexerKeys: keys is null");
  EXPECT_EQ(r.keys_ingested_layers, 1);
}

TEST_F(IndexerKeyPagesTest, WithoutKeysIngestIsRefusedAndTheViewIsEmpty) {
  EXPECT_TRUE(keys_.CheckEnabled().ok());
  IndexerKeyPages none(options_, *backend_);
  none.Attach(*hot_, tables_, 0);
  EXPECT_FALSE(none.enabled());
  EXPECT_EQ(none.PagesFor(100), 0);
  const Status s = none.CheckEnabled();
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.message(),
            "IngestIndexerKeys: the manager keeps no indexer keys (indexer_key_bytes = 0)");
  EXPECT_EQ(none.View(0, nullptr, nullptr).keys, nullptr);
}

TEST_F(IndexerKeyPagesTest, CopyGivesAForkItsParentsKeysInEveryLayer) {
  RequestState parent = Request(9);
  for (int32_t l = 0; l < kLayers; ++l) {
    const std::vector<std::byte> keys = Keys(l, 9);
    ASSERT_TRUE(keys_.Ingest(1, parent, l, keys.data(), nullptr).ok());
  }
  RequestState child = Request(9);
  ASSERT_NE(child.key_pages, parent.key_pages);
  ASSERT_TRUE(keys_.Copy(parent, child, nullptr).ok());
  for (int32_t l = 0; l < kLayers; ++l) {
    for (int32_t p = 0; p < 9; ++p) EXPECT_EQ(KeyByte(child, l, p), KeyByte(parent, l, p));
  }
  EXPECT_EQ(child.keys_ingested, std::vector<bool>(kLayers, true));
  EXPECT_EQ(child.keys_ingested_layers, kLayers);
}

TEST_F(IndexerKeyPagesTest, TheViewNamesTheLayersMemoryAndTheKeyTable) {
  int32_t batch_size = 0;
  BatchEntry batch[1] = {};
  const IndexerKeyView v = keys_.View(1, &batch_size, batch);
  EXPECT_EQ(v.batch_size, &batch_size);
  EXPECT_EQ(v.batch, batch);
  EXPECT_EQ(v.keys, hot_->layer_data(1));
  EXPECT_EQ(v.row_stride, kStride);
  EXPECT_EQ(v.page_table, tables_.key_table());
  EXPECT_EQ(v.pages_per_request, 2);
  EXPECT_EQ(v.keys_per_page, kKeysPerPage);
  EXPECT_EQ(v.key_bytes, kKeyBytes);
  EXPECT_EQ(keys_.View(2, &batch_size, batch).keys, nullptr);
  EXPECT_EQ(keys_.View(-1, &batch_size, batch).keys, nullptr);
}

TEST_F(IndexerKeyPagesTest, TheAppendCopyMovesKeysToWords) {
  IndexCopyView rows{};
  rows.dst = hot_->layer_data(0);
  rows.capacity = 3;
  rows.row_bytes = kStride;
  rows.src_stride = rows.dst_stride = kStride;
  rows.src_rows = 3;
  rows.dst_rows = hot_->layer_rows();
  int32_t words[3] = {};
  const std::vector<std::byte> keys = Keys(0, 3);
  const IndexCopyView copy =
      keys_.AppendCopy(rows, options_.geometry.layers[0], keys.data(), words);
  EXPECT_EQ(copy.src, keys.data());
  EXPECT_EQ(copy.dst, rows.dst);
  EXPECT_EQ(copy.dst_index, words);
  EXPECT_EQ(copy.row_bytes, kKeyBytes);
  EXPECT_EQ(copy.src_stride, kKeyBytes);
  EXPECT_EQ(copy.dst_stride, 4);
  EXPECT_EQ(copy.dst_rows, (hot_->layer_rows() * kStride - kKeyBytes) / 4 + 1);
  EXPECT_EQ(copy.capacity, 3);
}

}  // namespace
}  // namespace sparsekv
