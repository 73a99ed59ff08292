// DeviceMemory over the CPU backend: buffers come zeroed and are counted.
#include "manager/device_memory.h"

#include <gtest/gtest.h>

#include <memory>
#include <vector>

namespace sparsekv {
namespace {

std::vector<int32_t> Read(Backend& backend, const int32_t* p, size_t n) {
  std::vector<int32_t> out(n, -1);
  EXPECT_TRUE(backend.CopyAsync(out.data(), p, n * sizeof(int32_t), nullptr).ok());
  EXPECT_TRUE(backend.Synchronize(nullptr).ok());
  return out;
}

TEST(DeviceMemoryTest, BuffersAreZeroedAndCounted) {
  std::shared_ptr<Backend> backend = CreateCpuBackend();
  DeviceMemory memory(*backend);
  EXPECT_EQ(memory.bytes(), 0);
  StatusOr<int32_t*> a = memory.Allocate<int32_t>(5);
  ASSERT_TRUE(a.ok());
  StatusOr<unsigned long long*> b = memory.Allocate<unsigned long long>(1);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(memory.bytes(), 5 * 4 + 8);
  ASSERT_TRUE(backend->Synchronize(nullptr).ok());
  EXPECT_EQ(Read(*backend, *a, 5), std::vector<int32_t>(5, 0));
  EXPECT_EQ(**b, 0u);
  EXPECT_EQ(&memory.backend(), backend.get());
}

TEST(DeviceMemoryTest, AMissListHasACountOnlyIfAsked) {
  std::shared_ptr<Backend> backend = CreateCpuBackend();
  DeviceMemory memory(*backend);
  StatusOr<MissList> shared = memory.AllocateMissList(3, false);
  ASSERT_TRUE(shared.ok());
  EXPECT_NE(shared->host_row, nullptr);
  EXPECT_NE(shared->slot, nullptr);
  EXPECT_EQ(shared->count, nullptr);
  EXPECT_EQ(memory.bytes(), 2 * 3 * 4);
  StatusOr<MissList> own = memory.AllocateMissList(3, true);
  ASSERT_TRUE(own.ok());
  ASSERT_NE(own->count, nullptr);
  EXPECT_EQ(memory.bytes(), 2 * (2 * 3 * 4) + 4);
  ASSERT_TRUE(backend->Synchronize(nullptr).ok());
  EXPECT_EQ(Read(*backend, own->count, 1), std::vector<int32_t>{0});
  EXPECT_EQ(Read(*backend, own->slot, 3), std::vector<int32_t>(3, 0));
}

}  // namespace
}  // namespace sparsekv
