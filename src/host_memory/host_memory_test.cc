#include "sparsekv/host_memory.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "sparsekv/backend.h"

namespace sparsekv {
namespace {

constexpr size_t kMB = size_t{1} << 20;
constexpr size_t kGiB = size_t{1} << 30;

// Records registrations as cudaHostRegister would see them; fails the `fail_at`-th call (1-based).
class FakeRegistrar {
 public:
  HostRegistrar Get() {
    return {[this](void* p, size_t bytes) -> Status {
              std::lock_guard<std::mutex> lock(mu_);
              ++calls_;
              if (calls_ == fail_at) return Internal("injected registration failure");
              if (!live_.emplace(static_cast<std::byte*>(p), bytes).second) {
                return Internal("registered twice");
              }
              return Status::Ok();
            },
            [this](void* p) {
              std::lock_guard<std::mutex> lock(mu_);
              unregistered_ += live_.erase(static_cast<std::byte*>(p));
            }};
  }
  int fail_at = 0;
  int calls_ = 0;
  int unregistered_ = 0;
  std::map<std::byte*, size_t> live_;

 private:
  std::mutex mu_;
};

// Anonymous memory, not yet touched.
class Mapping {
 public:
  explicit Mapping(size_t bytes) : bytes_(bytes) {
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    data_ = p == MAP_FAILED ? nullptr : static_cast<std::byte*>(p);
  }
  ~Mapping() {
    if (data_ != nullptr) munmap(data_, bytes_);
  }
  std::byte* data() const { return data_; }
  // Pages of the mapping that are resident.
  size_t ResidentPages() const { return Resident(data_, bytes_); }
  static size_t Resident(std::byte* p, size_t bytes) {
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    std::vector<unsigned char> in_core((bytes + page - 1) / page);
    if (mincore(p, bytes, in_core.data()) != 0) return 0;
    size_t n = 0;
    for (unsigned char c : in_core) n += c & 1;
    return n;
  }

 private:
  size_t bytes_;
  std::byte* data_;
};

TEST(SplitHostRangeTest, AlignedRangeIsCutIntoEqualChunksAndARemainder) {
  const uintptr_t base = 64 * kGiB;
  const std::vector<HostChunk> chunks = SplitHostRange(base, 150 * kGiB, 64 * kGiB, 2 * kMB);
  ASSERT_EQ(chunks.size(), 3u);
  EXPECT_EQ(chunks[0].offset, 0u);
  EXPECT_EQ(chunks[0].bytes, 64 * kGiB);
  EXPECT_EQ(chunks[1].offset, 64 * kGiB);
  EXPECT_EQ(chunks[1].bytes, 64 * kGiB);
  EXPECT_EQ(chunks[2].offset, 128 * kGiB);
  EXPECT_EQ(chunks[2].bytes, 22 * kGiB);
}

TEST(SplitHostRangeTest, ExactMultipleHasNoEmptyChunk) {
  EXPECT_EQ(SplitHostRange(0, 128 * kGiB, 64 * kGiB, 2 * kMB).size(), 2u);
  EXPECT_EQ(SplitHostRange(0, 2 * 1024 * kGiB, 64 * kGiB, 2 * kMB).size(), 32u);
  EXPECT_TRUE(SplitHostRange(0, 0, 64 * kGiB, 2 * kMB).empty());
  EXPECT_EQ(SplitHostRange(0, 1, 64 * kGiB, 2 * kMB).size(), 1u);
}

TEST(SplitHostRangeTest, UnalignedStartKeepsBoundariesAligned) {
  const uintptr_t base = 10 * kMB + 4096;
  const size_t bytes = 15 * kMB;
  const std::vector<HostChunk> chunks = SplitHostRange(base, bytes, 5 * kMB, 2 * kMB);
  // 5 MB rounds down to 4 MB chunks, counted from 10 MB (the start rounded down to 2 MB): the
  // boundaries are at 14, 18 and 22 MB.
  size_t covered = 0;
  for (size_t i = 0; i < chunks.size(); ++i) {
    EXPECT_EQ(chunks[i].offset, covered);
    EXPECT_LE(chunks[i].bytes, 4 * kMB);
    EXPECT_GT(chunks[i].bytes, 0u);
    covered += chunks[i].bytes;
    if (i + 1 < chunks.size()) {
      EXPECT_EQ((base + covered) % (2 * kMB), 0u) << i;
    }
  }
  EXPECT_EQ(covered, bytes);
  ASSERT_EQ(chunks.size(), 4u);
  EXPECT_EQ(chunks.front().bytes, 14 * kMB - base);
}

TEST(SplitHostRangeTest, ChunkBelowAlignmentIsOneAlignment) {
  const std::vector<HostChunk> chunks = SplitHostRange(0, 7 * kMB, 1 * kMB, 2 * kMB);
  ASSERT_EQ(chunks.size(), 4u);
  EXPECT_EQ(chunks[3].bytes, 1 * kMB);
}

TEST(RegisterHostRangeTest, TouchesEveryPageAndRegistersEveryChunk) {
  const size_t bytes = 48 * kMB;
  Mapping m(bytes);
  ASSERT_NE(m.data(), nullptr);
  ASSERT_EQ(m.ResidentPages(), 0u);
  FakeRegistrar fake;
  HostMemoryOptions options;
  options.chunk_bytes = 8 * kMB;
  options.threads = 4;
  options.huge_pages = false;
  auto r = RegisterHostRange(m.data(), bytes, options, fake.Get());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  EXPECT_EQ(m.ResidentPages(), bytes / page);
  EXPECT_EQ(fake.live_.size(), (*r)->chunks().size());
  size_t registered = 0;
  for (const auto& [p, b] : fake.live_) registered += b;
  EXPECT_EQ(registered, bytes);
  (*r)->Release();
  EXPECT_TRUE(fake.live_.empty());
  EXPECT_EQ(fake.unregistered_, static_cast<int>((*r)->chunks().size()));
}

TEST(RegisterHostRangeTest, PopulatingKeepsContents) {
  const size_t bytes = 6 * kMB;
  Mapping m(bytes);
  ASSERT_NE(m.data(), nullptr);
  for (size_t i = 0; i < bytes; i += 4096) m.data()[i] = std::byte(i / 4096 % 251);
  FakeRegistrar fake;
  HostMemoryOptions options;
  options.chunk_bytes = 2 * kMB;
  options.threads = 3;
  auto r = RegisterHostRange(m.data(), bytes, options, fake.Get());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  for (size_t i = 0; i < bytes; i += 4096) ASSERT_EQ(m.data()[i], std::byte(i / 4096 % 251)) << i;
}

TEST(RegisterHostRangeTest, UnalignedRangeIsTouchedAndCovered) {
  const size_t bytes = 10 * kMB;
  Mapping m(bytes);
  ASSERT_NE(m.data(), nullptr);
  FakeRegistrar fake;
  HostMemoryOptions options;
  options.chunk_bytes = 2 * kMB;
  options.threads = 2;
  auto r = RegisterHostRange(m.data() + 1000, bytes - 2000, options, fake.Get());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(m.ResidentPages(), bytes / static_cast<size_t>(sysconf(_SC_PAGESIZE)));
  size_t covered = 0;
  for (const auto& [p, b] : fake.live_) {
    EXPECT_EQ(p, m.data() + 1000 + covered);
    covered += b;
  }
  EXPECT_EQ(covered, bytes - 2000);
}

TEST(RegisterHostRangeTest, ProgressIsMonotoneAndComplete) {
  const size_t bytes = 20 * kMB;
  Mapping m(bytes);
  ASSERT_NE(m.data(), nullptr);
  FakeRegistrar fake;
  std::vector<HostMemoryProgress> seen;
  HostMemoryOptions options;
  options.chunk_bytes = 4 * kMB;
  options.threads = 2;
  options.progress = [&](const HostMemoryProgress& p) { seen.push_back(p); };
  auto r = RegisterHostRange(m.data(), bytes, options, fake.Get());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_FALSE(seen.empty());
  for (size_t i = 1; i < seen.size(); ++i) {
    EXPECT_GE(seen[i].populated_bytes, seen[i - 1].populated_bytes);
    EXPECT_GE(seen[i].registered_bytes, seen[i - 1].registered_bytes);
    EXPECT_GE(seen[i].registered_chunks, seen[i - 1].registered_chunks);
    EXPECT_GE(seen[i].elapsed_seconds, seen[i - 1].elapsed_seconds);
  }
  for (const HostMemoryProgress& p : seen) {
    EXPECT_LE(p.registered_bytes, p.populated_bytes);
    EXPECT_EQ(p.total_bytes, static_cast<int64_t>(bytes));
  }
  EXPECT_EQ(seen.back().registered_bytes, static_cast<int64_t>(bytes));
  EXPECT_EQ(seen.back().populated_bytes, static_cast<int64_t>(bytes));
  EXPECT_EQ(seen.back().registered_chunks, seen.back().chunks);
  EXPECT_EQ(seen.back().chunks, 5);
}

TEST(RegisterHostRangeTest, FailureMidwayLeavesNothingRegistered) {
  const size_t bytes = 16 * kMB;
  Mapping m(bytes);
  ASSERT_NE(m.data(), nullptr);
  for (int register_threads : {1, 3}) {
    FakeRegistrar fake;
    fake.fail_at = 3;
    HostMemoryOptions options;
    options.chunk_bytes = 2 * kMB;
    options.threads = 2;
    options.register_threads = register_threads;
    auto r = RegisterHostRange(m.data(), bytes, options, fake.Get());
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kInternal);
    EXPECT_NE(r.status().message().find("injected registration failure"), std::string::npos)
        << r.status().message();
    EXPECT_NE(r.status().message().find(" of 8"), std::string::npos) << r.status().message();
    EXPECT_TRUE(fake.live_.empty()) << register_threads;
    EXPECT_GE(fake.unregistered_, 2) << register_threads;
  }
}

TEST(RegisterHostRangeTest, NumaNodeThatDoesNotExistRunsUnbound) {
  const size_t bytes = 8 * kMB;
  Mapping m(bytes);
  ASSERT_NE(m.data(), nullptr);
  FakeRegistrar fake;
  HostMemoryOptions options;
  options.numa_node = 4095;
  options.chunk_bytes = 4 * kMB;
  auto r = RegisterHostRange(m.data(), bytes, options, fake.Get());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_FALSE((*r)->placement().bound_to_node);
  EXPECT_EQ((*r)->placement().numa_node, 4095);
  EXPECT_GE((*r)->placement().threads, 1);
  EXPECT_EQ(m.ResidentPages(), bytes / static_cast<size_t>(sysconf(_SC_PAGESIZE)));
}

TEST(RegisterHostRangeTest, NodeZeroPopulatesWithOrWithoutLibnuma) {
  const size_t bytes = 8 * kMB;
  Mapping m(bytes);
  ASSERT_NE(m.data(), nullptr);
  FakeRegistrar fake;
  HostMemoryOptions options;
  options.numa_node = 0;
  options.chunk_bytes = 4 * kMB;
  auto r = RegisterHostRange(m.data(), bytes, options, fake.Get());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  // Node 0 exists on every Linux machine; binding needs libnuma.so.1 as well.
  if (NumaNodeCores(0) > 0) {
    EXPECT_EQ((*r)->placement().threads, NumaNodeCores(0));
  }
  EXPECT_EQ(m.ResidentPages(), bytes / static_cast<size_t>(sysconf(_SC_PAGESIZE)));
}

TEST(RegisterHostRangeTest, RefusesBadOptions) {
  Mapping m(4 * kMB);
  FakeRegistrar fake;
  HostMemoryOptions options;
  options.chunk_bytes = kMB;
  EXPECT_EQ(RegisterHostRange(m.data(), 4 * kMB, options, fake.Get()).status().code(),
            StatusCode::kInvalidArgument);
  options = {};
  options.register_threads = 0;
  EXPECT_EQ(RegisterHostRange(m.data(), 4 * kMB, options, fake.Get()).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(RegisterHostRange(m.data(), 0, {}, fake.Get()).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(fake.calls_, 0);
}

TEST(HostMemoryTest, AllocatesPopulatedRegisteredMemoryAndReleasesIt) {
  FakeRegistrar fake;
  HostMemoryOptions options;
  options.chunk_bytes = 4 * kMB;
  options.threads = 2;
  {
    auto memory = HostMemory::Allocate(10 * kMB + 1, options, fake.Get());
    ASSERT_TRUE(memory.ok()) << memory.status().ToString();
    EXPECT_EQ((*memory)->bytes(), 12 * kMB);
    EXPECT_EQ(reinterpret_cast<uintptr_t>((*memory)->data()) % (2 * kMB), 0u);
    EXPECT_EQ(fake.live_.size(), 3u);
    EXPECT_EQ(Mapping::Resident((*memory)->data(), (*memory)->bytes()),
              (*memory)->bytes() / static_cast<size_t>(sysconf(_SC_PAGESIZE)));
    (*memory)->data()[12 * kMB - 1] = std::byte{7};
  }
  EXPECT_TRUE(fake.live_.empty());
}

// The VmFlags of the mapping that holds `p` (/proc/self/smaps: "hg" = MADV_HUGEPAGE, "ht" =
// hugetlb); empty if it cannot be read.
std::string VmFlagsOf(const void* p) {
  std::ifstream smaps("/proc/self/smaps");
  const uintptr_t at = reinterpret_cast<uintptr_t>(p);
  bool inside = false;
  for (std::string line; std::getline(smaps, line);) {
    unsigned long begin = 0, end = 0;
    char dash = 0;
    std::istringstream head(line);
    if (head >> std::hex >> begin >> dash >> end && dash == '-') {
      inside = at >= begin && at < end;
    } else if (inside && line.rfind("VmFlags:", 0) == 0) {
      return line.substr(8) + " ";
    }
  }
  return "";
}

TEST(HostMemoryTest, AsksForHugePagesUnlessToldNotTo) {
  FakeRegistrar fake;
  HostMemoryOptions options;
  options.chunk_bytes = 4 * kMB;
  options.threads = 2;
  auto huge = HostMemory::Allocate(8 * kMB, options, fake.Get());
  ASSERT_TRUE(huge.ok()) << huge.status().ToString();
  const std::string flags = VmFlagsOf((*huge)->data());
  // Every Linux since 3.8 lists a mapping's VmFlags.
  ASSERT_FALSE(flags.empty()) << "no VmFlags line for the mapping in /proc/self/smaps";
  // Reserved huge pages where the machine has them free, else transparent ones asked for.
  EXPECT_NE(flags.find((*huge)->huge_tlb() ? " ht " : " hg "), std::string::npos) << flags;

  options.huge_pages = false;
  auto ordinary = HostMemory::Allocate(8 * kMB, options, fake.Get());
  ASSERT_TRUE(ordinary.ok()) << ordinary.status().ToString();
  EXPECT_FALSE((*ordinary)->huge_tlb());
  const std::string plain = VmFlagsOf((*ordinary)->data());
  EXPECT_EQ(plain.find(" hg "), std::string::npos) << plain;
  EXPECT_EQ(plain.find(" ht "), std::string::npos) << plain;
}

// Teardown unregisters the chunks on several threads at once, not one after another: with 4
// threads, 4 unregistrations are in flight together (each waits, up to a bound, for the others).
TEST(RegisterHostRangeTest, ReleaseUnregistersChunksInParallel) {
  const size_t bytes = 32 * kMB;
  Mapping m(bytes);
  ASSERT_NE(m.data(), nullptr);
  std::mutex mu;
  std::condition_variable cv;
  int in_flight = 0, most = 0;
  HostRegistrar registrar{[](void*, size_t) { return Status::Ok(); },
                          [&](void*) {
                            std::unique_lock<std::mutex> lock(mu);
                            most = std::max(most, ++in_flight);
                            cv.notify_all();
                            cv.wait_for(lock, std::chrono::seconds(5), [&] { return most >= 4; });
                            --in_flight;
                          }};
  HostMemoryOptions options;
  options.chunk_bytes = 2 * kMB;  // 16 chunks
  options.threads = 4;
  options.huge_pages = false;
  auto r = RegisterHostRange(m.data(), bytes, options, registrar);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const auto start = std::chrono::steady_clock::now();
  (*r)->Release();
  EXPECT_EQ(most, 4);
  // Bounded: no chunk waited out the 5-s bound.
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
}

TEST(HostMemoryTest, FailedRegistrationUnmapsAndUnregisters) {
  FakeRegistrar fake;
  fake.fail_at = 2;
  HostMemoryOptions options;
  options.chunk_bytes = 2 * kMB;
  auto memory = HostMemory::Allocate(8 * kMB, options, fake.Get());
  ASSERT_FALSE(memory.ok());
  EXPECT_TRUE(fake.live_.empty());
}

TEST(HostMemoryTest, BackendRegistrarOfTheCpuBackendSucceeds) {
  std::shared_ptr<Backend> cpu = CreateCpuBackend();
  auto memory = HostMemory::Allocate(4 * kMB, {}, HostRegistrar::Of(*cpu));
  ASSERT_TRUE(memory.ok()) << memory.status().ToString();
  EXPECT_EQ((*memory)->registration().chunks().size(), 1u);
}

TEST(NumaTest, PciDeviceWithoutSysfsEntryHasNoNode) {
  EXPECT_EQ(NumaNodeOfPciDevice("ffff:ff:ff.7"), -1);
  EXPECT_EQ(NumaNodeCores(-1), 0);
  EXPECT_EQ(NumaNodeCores(4095), 0);
}

}  // namespace
}  // namespace sparsekv
