// DeviceTables over the CPU backend: what each table holds after allocation and after a row's
// upload, and which tables exist.
#include "manager/device_tables.h"

#include <gtest/gtest.h>

#include <memory>
#include <vector>

namespace sparsekv {
namespace {

std::vector<int32_t> Read(Backend& backend, const int32_t* p, size_t n) {
  std::vector<int32_t> out(n, -7);
  EXPECT_TRUE(backend.CopyAsync(out.data(), p, n * sizeof(int32_t), nullptr).ok());
  EXPECT_TRUE(backend.Synchronize(nullptr).ok());
  return out;
}

TEST(DeviceTablesTest, ThePageTableStartsEmptyAndTakesAnOwnersRow) {
  std::shared_ptr<Backend> backend = CreateCpuBackend();
  DeviceTables tables(*backend);
  ASSERT_TRUE(tables.Allocate({.max_owners = 3, .pages_per_owner = 4}).ok());
  EXPECT_EQ(Read(*backend, tables.page_table(), 12), std::vector<int32_t>(12, -1));
  EXPECT_EQ(tables.resident_table(), nullptr);
  EXPECT_EQ(tables.key_table(), nullptr);
  EXPECT_EQ(tables.device_bytes(), 12 * 4);

  const std::vector<int32_t> row = {5, 6, -1, -1};
  ASSERT_TRUE(tables.UploadPageRow(1, row, nullptr).ok());
  std::vector<int32_t> expected(12, -1);
  expected[4] = 5;
  expected[5] = 6;
  EXPECT_EQ(Read(*backend, tables.page_table(), 12), expected);
}

TEST(DeviceTablesTest, ResidencyAndKeyTablesTakeRowsOfTheirOwnWidth) {
  std::shared_ptr<Backend> backend = CreateCpuBackend();
  DeviceTables tables(*backend);
  ASSERT_TRUE(tables
                  .Allocate({.max_owners = 2,
                             .pages_per_owner = 4,
                             .resident_pages_per_owner = 3,
                             .key_pages_per_owner = 2})
                  .ok());
  EXPECT_EQ(tables.resident_pages_per_owner(), 3);
  EXPECT_EQ(tables.key_pages_per_owner(), 2);
  EXPECT_EQ(tables.device_bytes(), (8 + 6 + 4) * 4);
  EXPECT_EQ(Read(*backend, tables.resident_table(), 6), std::vector<int32_t>(6, 0));

  // A request may hold fewer pages than a row has room for: the rest of the row is untouched.
  const std::vector<int32_t> resident = {40, 48};
  ASSERT_TRUE(tables.UploadResidentRow(1, resident, nullptr).ok());
  EXPECT_EQ(Read(*backend, tables.resident_table(), 6), (std::vector<int32_t>{0, 0, 0, 40, 48, 0}));
  const std::vector<int32_t> keys = {8, 16};
  ASSERT_TRUE(tables.UploadKeyRow(1, keys, nullptr).ok());
  EXPECT_EQ(Read(*backend, tables.key_table(), 4), (std::vector<int32_t>{0, 0, 8, 16}));
}

}  // namespace
}  // namespace sparsekv
