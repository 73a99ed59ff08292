// Tests of the KV footprint arithmetic: footprints, batch limits, sweeps, traffic and floors.
#include "sparsekv/kv_footprint.h"

#include <gtest/gtest.h>

#include <cstdint>

namespace sparsekv {
namespace {

RequestShape Standard(int64_t tokens) {
  RequestShape s;  // DeepSeek-V3.2, fp8 rows, K 2048, C 4096, W 1, 64-token pages
  s.tokens = tokens;
  return s;
}

TEST(E2EPlanTest, FootprintsFollowTheirFormulas) {
  const RequestShape s = Standard(32768);
  const RequestFootprint full = Footprint(KVVariant::kFullHbm, s);
  EXPECT_EQ(full.hbm_bytes, int64_t{32768} * 61 * (656 + 132) + 2048 * 4);
  EXPECT_EQ(full.host_bytes, 0);
  const RequestFootprint sparse = Footprint(KVVariant::kSparseKV, s);
  // Rows, then per layer the clock's state: tokens and use counts of 4096 slots, its hand and the
  // slot of each of the 32768 positions.
  const int64_t block = int64_t{61} * 4097 * 656 + int64_t{61} * (4096 * 5 + 4 + 32768 * 4);
  EXPECT_EQ(sparse.hbm_bytes, block + int64_t{32768} * 61 * 132 + 512 * 4 + 2048 * (4 * 5 + 1));
  EXPECT_EQ(sparse.host_bytes, int64_t{32768} * 61 * 656);
  const RequestFootprint none = Footprint(KVVariant::kNoCache, s);
  EXPECT_EQ(none.hbm_bytes, int64_t{32768} * 61 * 132 + 2048 * (656 + 8));
  EXPECT_EQ(none.host_bytes, int64_t{32768} * 61 * 656);
  // Host pages are whole: one more token costs a page.
  EXPECT_EQ(Footprint(KVVariant::kSparseKV, Standard(32769)).host_bytes,
            int64_t{32768 + 64} * 61 * 656);
}

TEST(E2EPlanTest, MaxBatchOfTheStandardScenario) {
  const int64_t hbm = 49'000'000'000, host = 100'000'000'000;
  EXPECT_EQ(MaxBatch(KVVariant::kFullHbm, Standard(32768), hbm, host, 0), 31);
  EXPECT_EQ(MaxBatch(KVVariant::kFullHbm, Standard(16384), hbm, host, 0), 62);
  // sparsekv: HBM admits 112 at 32K (173 MB hot cache + 264 MB indexer keys), the host pool 76.
  EXPECT_EQ(MaxBatch(KVVariant::kSparseKV, Standard(32768), hbm, 1'000'000'000'000, 0), 112);
  EXPECT_EQ(MaxBatch(KVVariant::kSparseKV, Standard(32768), hbm, host, 0), 76);
  EXPECT_EQ(MaxBatch(KVVariant::kSparseKV, Standard(32768), hbm, host, 40), 40);  // --max-batch
  EXPECT_EQ(MaxBatch(KVVariant::kFullHbm, Standard(32768), 1'000'000'000, host, 0), 0);
}

TEST(E2EPlanTest, PageOffloadCachesTheHotCacheBytesInPagesAndStagesTheRest) {
  const RequestShape s = Standard(32768);
  const PageOffloadPages p = OffloadPages(s);
  EXPECT_EQ(p.pages, 512);
  EXPECT_EQ(p.cached, 64);    // 4096 hot slots / 64 tokens
  EXPECT_EQ(p.staging, 512);  // min(top-k, pages)
  EXPECT_EQ(OffloadPages(Standard(131072)).staging, 2048);
  const int64_t page = 64 * 656;
  const RequestFootprint f = Footprint(KVVariant::kPageOffload, s);
  EXPECT_EQ(f.hbm_bytes, int64_t{61} * (65 * page + 64 * 8) + 512 * (page + 8) +
                             int64_t{32768} * 61 * 132 + 512 * 4 + 2048 * 4 * 9);
  EXPECT_EQ(f.host_bytes, int64_t{32768} * 61 * 656);
  // The page is its own option, independent of the host pool's page.
  RequestShape big = s;
  big.page_tokens = 1024;
  EXPECT_EQ(Footprint(KVVariant::kPageOffload, big).hbm_bytes, f.hbm_bytes);
  big.offload_page_tokens = 128;
  EXPECT_EQ(OffloadPages(big).cached, 32);
  // Its cache has sparsekv's bytes (plus one newest page and the staging pages): a batch close
  // to sparsekv's 114 by HBM, the same 76 by the host pool.
  const int64_t hbm = 49'000'000'000, host = 100'000'000'000;
  const int32_t by_hbm = MaxBatch(KVVariant::kPageOffload, s, hbm, 1'000'000'000'000, 0);
  EXPECT_GT(by_hbm, 90);
  EXPECT_LT(by_hbm, 114);
  EXPECT_EQ(MaxBatch(KVVariant::kPageOffload, s, hbm, host, 0), 76);
  // Every page copied crosses PCIe whole.
  const StepTraffic t = Traffic(KVVariant::kPageOffload, s, 2, 100);
  EXPECT_DOUBLE_EQ(t.pcie_bytes, 100.0 * page + 2.0 * 61 * 656);
  EXPECT_TRUE(DependsOnMissRate(KVVariant::kPageOffload));
  EXPECT_FALSE(DependsOnMissRate(KVVariant::kNoCache));
  EXPECT_EQ(PlanVariant(KVVariant::kPageOffload, s, hbm, host, 0, 3, 16, 2, 8).headroom,
            2 + 3 * 16);  // one point per miss rate
  EXPECT_EQ(ParseVariant("page-offload").value(), KVVariant::kPageOffload);
}

TEST(E2EPlanTest, SweepBatchesArePowersOfTwoThenTheMax) {
  EXPECT_EQ(SweepBatches(0), std::vector<int32_t>{});
  EXPECT_EQ(SweepBatches(1), std::vector<int32_t>{1});
  EXPECT_EQ(SweepBatches(31), (std::vector<int32_t>{1, 2, 4, 8, 16, 31}));
  EXPECT_EQ(SweepBatches(32), (std::vector<int32_t>{1, 2, 4, 8, 16, 32}));
}

TEST(E2EPlanTest, PlanChargesTheDecodeHeadroom) {
  const int64_t hbm = 49'000'000'000, host = 100'000'000'000;
  const VariantPlan full =
      PlanVariant(KVVariant::kFullHbm, Standard(32768), hbm, host, 0, 3, 16, 2, 0);
  EXPECT_EQ(full.headroom, 2 + 6 * 16);  // 6 batch sizes, one point each
  EXPECT_EQ(full.max_batch, 31);
  EXPECT_EQ(full.batches.back(), 31);
  // 2400 tokens of headroom (6 points x 400 steps) cost three requests.
  EXPECT_EQ(PlanVariant(KVVariant::kFullHbm, Standard(32768), hbm, host, 0, 1, 400, 0, 0).max_batch,
            28);
  EXPECT_EQ(full.footprint.hbm_bytes,
            Footprint(KVVariant::kFullHbm, Standard(32768 + 98)).hbm_bytes);
  const VariantPlan sparse =
      PlanVariant(KVVariant::kSparseKV, Standard(32768), hbm, host, 0, 3, 16, 2, 0);
  EXPECT_EQ(sparse.headroom, 2 + 3 * 8 * 16);  // 3 rates x 8 batch sizes (1 .. 64, 76)
  EXPECT_EQ(sparse.batches.back(), sparse.max_batch);
  // One batch asked for: one point per rate; a batch above the max runs nothing.
  EXPECT_EQ(PlanVariant(KVVariant::kSparseKV, Standard(32768), hbm, host, 0, 3, 16, 2, 8).batches,
            std::vector<int32_t>{8});
  EXPECT_TRUE(PlanVariant(KVVariant::kFullHbm, Standard(32768), hbm, host, 0, 1, 16, 2, 64)
                  .batches.empty());
}

TEST(E2EPlanTest, FloorAddsTransfersAtTheirCeilingsToAttentionAndProxy) {
  const RequestShape s = Standard(32768);
  const Ceilings c{.pcie_h2d_gbps = 50, .pcie_d2h_gbps = 50, .hbm_gbps = 4000};
  // sparsekv, batch 2, 1000 misses per step.
  const StepTraffic t = Traffic(KVVariant::kSparseKV, s, 2, 1000);
  EXPECT_DOUBLE_EQ(t.pcie_bytes, 1000.0 * 656 + 2.0 * 61 * 656);
  EXPECT_DOUBLE_EQ(t.hbm_bytes, 1000.0 * 656 + 2.0 * 61 * (656 + 3 * 2048 * 4 + 4 * 4096 * 4));
  EXPECT_DOUBLE_EQ(StepFloorMs(t, c, 3.0, 20.0), 23.0 + t.pcie_bytes / 50e6 + t.hbm_bytes / 4000e6);
  EXPECT_DOUBLE_EQ(Traffic(KVVariant::kFullHbm, s, 4, 0).pcie_bytes, 0);
  EXPECT_DOUBLE_EQ(Traffic(KVVariant::kNoCache, s, 1, 0).pcie_bytes, 61.0 * 2049 * 656);
  EXPECT_DOUBLE_EQ(StepFloorMs({}, c, 1.5, 2.5), 4.0);
  // Perfect overlap: the longer of PCIe and everything else.
  EXPECT_DOUBLE_EQ(StepIdealMs(t, c, 3.0, 20.0), 23.0 + t.hbm_bytes / 4000e6);
  const StepTraffic heavy{.pcie_bytes = 5e9, .hbm_bytes = 0};
  EXPECT_DOUBLE_EQ(StepIdealMs(heavy, c, 3.0, 20.0), 5e9 / 50e6);
}

}  // namespace
}  // namespace sparsekv
