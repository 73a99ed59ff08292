// The CUDA backend's host memory in chunks (host_memory.h): a large allocation and a registered
// range made of several registrations, read and written by copies and by a kernel across the
// chunk boundaries. Skips without a GPU.
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "sparsekv/backend.h"
#include "sparsekv/host_memory.h"

namespace sparsekv {
namespace {

constexpr size_t kMB = size_t{1} << 20;

// The CUDA backend with chunks of 2 MB; nullptr with the reason in `why` where there is no GPU
// (a failure for any other error).
std::shared_ptr<Backend> ChunkedBackend(HostMemoryKind kind, HostMemoryOptions options,
                                        std::string* why) {
  options.chunk_bytes = 2 * kMB;
  StatusOr<std::shared_ptr<Backend>> gpu = CreateCudaBackend(0, kind, options);
  if (gpu.ok()) return *gpu;
  if (gpu.status().code() != StatusCode::kUnavailable) ADD_FAILURE() << gpu.status().ToString();
  *why = gpu.status().message();
  return nullptr;
}

// Copies `host` (bytes) to the device and back into `back` through one copy each, and gathers
// one row of 4 KB straddling every 2 MB boundary with IndexCopy (a kernel reading the host
// memory at its host address).
void CheckAcrossBoundaries(Backend& gpu, std::byte* host, size_t bytes) {
  for (size_t i = 0; i < bytes; ++i) host[i] = std::byte(i * 131 % 251);
  StatusOr<void*> device = gpu.AllocateDevice(bytes);
  ASSERT_TRUE(device.ok()) << device.status().ToString();
  ASSERT_TRUE(gpu.CopyAsync(*device, host, bytes, nullptr).ok());
  std::vector<std::byte> back(bytes);
  ASSERT_TRUE(gpu.CopyAsync(back.data(), *device, bytes, nullptr).ok());
  ASSERT_TRUE(gpu.Synchronize(nullptr).ok());
  EXPECT_EQ(std::memcmp(back.data(), host, bytes), 0);

  // Rows of 4 KB at a 2 KB stride offset, so that row r starts at 2 MB * r - 2 KB.
  constexpr int32_t kRow = 4096;
  const int32_t rows = static_cast<int32_t>(bytes / (2 * kMB)) - 1;
  std::vector<int32_t> index(rows);
  std::iota(index.begin(), index.end(), 0);
  const size_t table = sizeof(int32_t) * (2 * rows + 1);
  StatusOr<void*> tables = gpu.AllocateDevice(table);
  StatusOr<void*> out = gpu.AllocateDevice(size_t{kRow} * rows);
  ASSERT_TRUE(tables.ok() && out.ok());
  auto* t = static_cast<int32_t*>(*tables);
  const int32_t count = rows;
  ASSERT_TRUE(gpu.CopyAsync(t, index.data(), sizeof(int32_t) * rows, nullptr).ok());
  ASSERT_TRUE(gpu.CopyAsync(t + rows, index.data(), sizeof(int32_t) * rows, nullptr).ok());
  ASSERT_TRUE(gpu.CopyAsync(t + 2 * rows, &count, sizeof(int32_t), nullptr).ok());
  IndexCopyView view{};
  view.src = host + 2 * kMB - kRow / 2;
  view.dst = static_cast<std::byte*>(*out);
  view.src_index = t;
  view.dst_index = t + rows;
  view.count = t + 2 * rows;
  view.capacity = rows;
  view.row_bytes = kRow;
  view.src_stride = 2 * kMB;
  view.dst_stride = kRow;
  view.src_rows = rows;
  view.dst_rows = rows;
  ASSERT_TRUE(gpu.IndexCopy(view, nullptr).ok());
  std::vector<std::byte> gathered(size_t{kRow} * rows);
  ASSERT_TRUE(gpu.CopyAsync(gathered.data(), *out, gathered.size(), nullptr).ok());
  ASSERT_TRUE(gpu.Synchronize(nullptr).ok());
  for (int32_t r = 0; r < rows; ++r) {
    EXPECT_EQ(std::memcmp(gathered.data() + size_t{kRow} * r, view.src + 2 * kMB * r, kRow), 0)
        << "row " << r;
  }
  gpu.FreeDevice(*out);
  gpu.FreeDevice(*tables);
  gpu.FreeDevice(*device);
}

TEST(CudaHostMemoryTest, LargeAllocationInChunksIsOneRangeToTheDevice) {
  std::vector<HostMemoryProgress> seen;
  HostMemoryOptions options;
  options.progress = [&](const HostMemoryProgress& p) { seen.push_back(p); };
  std::string why;
  std::shared_ptr<Backend> gpu =
      ChunkedBackend(HostMemoryKind::kTransparentHugePages, options, &why);
  if (gpu == nullptr) GTEST_SKIP() << why;
  const size_t bytes = 10 * kMB;
  StatusOr<void*> host = gpu->AllocateHost(bytes);
  ASSERT_TRUE(host.ok()) << host.status().ToString();
  ASSERT_FALSE(seen.empty());
  EXPECT_EQ(seen.back().chunks, 5);
  EXPECT_EQ(seen.back().registered_bytes, static_cast<int64_t>(bytes));
  CheckAcrossBoundaries(*gpu, static_cast<std::byte*>(*host), bytes);
  gpu->FreeHost(*host);
}

TEST(CudaHostMemoryTest, RegisteredRangeInChunksIsOneRangeToTheDevice) {
  std::string why;
  std::shared_ptr<Backend> gpu = ChunkedBackend(HostMemoryKind::kAuto, {}, &why);
  if (gpu == nullptr) GTEST_SKIP() << why;
  const size_t bytes = 12 * kMB;
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(p, MAP_FAILED);
  ASSERT_TRUE(gpu->RegisterHost(p, bytes).ok());
  CheckAcrossBoundaries(*gpu, static_cast<std::byte*>(p), bytes);
  gpu->UnregisterHost(p);
  // Every chunk was unregistered: the range registers again.
  ASSERT_TRUE(gpu->RegisterHost(p, bytes).ok());
  gpu->UnregisterHost(p);
  munmap(p, bytes);
}

TEST(CudaHostMemoryTest, RangeRegisteredChunkByChunkThroughTheBackend) {
  std::string why;
  std::shared_ptr<Backend> gpu = ChunkedBackend(HostMemoryKind::kAuto, {}, &why);
  if (gpu == nullptr) GTEST_SKIP() << why;
  HostMemoryOptions options;
  options.chunk_bytes = 4 * kMB;
  StatusOr<std::unique_ptr<HostMemory>> memory =
      HostMemory::Allocate(16 * kMB, options, HostRegistrar::Of(*gpu));
  ASSERT_TRUE(memory.ok()) << memory.status().ToString();
  EXPECT_EQ((*memory)->registration().chunks().size(), 4u);
  CheckAcrossBoundaries(*gpu, (*memory)->data(), (*memory)->bytes());
}

}  // namespace
}  // namespace sparsekv
