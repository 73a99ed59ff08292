#include "sparsekv/transport.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "testing/ucx_servers.h"

namespace sparsekv {
inline void PrintTo(StatusCode code, std::ostream* os) { *os << StatusCodeName(code); }

namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

using testing::ChildServer;
using testing::PatternByte;

using testing::LoopbackOptions;

// Skips the test when the library was built without UCX.
#define SKIP_WITHOUT_UCX()                                        \
  do {                                                            \
    if (!testing::HaveUcx()) GTEST_SKIP() << "built without UCX"; \
  } while (0)

// `count` random ranges of `row` bytes, at row-aligned remote offsets below `remote_bytes`,
// packed densely into the local buffer.
std::vector<CopyRange> RandomRows(std::mt19937_64& rng, int count, uint64_t row,
                                  uint64_t remote_bytes) {
  std::uniform_int_distribution<uint64_t> pick(0, remote_bytes / row - 1);
  std::vector<CopyRange> ranges;
  for (int i = 0; i < count; ++i) ranges.push_back({pick(rng) * row, i * row, row});
  return ranges;
}

void ExpectPattern(const std::vector<std::byte>& local, std::span<const CopyRange> ranges) {
  for (const CopyRange& r : ranges) {
    for (uint64_t i = 0; i < r.length; ++i) {
      ASSERT_EQ(local[r.local_offset + i], PatternByte(r.remote_offset + i))
          << "remote offset " << r.remote_offset + i;
    }
  }
}

TEST(MergeAdjacentRangesTest, MergesRunsContiguousOnBothSidesAndSortsByRemoteOffset) {
  const std::vector<CopyRange> in = {{200, 100, 100}, {0, 0, 100},   {100, 50, 50},
                                     {300, 200, 100}, {500, 300, 0}, {150, 900, 10}};
  const std::vector<CopyRange> expected = {
      {0, 0, 100}, {100, 50, 50}, {150, 900, 10}, {200, 100, 200}};
  EXPECT_EQ(MergeAdjacentRanges(in), expected);
}

TEST(MergeAdjacentRangesTest, ConsecutiveRowsBecomeOneRange) {
  std::vector<CopyRange> rows;
  for (uint64_t i = 0; i < 64; ++i) rows.push_back({(63 - i) * 656, (63 - i) * 656, 656});
  const std::vector<CopyRange> expected = {{0, 0, 64 * 656}};
  EXPECT_EQ(MergeAdjacentRanges(rows), expected);
}

class UcxTransportTest : public ::testing::TestWithParam<std::string> {};

TEST_P(UcxTransportTest, ReadsRandomRowsByteExactly) {
  SKIP_WITHOUT_UCX();
  testing::ThreadServer server(GetParam(), 1 << 22);
  auto client = CreateUcxTransport(LoopbackOptions(GetParam()));
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  std::vector<std::byte> local(2048 * 656);
  auto local_region = (*client)->RegisterRegion(local.data(), local.size());
  ASSERT_TRUE(local_region.ok());
  auto remote = (*client)->ImportRegion(server.descriptor());
  ASSERT_TRUE(remote.ok()) << remote.status().ToString();
  EXPECT_EQ(remote->bytes, uint64_t{1} << 22);
  std::mt19937_64 rng(7);
  for (int round = 0; round < 3; ++round) {
    const std::vector<CopyRange> ranges = RandomRows(rng, 2048, 656, 1 << 22);
    auto transfer = (*client)->Read(*remote, *local_region, ranges);
    ASSERT_TRUE(transfer.ok()) << transfer.status().ToString();
    ASSERT_TRUE(transfer->Wait().ok());
    EXPECT_TRUE(transfer->Done());
    ExpectPattern(local, ranges);
  }
}

TEST_P(UcxTransportTest, WritesAreVisibleInTheRemoteRegion) {
  SKIP_WITHOUT_UCX();
  testing::ThreadServer server(GetParam(), 1 << 20);
  auto client = CreateUcxTransport(LoopbackOptions(GetParam()));
  ASSERT_TRUE(client.ok());
  std::vector<std::byte> local(64 * 1152);
  for (size_t i = 0; i < local.size(); ++i) local[i] = static_cast<std::byte>(i * 7 + 1);
  auto local_region = (*client)->RegisterRegion(local.data(), local.size());
  auto remote = (*client)->ImportRegion(server.descriptor());
  ASSERT_TRUE(local_region.ok() && remote.ok());
  std::mt19937_64 rng(11);
  std::vector<CopyRange> ranges;
  // Distinct remote rows, so that every write lands.
  for (uint64_t i = 0; i < 64; ++i) ranges.push_back({(i * 13 + 5) * 1152, i * 1152, 1152});
  auto transfer = (*client)->Write(*remote, *local_region, ranges);
  ASSERT_TRUE(transfer.ok());
  ASSERT_TRUE(transfer->Wait().ok());
  for (const CopyRange& r : ranges) {
    ASSERT_EQ(std::memcmp(server.memory().data() + r.remote_offset, local.data() + r.local_offset,
                          r.length),
              0);
  }
}

TEST_P(UcxTransportTest, RejectsRangesOutsideEitherRegion) {
  SKIP_WITHOUT_UCX();
  testing::ThreadServer server(GetParam(), 4096);
  auto client = CreateUcxTransport(LoopbackOptions(GetParam()));
  ASSERT_TRUE(client.ok());
  std::vector<std::byte> local(1024);
  auto local_region = (*client)->RegisterRegion(local.data(), local.size());
  auto remote = (*client)->ImportRegion(server.descriptor());
  ASSERT_TRUE(local_region.ok() && remote.ok());
  const CopyRange past_remote[] = {{4000, 0, 200}};
  EXPECT_EQ((*client)->Read(*remote, *local_region, past_remote).status().code(),
            StatusCode::kOutOfRange);
  const CopyRange past_local[] = {{0, 1000, 100}};
  EXPECT_EQ((*client)->Write(*remote, *local_region, past_local).status().code(),
            StatusCode::kOutOfRange);
  const CopyRange wrapping[] = {{~uint64_t{0} - 10, 0, 100}};
  EXPECT_EQ((*client)->Read(*remote, *local_region, wrapping).status().code(),
            StatusCode::kOutOfRange);
  auto empty = (*client)->Read(*remote, *local_region, {});
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE(empty->Wait().ok());
}

TEST_P(UcxTransportTest, RejectsMalformedDescriptorsAndUnknownHandles) {
  SKIP_WITHOUT_UCX();
  auto client = CreateUcxTransport(LoopbackOptions(GetParam()));
  ASSERT_TRUE(client.ok());
  EXPECT_EQ((*client)->ImportRegion("not a descriptor").status().code(),
            StatusCode::kInvalidArgument);
  testing::ThreadServer server(GetParam(), 4096);
  std::string truncated = server.descriptor();
  truncated.pop_back();
  EXPECT_EQ((*client)->ImportRegion(truncated).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ((*client)->RegisterRegion(nullptr, 10).status().code(), StatusCode::kInvalidArgument);
  std::vector<std::byte> local(64);
  auto local_region = (*client)->RegisterRegion(local.data(), local.size());
  ASSERT_TRUE(local_region.ok());
  EXPECT_EQ((*client)->ExportRegion(RegionHandle{999, nullptr, 1}).status().code(),
            StatusCode::kNotFound);
  const CopyRange one[] = {{0, 0, 8}};
  EXPECT_EQ((*client)->Read(RemoteRegion{999, 64}, *local_region, one).status().code(),
            StatusCode::kNotFound);
  EXPECT_TRUE((*client)->UnregisterRegion(*local_region).ok());
  EXPECT_EQ((*client)->UnregisterRegion(*local_region).code(), StatusCode::kNotFound);
}

TEST_P(UcxTransportTest, ReadsFromAnotherProcess) {
  SKIP_WITHOUT_UCX();
  ChildServer child(GetParam(), 1 << 22);
  auto client = CreateUcxTransport(LoopbackOptions(GetParam()));
  ASSERT_TRUE(client.ok());
  std::vector<std::byte> local(2048 * 1152);
  auto local_region = (*client)->RegisterRegion(local.data(), local.size());
  auto remote = (*client)->ImportRegion(child.descriptor());
  ASSERT_TRUE(local_region.ok() && remote.ok()) << remote.status().ToString();
  std::mt19937_64 rng(3);
  const std::vector<CopyRange> ranges = RandomRows(rng, 2048, 1152, 1 << 22);
  auto transfer = (*client)->Read(*remote, *local_region, MergeAdjacentRanges(ranges));
  ASSERT_TRUE(transfer.ok());
  ASSERT_TRUE(transfer->Wait().ok());
  ExpectPattern(local, ranges);
}

// A killed peer fails the transfers to it with a clear error, in bounded time; a restarted peer is
// reachable again through its new descriptor.
TEST_P(UcxTransportTest, KilledPeerFailsTransfersAndRestartedPeerServesAgain) {
  SKIP_WITHOUT_UCX();
  auto client = CreateUcxTransport(LoopbackOptions(GetParam(), milliseconds(2000)));
  ASSERT_TRUE(client.ok());
  std::vector<std::byte> local(256 * 656);
  auto local_region = (*client)->RegisterRegion(local.data(), local.size());
  ASSERT_TRUE(local_region.ok());
  std::mt19937_64 rng(5);
  const std::vector<CopyRange> ranges = RandomRows(rng, 256, 656, 1 << 20);

  auto child = std::make_unique<ChildServer>(GetParam(), 1 << 20);
  auto remote = (*client)->ImportRegion(child->descriptor());
  ASSERT_TRUE(remote.ok());
  {
    auto transfer = (*client)->Read(*remote, *local_region, ranges);
    ASSERT_TRUE(transfer.ok());
    ASSERT_TRUE(transfer->Wait().ok());
  }
  child->Kill();
  const Clock::time_point start = Clock::now();
  Status failure;
  // The first transfers after the death may still start; one of them fails, and from then on
  // every transfer to the peer fails at once.
  for (int attempt = 0; attempt < 10 && failure.ok(); ++attempt) {
    auto transfer = (*client)->Read(*remote, *local_region, ranges);
    failure = transfer.ok() ? transfer->Wait() : transfer.status();
  }
  ASSERT_FALSE(failure.ok()) << "reads from a killed peer kept succeeding";
  EXPECT_TRUE(failure.code() == StatusCode::kUnavailable ||
              failure.code() == StatusCode::kDeadlineExceeded)
      << failure.ToString();
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(15));
  EXPECT_EQ((*client)->Read(*remote, *local_region, ranges).status().code(),
            StatusCode::kUnavailable);
  EXPECT_TRUE((*client)->ReleaseRemote(*remote).ok());

  child = std::make_unique<ChildServer>(GetParam(), 1 << 20);
  auto again = (*client)->ImportRegion(child->descriptor());
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  auto transfer = (*client)->Read(*again, *local_region, ranges);
  ASSERT_TRUE(transfer.ok()) << transfer.status().ToString();
  ASSERT_TRUE(transfer->Wait().ok());
  ExpectPattern(local, ranges);
}

INSTANTIATE_TEST_SUITE_P(Transports, UcxTransportTest, ::testing::Values("tcp", "shm"),
                         [](const auto& info) { return info.param; });

// Over TCP, UCX serves one-sided reads in the target's software: a stopped (hung) peer never
// answers, so a short WaitFor reports DeadlineExceeded while the transfer goes on, and Wait aborts
// it at its deadline.
TEST(UcxTransportTimeoutTest, HungPeerHitsTheDeadline) {
  SKIP_WITHOUT_UCX();
  ChildServer child("tcp", 1 << 20);
  auto client = CreateUcxTransport(LoopbackOptions("tcp", milliseconds(1000)));
  ASSERT_TRUE(client.ok());
  std::vector<std::byte> local(64 * 656);
  auto local_region = (*client)->RegisterRegion(local.data(), local.size());
  auto remote = (*client)->ImportRegion(child.descriptor());
  ASSERT_TRUE(local_region.ok() && remote.ok());
  std::mt19937_64 rng(9);
  const std::vector<CopyRange> ranges = RandomRows(rng, 64, 656, 1 << 20);
  {
    auto warm = (*client)->Read(*remote, *local_region, ranges);
    ASSERT_TRUE(warm.ok());
    ASSERT_TRUE(warm->Wait().ok());
  }
  child.Stop();
  auto transfer = (*client)->Read(*remote, *local_region, ranges);
  ASSERT_TRUE(transfer.ok());
  EXPECT_EQ(transfer->WaitFor(milliseconds(50)).code(), StatusCode::kDeadlineExceeded);
  EXPECT_FALSE(transfer->Done());
  const Clock::time_point start = Clock::now();
  EXPECT_EQ(transfer->Wait().code(), StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(transfer->Done());
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(5));
  EXPECT_EQ((*client)->Read(*remote, *local_region, ranges).status().code(),
            StatusCode::kUnavailable);
}

}  // namespace
}  // namespace sparsekv
