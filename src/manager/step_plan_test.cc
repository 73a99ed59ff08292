// StepPlan on its own, over the CPU backend: the plan region's layout and what Begin and Upload
// write, the step lists' alternation and chunks, and the lanes.
#include "manager/step_plan.h"

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <vector>

#include "testing/workload.h"

namespace sparsekv {
namespace {

// Five layers in index groups of two (groups 0, 1, 2), max_batch 5 in copy chunks of 2 rows
// (chunks 0, 1, 2), top_k 2, prefetch up to 3 positions per row.
CacheOptions Options() {
  CacheOptions o = testing::SmallOptions();
  o.geometry = KVGeometry::Uniform(5, 8);
  o.layers_per_index = 2;
  o.max_requests = 5;
  o.copy_chunk_rows = 2;
  o.max_prefetch = 3;
  return o;
}

class StepPlanTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(plan_.Allocate().ok()); }

  // The device copy of the plan region, read back.
  std::vector<std::byte> DeviceRegion() {
    std::vector<std::byte> out(plan_.layout().bytes);
    EXPECT_TRUE(
        backend_->CopyAsync(out.data(), plan_.batch_size_device(), out.size(), nullptr).ok());
    EXPECT_TRUE(backend_->Synchronize(nullptr).ok());
    return out;
  }

  std::shared_ptr<Backend> backend_ = CreateCpuBackend();
  StepPlan plan_{Options(), *backend_};
};

TEST_F(StepPlanTest, TheRegionIsContiguousAfterA16ByteHeader) {
  const StepPlan::Layout& l = plan_.layout();
  EXPECT_EQ(l.batch_size, 0u);
  EXPECT_EQ(l.batch, 16u);
  EXPECT_EQ(l.append_src, 16 + 5 * sizeof(BatchEntry));
  EXPECT_EQ(l.append_slot, l.append_src + 5 * sizeof(int32_t));
  EXPECT_EQ(l.append_row, l.append_slot + 5 * sizeof(int32_t));
  EXPECT_EQ(l.append_key, l.append_row + 5 * sizeof(int32_t));
  EXPECT_EQ(l.miss_count, l.append_key + 5 * sizeof(int32_t));
  EXPECT_EQ(l.bytes, l.miss_count + 3 * 3 * sizeof(int32_t));  // groups x chunks
  // The region and its two step lists and the prefetch list with its count and slots.
  const int64_t list = 2 * 3 * 4 * sizeof(int32_t);  // rows and slots of 3 chunks x 4 entries
  const int64_t prefetch = 5 * 3 * sizeof(int32_t);
  EXPECT_EQ(plan_.device_bytes(),
            static_cast<int64_t>(l.bytes) + 2 * list + 2 * prefetch + 4 + prefetch);
}

TEST_F(StepPlanTest, BeginClearsTheCountsAndUploadCopiesTheMirror) {
  // append_src is b -> b from the start.
  for (int32_t b = 0; b < 5; ++b) {
    int32_t src = -1;
    std::memcpy(&src, plan_.host() + plan_.layout().append_src + b * sizeof(int32_t), 4);
    EXPECT_EQ(src, b);
  }
  // Counts left in the mirror (as if by an earlier step) are cleared.
  std::vector<int32_t> counts(9, 7);
  std::memcpy(const_cast<std::byte*>(plan_.host()) + plan_.layout().miss_count, counts.data(),
              counts.size() * sizeof(int32_t));
  const StepPlan::Rows rows = plan_.Begin(2);
  rows.entries[0] = BatchEntry{1, 10, 3, kNotResident};
  rows.append_slot[0] = 11;
  rows.append_row[0] = 12;
  rows.append_key[0] = -1;
  ASSERT_TRUE(plan_.Upload(nullptr).ok());
  const std::vector<std::byte> device = DeviceRegion();
  int32_t batch_size = 0;
  std::memcpy(&batch_size, device.data(), 4);
  EXPECT_EQ(batch_size, 2);
  BatchEntry entry{};
  std::memcpy(&entry, device.data() + plan_.layout().batch, sizeof(entry));
  EXPECT_EQ(entry.block, 1);
  EXPECT_EQ(entry.seq_len, 10);
  EXPECT_EQ(entry.page_table_row, 3);
  int32_t slot = 0, row = 0;
  std::memcpy(&slot, device.data() + plan_.layout().append_slot, 4);
  std::memcpy(&row, device.data() + plan_.layout().append_row, 4);
  EXPECT_EQ(slot, 11);
  EXPECT_EQ(row, 12);
  std::memcpy(counts.data(), device.data() + plan_.layout().miss_count, 36);
  EXPECT_EQ(counts, std::vector<int32_t>(9, 0));
}

TEST_F(StepPlanTest, TheBatchIsTheLastPlanned) {
  EXPECT_EQ(plan_.batch_size(), 0);
  const std::vector<RequestId> batch = {4, 9};
  plan_.SetBatch(batch);
  EXPECT_EQ(plan_.batch_size(), 2);
  EXPECT_TRUE(plan_.Contains(9));
  EXPECT_FALSE(plan_.Contains(5));
  EXPECT_EQ(plan_.batch()[0], 4u);
}

TEST_F(StepPlanTest, IndexGroupsAlternateBetweenTwoListsWithCountsOfTheirOwn) {
  const MissList g0 = plan_.StepMissList(0);
  EXPECT_EQ(plan_.StepMissList(1).host_row, g0.host_row);  // one group, one list
  const MissList g1 = plan_.StepMissList(2);
  const MissList g2 = plan_.StepMissList(4);
  EXPECT_NE(g1.host_row, g0.host_row);
  EXPECT_EQ(g2.host_row, g0.host_row);
  EXPECT_EQ(g2.slot, g0.slot);
  // Each group's counts, one per chunk, in the plan region.
  const auto* counts =
      reinterpret_cast<const std::byte*>(plan_.batch_size_device()) + plan_.layout().miss_count;
  EXPECT_EQ(reinterpret_cast<const std::byte*>(g0.count), counts);
  EXPECT_EQ(g1.count, g0.count + 3);
  EXPECT_EQ(g2.count, g0.count + 6);
}

TEST_F(StepPlanTest, ChunksSplitAStepList) {
  EXPECT_EQ(plan_.chunks(), 3);
  EXPECT_EQ(plan_.chunk_entries(), 4);  // 2 rows x top_k 2
  EXPECT_EQ(plan_.step_list_capacity(), 12);
  const MissList list = plan_.StepMissList(2);
  const MissList c2 = plan_.Chunk(list, 2);
  EXPECT_EQ(c2.host_row, list.host_row + 8);
  EXPECT_EQ(c2.slot, list.slot + 8);
  EXPECT_EQ(c2.count, list.count + 2);
}

TEST_F(StepPlanTest, LanesAreTheChunksOfBothListsThenThePrefetchList) {
  EXPECT_EQ(plan_.lanes(), 7);
  EXPECT_EQ(plan_.lane_capacity(), 15);  // max_batch x max_prefetch > a chunk's 4
  for (int32_t c = 0; c < 3; ++c) {
    EXPECT_EQ(plan_.Lane(plan_.Chunk(plan_.StepMissList(0), c)), c);
    EXPECT_EQ(plan_.Lane(plan_.Chunk(plan_.StepMissList(2), c)), 3 + c);
  }
  EXPECT_EQ(plan_.Lane(plan_.prefetch_list()), 6);
  int32_t elsewhere[4];
  EXPECT_EQ(plan_.Lane(MissList{elsewhere, elsewhere, nullptr}), 6);
}

TEST_F(StepPlanTest, ThePrefetchListHasItsOwnCountAndCapacity) {
  const MissList& list = plan_.prefetch_list();
  ASSERT_NE(list.host_row, nullptr);
  ASSERT_NE(list.count, nullptr);
  ASSERT_NE(plan_.prefetch_slots(), nullptr);
  plan_.SetPrefetchCount(2);
  EXPECT_EQ(plan_.prefetch_capacity(), 10);  // max_batch rows of 2
}

TEST(StepPlanNoChunksTest, OneChunkIsTheWholeList) {
  CacheOptions o = testing::SmallOptions();  // max_batch 2, top_k 2, no prefetch
  std::shared_ptr<Backend> backend = CreateCpuBackend();
  StepPlan plan(o, *backend);
  ASSERT_TRUE(plan.Allocate().ok());
  EXPECT_EQ(plan.chunks(), 1);
  EXPECT_EQ(plan.chunk_entries(), 4);
  EXPECT_EQ(plan.lanes(), 3);
  EXPECT_EQ(plan.lane_capacity(), 4);
  EXPECT_EQ(plan.prefetch_list().host_row, nullptr);
  EXPECT_EQ(plan.Lane(plan.StepMissList(0)), 0);
}

// An entry every 4 tokens: of a batch at 3, 4, 8, 9 and 12 tokens (after the step's token), the
// rows at 4, 8 and 12 complete entries 0, 1 and 2 (EntriesAt) and alone form the append list, in
// batch order, with its count on the device.
TEST_F(StepPlanTest, TheAppendListHoldsTheRowsThatCompleteAnEntry) {
  const int32_t tokens[] = {3, 4, 8, 9, 12};
  const StepPlan::Rows rows = plan_.Begin(5);
  for (int32_t b = 0; b < 5; ++b) {
    const LayerEntries e = EntriesAt(tokens[b], 4);
    rows.entries[b] = BatchEntry{b, e.count, b, kNotResident};
    if (e.completed != kNoEntry) plan_.Append(b, 100 + e.completed, 200 + e.completed, -1);
  }
  EXPECT_EQ(plan_.append_count(), 3);
  ASSERT_TRUE(plan_.Upload(nullptr).ok());
  const std::vector<std::byte> device = DeviceRegion();
  int32_t count = 0;
  std::memcpy(&count, plan_.append_count_device(), 4);
  EXPECT_EQ(count, 3);
  const auto list = [&](size_t offset) {
    std::vector<int32_t> v(3);
    std::memcpy(v.data(), device.data() + offset, 3 * sizeof(int32_t));
    return v;
  };
  EXPECT_EQ(list(plan_.layout().append_src), (std::vector<int32_t>{1, 2, 4}));
  EXPECT_EQ(list(plan_.layout().append_slot), (std::vector<int32_t>{100, 101, 102}));
  EXPECT_EQ(list(plan_.layout().append_row), (std::vector<int32_t>{200, 201, 202}));
  // The next step starts an empty list.
  plan_.Begin(1);
  EXPECT_EQ(plan_.append_count(), 0);
}

// GLM-5.3's groups, scaled down: {0}, {1}, {2-3}, the middle group with a top-k of 3 against
// the options' 2. A group's counts follow its group index, and the chunks hold rows of the
// largest top-k, whichever group resolves into them.
TEST(StepPlanGroupsTest, ExplicitGroupsAndTheLargestTopK) {
  CacheOptions o = testing::SmallOptions();  // max_batch 2, top_k 2, hot_slots 3
  o.geometry = KVGeometry::Uniform(4, 8);
  const int32_t group[] = {0, 1, 2, 2};
  for (int32_t l = 0; l < 4; ++l) o.geometry.layers[l].index_group = group[l];
  o.geometry.layers[1].top_k = 3;
  o.copy_chunk_rows = 1;
  std::shared_ptr<Backend> backend = CreateCpuBackend();
  StepPlan plan(o, *backend);
  ASSERT_TRUE(plan.Allocate().ok());
  EXPECT_EQ(plan.layout().bytes, plan.layout().miss_count + 3 * 2 * sizeof(int32_t));
  EXPECT_EQ(plan.chunk_entries(), 3);  // 1 row x the largest top-k
  EXPECT_EQ(plan.step_list_capacity(), 6);
  const MissList g0 = plan.StepMissList(0);
  EXPECT_NE(plan.StepMissList(1).host_row, g0.host_row);
  EXPECT_EQ(plan.StepMissList(2).host_row, g0.host_row);  // group 2, the first list again
  EXPECT_EQ(plan.StepMissList(3).count, g0.count + 4);    // group 2's counts
  EXPECT_EQ(plan.Chunk(g0, 1).host_row, g0.host_row + 3);
}

}  // namespace
}  // namespace sparsekv
