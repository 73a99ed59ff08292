#include "sparsekv/capacity.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <limits>
#include <map>
#include <string>

#include "sparsekv/backend.h"
#include "sparsekv/host_kv_pool.h"
#include "sparsekv/hot_cache.h"
#include "sparsekv/manager.h"
#include "sparsekv/node_pool.h"

namespace sparsekv {
namespace {

// gmock's HasSubstr without gmock.
::testing::AssertionResult Contains(const std::string& text, const std::string& part) {
  if (text.find(part) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "'" << text << "' does not contain '" << part << "'";
}

constexpr int64_t kGB = 1000 * 1000 * 1000;

// A machine with the figures a test sets; an unset figure is Unavailable.
class FakeCapacity final : public MachineCapacity {
 public:
  StatusOr<int64_t> AvailableHostBytes() const override { return Figure(host); }
  StatusOr<int64_t> AvailableAddressSpace() const override { return Figure(address_space); }
  StatusOr<int64_t> FreeFileSystemBytes(const std::string& directory) const override {
    auto it = file_systems.find(directory);
    return it == file_systems.end() ? Unavailable("no such file system") : Figure(it->second);
  }
  StatusOr<int64_t> FreeDeviceBytes(Backend&) const override { return Figure(device); }

  int64_t host = -1;
  int64_t address_space = -1;
  int64_t device = -1;
  std::map<std::string, int64_t> file_systems;

 private:
  static StatusOr<int64_t> Figure(int64_t v) {
    if (v < 0) return Unavailable("not known");
    return v;
  }
};

const AllocationNeed kPool{.what = "host pool",
                           .sizing = "host_capacity_tokens = 1048576",
                           .bytes = 41'964'011'520,
                           .remedy = "lower host_capacity_tokens"};

TEST(CapacityTest, HostMemoryRefusalNamesBothNumbersAndTheOption) {
  FakeCapacity machine;
  machine.host = 12'300'000'000;
  const Status s = CheckHostMemory(kPool, machine);
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(s.message(),
            "host pool: host_capacity_tokens = 1048576 needs 41.96 GB of host memory, 12.30 GB is "
            "available; lower host_capacity_tokens");
}

TEST(CapacityTest, WhatFitsPassesAndAnUnknownFigurePasses) {
  FakeCapacity machine;
  EXPECT_TRUE(CheckHostMemory(kPool, machine).ok());  // nothing known: nothing refused
  machine.host = kPool.bytes;
  machine.address_space = std::numeric_limits<int64_t>::max();
  EXPECT_TRUE(CheckHostMemory(kPool, machine).ok());  // exactly what is there fits
  machine.host = kPool.bytes - 1;
  EXPECT_EQ(CheckHostMemory(kPool, machine).code(), StatusCode::kResourceExhausted);
}

TEST(CapacityTest, SmallNeedsPassWithoutAskingTheMachine) {
  FakeCapacity machine;
  machine.host = 0;
  machine.device = 0;
  machine.file_systems["/dev/shm"] = 0;
  const AllocationNeed small{.what = "x", .sizing = "", .bytes = (64 << 20) - 1, .remedy = ""};
  EXPECT_TRUE(CheckHostMemory(small, machine).ok());
  EXPECT_TRUE(CheckSharedMemory(small, "/dev/shm", machine).ok());
  std::shared_ptr<Backend> cpu = CreateCpuBackend();
  EXPECT_TRUE(CheckDeviceMemory(small, *cpu, machine).ok());
  const AllocationNeed large{.what = "x", .sizing = "", .bytes = 64 << 20, .remedy = ""};
  EXPECT_FALSE(CheckHostMemory(large, machine).ok());
}

TEST(CapacityTest, AddressSpaceIsCheckedAfterHostMemory) {
  FakeCapacity machine;
  machine.host = 100 * kGB;
  machine.address_space = 8 * kGB;
  const Status s = CheckHostMemory(kPool, machine);
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(Contains(s.message(),
                       "needs 41.96 GB of address space, 8.00 GB more may be mapped "
                       "by this process (ulimit -v)"));
}

TEST(CapacityTest, SharedMemoryChecksTheFileSystemThenTheHost) {
  FakeCapacity machine;
  machine.file_systems["/dev/shm"] = 12'300'000'000;
  machine.host = 100 * kGB;
  Status s = CheckSharedMemory(kPool, "/dev/shm", machine);
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(Contains(s.message(), "needs 41.96 GB of /dev/shm, 12.30 GB is free there"));
  machine.file_systems["/dev/shm"] = 100 * kGB;
  machine.host = 10 * kGB;
  s = CheckSharedMemory(kPool, "/dev/shm", machine);
  EXPECT_TRUE(Contains(s.message(), "of host memory, 10.00 GB is available"));
  machine.host = 100 * kGB;
  EXPECT_TRUE(CheckSharedMemory(kPool, "/dev/shm", machine).ok());
}

TEST(CapacityTest, DeviceMemoryIsTheBackendsFreeMemory) {
  FakeCapacity machine;
  std::shared_ptr<Backend> cpu = CreateCpuBackend();
  machine.device = 2 * kGB;
  const Status s = CheckDeviceMemory(
      {.what = "hot cache", .sizing = "", .bytes = 3 * kGB, .remedy = "lower hot_slots"}, *cpu,
      machine);
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(s.message(),
            "hot cache: needs 3.00 GB of host memory (the CPU backend's device memory), 2.00 GB "
            "is free; lower hot_slots");
  machine.device = 3 * kGB;
  EXPECT_TRUE(
      CheckDeviceMemory({.what = "x", .sizing = "", .bytes = 3 * kGB, .remedy = ""}, *cpu, machine)
          .ok());
}

TEST(CapacityTest, FormatBytesIsDecimal) {
  EXPECT_EQ(FormatBytes(512), "512 B");
  EXPECT_EQ(FormatBytes(41'964'011'520), "41.96 GB");
  EXPECT_EQ(FormatBytes(1'500'000), "1.50 MB");
  EXPECT_EQ(FormatBytes(2'000'000'000'000'000), "2.00 PB");
}

TEST(CapacityTest, TheSystemReportsItsFigures) {
  const MachineCapacity& system = SystemCapacity();
  const StatusOr<int64_t> host = system.AvailableHostBytes();
  ASSERT_TRUE(host.ok()) << host.status().ToString();
  EXPECT_GT(*host, 0);
  const StatusOr<int64_t> space = system.AvailableAddressSpace();
  ASSERT_TRUE(space.ok()) << space.status().ToString();
  EXPECT_GT(*space, 0);
  const StatusOr<int64_t> tmp = system.FreeFileSystemBytes("/tmp");
  ASSERT_TRUE(tmp.ok()) << tmp.status().ToString();
  EXPECT_GE(*tmp, 0);
  EXPECT_FALSE(system.FreeFileSystemBytes("/no/such/directory").ok());
  std::shared_ptr<Backend> cpu = CreateCpuBackend();
  const StatusOr<int64_t> device = system.FreeDeviceBytes(*cpu);
  ASSERT_TRUE(device.ok());
  EXPECT_GT(*device, 0);
}

// The real machine: a pool, a hot cache and a manager larger than any machine has are refused at
// once by the check, naming the option, before anything is allocated (an allocation would take
// the malloc path's own, different message, or grow toward the machine's memory).
TEST(CapacityTest, MoreThanTheMachineHasIsRefusedAtOnce) {
  std::shared_ptr<Backend> cpu = CreateCpuBackend();
  const auto start = std::chrono::steady_clock::now();
  // 1000 layers of 1152-byte rows, 2^30 rows: 1.24 PB.
  const KVGeometry huge = KVGeometry::Uniform(1000, 1152);
  auto pool = HostKVPool::Create(huge, int64_t{1} << 30, 64, 4, 1 << 20, cpu.get());
  ASSERT_FALSE(pool.ok());
  EXPECT_EQ(pool.status().code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(Contains(pool.status().message(), "host pool: host_capacity_tokens = 1073741824"));
  EXPECT_TRUE(Contains(pool.status().message(), "needs 1.24 PB of host memory"));
  EXPECT_TRUE(Contains(pool.status().message(), "lower host_capacity_tokens"));

  auto hot = HotCache::Create(huge, 1 << 20, 1, 1024, 1024, (1 << 20) + 1, cpu.get());
  ASSERT_FALSE(hot.ok());
  EXPECT_EQ(hot.status().code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(Contains(hot.status().message(), "hot cache: hot_slots = 1048576"));
  EXPECT_TRUE(Contains(hot.status().message(), "lower hot_slots, max_requests"));

  CacheOptions o;
  o.geometry = huge;
  o.host_capacity_tokens = int64_t{1} << 30;
  o.max_context = 1 << 20;
  o.max_requests = 4;
  auto manager = SparseKVCacheManager::Create(o, cpu);
  ASSERT_FALSE(manager.ok());
  EXPECT_EQ(manager.status().code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(Contains(manager.status().message(), "host_capacity_tokens"));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(1));
}

// On a GPU: the device's free memory is cudaMemGetInfo's, and a hot cache larger than it is
// refused before any of it is allocated (skipped without a GPU).
TEST(CapacityTest, AHotCacheLargerThanTheGpuIsRefusedAtOnce) {
  StatusOr<std::shared_ptr<Backend>> gpu = CreateCudaBackend(0);
  if (!gpu.ok()) GTEST_SKIP() << gpu.status().ToString();
  const StatusOr<int64_t> free = (*gpu)->FreeDeviceBytes();
  ASSERT_TRUE(free.ok()) << free.status().ToString();
  EXPECT_GT(*free, int64_t{1} << 30);
  EXPECT_LT(*free, int64_t{1} << 50);
  // 61 layers of 656-byte rows, 2048 requests of 4096 slots: 344 GB of HBM.
  const KVGeometry geometry = KVGeometry::Uniform(61, 656);
  const auto start = std::chrono::steady_clock::now();
  auto hot = HotCache::Create(geometry, 4096, 1, 2048, 2048, 4097, gpu->get());
  ASSERT_FALSE(hot.ok());
  EXPECT_EQ(hot.status().code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(Contains(hot.status().message(), "of device memory on cuda:0"));
  EXPECT_TRUE(Contains(hot.status().message(), "is free; lower hot_slots, max_requests"));
  CacheOptions o;
  o.geometry = geometry;
  o.top_k = 2048;
  o.hot_slots = 4096;
  o.max_requests = 2048;
  o.max_context = 8192;
  o.host_capacity_tokens = 8192;  // 328 MB of pinned host memory, allocated before the cache
  auto manager = SparseKVCacheManager::Create(o, *gpu);
  ASSERT_FALSE(manager.ok());
  EXPECT_EQ(manager.status().code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(Contains(manager.status().message(), "hot cache: hot_slots = 4096"))
      << manager.status().ToString();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(1));
}

TEST(CapacityTest, ANodePoolLargerThanItsFileSystemIsRefusedBeforeItsFileIsMade) {
  CacheOptions o;
  o.geometry = KVGeometry::Uniform(1000, 1152);
  o.host_capacity_tokens = int64_t{1} << 30;
  o.max_context = 1 << 20;
  o.max_requests = 4;
  NodePoolOptions node;
  node.name = "sparsekv-capacity-test-" + std::to_string(getpid());
  node.directory = "/tmp";
  const StatusOr<int64_t> bytes = NodePoolBytes(o, 4, node);
  ASSERT_TRUE(bytes.ok());
  EXPECT_GT(*bytes, int64_t{1} << 30 << 10);
  auto pool = CreateNodePool(o, 4, node, CreateCpuBackend());
  ASSERT_FALSE(pool.ok());
  EXPECT_EQ(pool.status().code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(Contains(pool.status().message(), "node pool '" + node.name + "'"));
  EXPECT_TRUE(Contains(pool.status().message(), "of /tmp, "));
  EXPECT_TRUE(Contains(pool.status().message(), "is free there; lower host_capacity_tokens"));
  EXPECT_NE(access(("/tmp/" + node.name).c_str(), F_OK), 0);
}

}  // namespace
}  // namespace sparsekv
