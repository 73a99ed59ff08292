// Statistics on its own, over the CPU backend: how Read sums the device counters (a shared
// top-k counts once per layer that copies it, a prefetch once per group), what Reset clears,
// and the bytes a replayed step counts.
#include "manager/statistics.h"

#include <gtest/gtest.h>

#include <memory>

namespace sparsekv {
namespace {

// Three layers of rows of 10 bytes (stride 16) in index groups of two: groups 0 (layers 0, 1)
// and 1 (layer 2).
CacheOptions Options() {
  CacheOptions o;
  o.geometry = KVGeometry::Uniform(3, 16);
  for (LayerShape& shape : o.geometry.layers) shape.row_bytes = 10;
  o.layers_per_index = 2;
  return o;
}

class StatisticsTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(stats_.Allocate().ok()); }
  // Writes `c` into the device counters at `at`, as a resolve would.
  void Write(ResolveCounters* at, const ResolveCounters& c) {
    ASSERT_TRUE(backend_->CopyAsync(at, &c, sizeof(c), nullptr).ok());
  }

  CacheOptions options_ = Options();
  std::shared_ptr<Backend> backend_ = CreateCpuBackend();
  Statistics stats_{options_, *backend_};
};

TEST_F(StatisticsTest, StartsAtZero) {
  StatusOr<CacheStats> s = stats_.Read(nullptr);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  ASSERT_EQ(s->layers.size(), 3u);
  EXPECT_EQ(s->total.hits + s->total.misses, 0u);
  EXPECT_EQ(s->bytes_host_to_device, 0u);
  EXPECT_EQ(s->invalid_copy_entries, 0u);
  EXPECT_EQ(stats_.device_bytes(), static_cast<int64_t>(6 * sizeof(ResolveCounters) + 8));
}

TEST_F(StatisticsTest, ReadSumsTheDeviceCountersPerLayerAndGroup) {
  // Group 0's resolve counts in layer 0, group 1's in layer 2; what layer 1 holds is not read.
  Write(stats_.resolve_counters(0), {.hits = 5, .window_hits = 1, .misses = 3, .padding = 2});
  Write(stats_.resolve_counters(1), {.hits = 1000, .misses = 1000});
  Write(stats_.resolve_counters(2),
        {.misses = 4, .duplicates = 1, .out_of_range = 1, .resident_hits = 6});
  Write(stats_.prefetch_counters(0),
        {.hits = 2, .window_hits = 1, .misses = 7, .resident_hits = 1});
  Write(stats_.prefetch_counters(2), {.misses = 1});
  const unsigned long long invalid = 9;
  ASSERT_TRUE(
      backend_->CopyAsync(stats_.invalid_copies(), &invalid, sizeof(invalid), nullptr).ok());
  stats_.host().bytes_host_to_device = 100;
  stats_.host().demotions = 2;

  StatusOr<CacheStats> s = stats_.Read(nullptr);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->layers[0].hits, 5u);
  EXPECT_EQ(s->layers[1].hits, 5u);  // layer 1 copies what layer 0 resolved
  EXPECT_EQ(s->layers[1].misses, 3u);
  EXPECT_EQ(s->layers[2].resident_hits, 6u);
  EXPECT_EQ(s->total.hits, 10u);
  EXPECT_EQ(s->total.window_hits, 2u);
  EXPECT_EQ(s->total.misses, 10u);
  EXPECT_EQ(s->total.padding, 4u);
  EXPECT_EQ(s->total.duplicates, 1u);
  EXPECT_EQ(s->total.out_of_range, 1u);
  EXPECT_EQ(s->total.resident_hits, 6u);
  // Lookups and rows of a prefetch count once per group; its copies once per layer.
  EXPECT_EQ(s->prefetch_lookups, 11u + 1u);
  EXPECT_EQ(s->prefetch_rows, 8u);
  // The host's bytes, the misses of every layer and the prefetched rows of every layer.
  EXPECT_EQ(s->bytes_host_to_device, 100u + (3 + 3 + 4) * 10u + (7 + 7 + 1) * 10u);
  EXPECT_EQ(s->invalid_copy_entries, 9u);
  EXPECT_EQ(s->demotions, 2u);
  EXPECT_EQ(s->device_bytes, 0);  // a gauge: the manager's to fill
}

TEST_F(StatisticsTest, ReadSumsThePrefetchOutcomeOncePerGroup) {
  // The step resolves count useful, wasted and missed rows; a prefetch's resolve only wasted ones.
  Write(stats_.resolve_counters(0),
        {.misses = 3, .prefetch_useful = 4, .prefetch_wasted = 1, .prefetch_missed = 3});
  Write(stats_.resolve_counters(1), {.prefetch_useful = 1000});  // layer 1 shares group 0's
  Write(stats_.resolve_counters(2), {.prefetch_useful = 2, .prefetch_missed = 5});
  Write(stats_.prefetch_counters(0), {.misses = 8, .prefetch_wasted = 2});
  Write(stats_.prefetch_counters(2), {.misses = 2});
  StatusOr<CacheStats> s = stats_.Read(nullptr);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->prefetch_rows, 10u);
  EXPECT_EQ(s->prefetch_useful_rows, 6u);
  EXPECT_EQ(s->prefetch_wasted_rows, 3u);
  EXPECT_EQ(s->prefetch_missed_rows, 8u);
  EXPECT_DOUBLE_EQ(s->prefetch_precision(), 6.0 / 10.0);
  EXPECT_DOUBLE_EQ(s->prefetch_recall(), 6.0 / (6.0 + 8.0));
}

TEST(CacheStatsTest, PrefetchRatiosAreZeroWithNothingToDivideBy) {
  CacheStats s;
  EXPECT_EQ(s.prefetch_precision(), 0.0);
  EXPECT_EQ(s.prefetch_recall(), 0.0);
  s.prefetch_missed_rows = 4;
  EXPECT_EQ(s.prefetch_recall(), 0.0);
  s.prefetch_rows = 2;
  s.prefetch_useful_rows = 1;
  EXPECT_DOUBLE_EQ(s.prefetch_precision(), 0.5);
  EXPECT_DOUBLE_EQ(s.prefetch_recall(), 0.2);
}

TEST_F(StatisticsTest, ResetClearsEveryCounter) {
  Write(stats_.resolve_counters(0), {.hits = 5});
  Write(stats_.prefetch_counters(2), {.misses = 1});
  const unsigned long long invalid = 9;
  ASSERT_TRUE(
      backend_->CopyAsync(stats_.invalid_copies(), &invalid, sizeof(invalid), nullptr).ok());
  stats_.host().evictions = 3;
  ASSERT_TRUE(stats_.Reset(nullptr).ok());
  StatusOr<CacheStats> s = stats_.Read(nullptr);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->total.hits, 0u);
  EXPECT_EQ(s->prefetch_rows, 0u);
  EXPECT_EQ(s->invalid_copy_entries, 0u);
  EXPECT_EQ(s->evictions, 0u);
}

TEST_F(StatisticsTest, AReplayedStepCountsTheBytesOfTheLastCompleteRunPhase) {
  EXPECT_FALSE(stats_.run_phase_recorded());
  stats_.BeginStep();
  for (int32_t l = 0; l < 3; ++l) {
    stats_.CountAppend(2, 10);
    stats_.CountAssemble(2, 4, 10);
  }
  EXPECT_EQ(stats_.host().bytes_device_to_host, 2u * 3 * 10);
  EXPECT_EQ(stats_.host().bytes_assembled, 2u * 3 * 4 * 10);
  EXPECT_FALSE(stats_.run_phase_recorded());  // until the step finishes
  stats_.RecordRunPhase();
  EXPECT_TRUE(stats_.run_phase_recorded());

  // A replay of a batch of 5 counts 5 requests' worth: 30 bytes written back, 120 assembled each.
  stats_.CountReplayedStep(5);
  EXPECT_EQ(stats_.host().bytes_device_to_host, 60u + 5 * 30);
  EXPECT_EQ(stats_.host().bytes_assembled, 240u + 5 * 120);

  // A step begun but not finished leaves the recorded bytes as they were.
  stats_.BeginStep();
  stats_.CountAppend(1, 10);
  stats_.CountReplayedStep(1);
  EXPECT_EQ(stats_.host().bytes_device_to_host, 210u + 10 + 30);
}

}  // namespace
}  // namespace sparsekv
