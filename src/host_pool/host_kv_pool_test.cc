#include "sparsekv/host_kv_pool.h"

#include <gtest/gtest.h>

#include <cstring>
#include <set>

namespace sparsekv {
namespace {

class HostKVPoolTest : public ::testing::Test {
 protected:
  void SetUp() override {
    geometry_ = KVGeometry::Uniform(3, 24, 32);
    auto pool = HostKVPool::Create(geometry_, /*capacity_tokens=*/100, /*page_tokens=*/16,
                                   /*max_owners=*/4, /*max_tokens_per_owner=*/64, backend_.get());
    ASSERT_TRUE(pool.ok()) << pool.status().ToString();
    pool_ = std::move(*pool);
  }
  std::shared_ptr<Backend> backend_ = CreateCpuBackend();
  KVGeometry geometry_;
  std::unique_ptr<HostKVPool> pool_;
};

TEST_F(HostKVPoolTest, CapacityIsRoundedUpToPagesAndLayerMajor) {
  EXPECT_EQ(pool_->rows(), 112);
  EXPECT_EQ(pool_->total_pages(), 7);
  EXPECT_EQ(pool_->bytes(), 112 * 3 * 32);
  EXPECT_EQ(pool_->row(1, 5), pool_->layer_base(1) + 5 * 32);
}

TEST_F(HostKVPoolTest, PagesMapPositionsToDistinctRows) {
  ASSERT_TRUE(pool_->Reserve(0, 40).ok());
  ASSERT_TRUE(pool_->Reserve(1, 17).ok());
  EXPECT_EQ(pool_->ReservedTokens(0), 48);
  std::set<int32_t> rows;
  for (int32_t p = 0; p < 48; ++p) rows.insert(pool_->HostRow(0, p));
  for (int32_t p = 0; p < 32; ++p) rows.insert(pool_->HostRow(1, p));
  EXPECT_EQ(rows.size(), 80u);
  EXPECT_EQ(pool_->free_pages(), 2);
}

TEST_F(HostKVPoolTest, ExhaustionIsAnErrorAndChangesNothing) {
  ASSERT_TRUE(pool_->Reserve(0, 64).ok());  // 4 pages
  std::memset(pool_->row(0, pool_->HostRow(0, 3)), 0x5A, 24);
  const Status s = pool_->Reserve(1, 64);  // needs 4, 3 free
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted) << s.ToString();
  EXPECT_EQ(pool_->free_pages(), 3);
  EXPECT_EQ(pool_->ReservedTokens(1), 0);
  EXPECT_EQ(pool_->row(0, pool_->HostRow(0, 3))[7], std::byte{0x5A});
  EXPECT_TRUE(pool_->Reserve(1, 48).ok());
}

TEST_F(HostKVPoolTest, ReleaseReturnsPagesAndReservationLimitsHold) {
  ASSERT_TRUE(pool_->Reserve(2, 33).ok());
  EXPECT_EQ(pool_->Reserve(2, 1).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(pool_->Reserve(3, 65).code(), StatusCode::kOutOfRange);
  pool_->Release(2);
  EXPECT_EQ(pool_->free_pages(), 7);
  EXPECT_EQ(pool_->page_table_row(2)[0], -1);
  pool_->Release(2);  // no-op
  EXPECT_EQ(pool_->free_pages(), 7);
}

}  // namespace
}  // namespace sparsekv
