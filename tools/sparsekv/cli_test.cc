// Tests of the sparsekv tool: the top-k generator, the benchmark on the CPU backend, and the
// command line's handling of good and bad arguments.
#include "tools/sparsekv/cli.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "sparsekv/backend.h"
#include "tools/sparsekv/arena_backend.h"
#include "tools/sparsekv/bench.h"
#include "tools/sparsekv/e2e_plan.h"
#include "tools/sparsekv/e2e_report.h"
#include "tools/sparsekv/page_offload.h"
#include "tools/sparsekv/topk_generator.h"

namespace sparsekv::tools {
namespace {

// ---- Top-k generator ----

// Runs `steps` steps of one layer for one request whose history grows from `seq_len`.
std::vector<std::vector<int32_t>> Rows(const TopKGeneratorOptions& o, int32_t layer,
                                       int32_t seq_len, int32_t steps) {
  LayerTopKGenerator g(o, layer, 1);
  std::vector<std::vector<int32_t>> rows;
  for (int32_t s = 0; s < steps; ++s) {
    const int32_t len = seq_len + s;
    std::vector<int32_t> row(o.top_k);
    g.Next(std::span(&len, 1), row);
    rows.push_back(std::move(row));
  }
  return rows;
}

double Overlap(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  const std::set<int32_t> sa(a.begin(), a.end());
  const auto shared = std::count_if(b.begin(), b.end(), [&](int32_t p) { return sa.contains(p); });
  return static_cast<double>(shared) / static_cast<double>(b.size());
}

TEST(TopKGeneratorTest, RowsAreDistinctPositionsInRange) {
  struct Case {
    int32_t top_k, seq_len, sinks;
    double reuse, recency;
  };
  // Includes K == seq_len (every position), sinks == K, and shares that cannot be met.
  for (const Case& c :
       {Case{64, 64, 4, 0.5, 0.3}, Case{64, 65, 0, 1.0, 0.0}, Case{100, 1000, 100, 0.4, 0.1},
        Case{256, 300, 8, 0.0, 1.0}, Case{512, 20000, 16, 0.45, 0.1}}) {
    TopKGeneratorOptions o;
    o.top_k = c.top_k;
    o.sinks = c.sinks;
    o.reuse = c.reuse;
    o.recency = c.recency;
    LayerTopKGenerator g(o, /*layer=*/3, /*batch=*/3);
    for (int32_t step = 0; step < 8; ++step) {
      // Requests of different lengths in one batch.
      const std::vector<int32_t> lens = {c.seq_len + step, c.seq_len + 2 * step, c.seq_len + 7};
      std::vector<int32_t> out(3 * c.top_k, -7);
      g.Next(lens, out);
      for (int32_t b = 0; b < 3; ++b) {
        const auto first = out.begin() + b * c.top_k;
        const std::set<int32_t> unique(first, first + c.top_k);
        ASSERT_EQ(unique.size(), static_cast<size_t>(c.top_k)) << "K " << c.top_k << " b " << b;
        EXPECT_GE(*unique.begin(), 0);
        EXPECT_LT(*unique.rbegin(), lens[b]);
        for (int32_t p = 0; p < std::min(c.sinks, c.top_k); ++p) EXPECT_TRUE(unique.contains(p));
      }
    }
  }
}

TEST(TopKGeneratorTest, ReuseFractionIsHonoured) {
  TopKGeneratorOptions o;
  o.top_k = 512;
  o.reuse = 0.4;
  o.recency = 0;
  o.sinks = 0;
  // Over 65536 positions a uniform draw repeats a previous position with probability < 1%.
  const auto rows = Rows(o, /*layer=*/10, 65536, 20);
  for (size_t s = 1; s < rows.size(); ++s) {
    EXPECT_NEAR(Overlap(rows[s - 1], rows[s]), 0.4, 0.02) << "step " << s;
  }
}

TEST(TopKGeneratorTest, FirstTwoLayersReuseAlmostNothing) {
  TopKGeneratorOptions o;
  o.top_k = 512;
  o.reuse = 0.5;
  o.sinks = 0;
  o.recency = 0;
  for (int32_t layer : {0, 1}) {
    const auto rows = Rows(o, layer, 65536, 5);
    for (size_t s = 1; s < rows.size(); ++s) EXPECT_LT(Overlap(rows[s - 1], rows[s]), 0.05);
  }
  EXPECT_NEAR(Overlap(Rows(o, 2, 65536, 2)[0], Rows(o, 2, 65536, 2)[1]), 0.5, 0.02);
}

TEST(TopKGeneratorTest, RecencyDrawsFromNewestTenthOfHistory) {
  TopKGeneratorOptions o;
  o.top_k = 1000;
  o.reuse = 0;
  o.recency = 0.5;
  o.sinks = 0;
  const int32_t len = 100000;
  const auto row = Rows(o, 5, len, 1)[0];
  const auto recent =
      std::count_if(row.begin(), row.end(), [&](int32_t p) { return p >= len - len / 10; });
  // 500 recent draws, plus ~10% of the 500 uniform ones.
  EXPECT_NEAR(static_cast<double>(recent) / o.top_k, 0.55, 0.04);
}

TEST(TopKGeneratorTest, SameSeedSameRows) {
  TopKGeneratorOptions o;
  o.top_k = 128;
  EXPECT_EQ(Rows(o, 4, 5000, 4), Rows(o, 4, 5000, 4));
  TopKGeneratorOptions other = o;
  other.seed = 2;
  EXPECT_NE(Rows(o, 4, 5000, 4), Rows(other, 4, 5000, 4));
  EXPECT_NE(Rows(o, 4, 5000, 1), Rows(o, 5, 5000, 1));  // layers draw independent streams
}

TEST(TopKGeneratorTest, MissRateModeReplacesExactlyTheTargetShare) {
  TopKGeneratorOptions o;
  o.top_k = 256;
  o.miss_rate = 0.2;
  o.fresh_range = 20000;
  const int32_t fresh = 51;  // round(0.2 * 256)
  const auto rows = Rows(o, /*layer=*/0, 20001, 30);
  for (size_t s = 0; s < rows.size(); ++s) {
    const std::set<int32_t> unique(rows[s].begin(), rows[s].end());
    ASSERT_EQ(unique.size(), 256u);
    EXPECT_EQ(rows[s][0], 20000 + static_cast<int32_t>(s));  // the newest position first
    EXPECT_LT(*std::next(unique.rbegin()), 20000);           // the rest from the fresh range
    if (s == 0) continue;
    // Everything but the newest position and the fresh ones is kept from the previous row.
    const std::set<int32_t> previous(rows[s - 1].begin() + 1, rows[s - 1].end());
    const auto kept = std::count_if(rows[s].begin() + 1, rows[s].end(),
                                    [&](int32_t p) { return previous.contains(p); });
    EXPECT_EQ(kept, 256 - 1 - fresh) << "step " << s;
  }
}

TEST(TopKGeneratorTest, MissRateModeRunsPartOfTheBatch) {
  TopKGeneratorOptions o;
  o.top_k = 64;
  o.miss_rate = 0.5;
  o.fresh_range = 1000;
  LayerTopKGenerator g(o, 0, /*batch=*/4);
  std::vector<int32_t> out(4 * 64, -7);
  const std::vector<int32_t> two = {1001, 1001};
  g.Next(two, out);  // requests 0 and 1 only
  EXPECT_EQ(out[2 * 64], -7);
  g.set_miss_rate(0.0);
  const std::vector<int32_t> next = {1002, 1002};
  std::vector<int32_t> again(2 * 64);
  g.Next(next, again);
  // Rate 0: everything but the newest position is kept.
  EXPECT_EQ(std::set<int32_t>(out.begin() + 1, out.begin() + 64),
            std::set<int32_t>(again.begin() + 1, again.begin() + 64));
}

// ---- End-to-end arithmetic (e2e_plan.h) ----

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
  const int64_t block = int64_t{61} * 4097 * 656 + int64_t{61} * (4096 * 8 + 4);
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
  // sparsekv: HBM admits 113 at 32K (166 MB hot cache + 264 MB indexer keys), the host pool 76.
  EXPECT_EQ(MaxBatch(KVVariant::kSparseKV, Standard(32768), hbm, 1'000'000'000'000, 0), 113);
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

TEST(E2EPlanTest, OffloadMaxBatchCapsOnlyPageOffload) {
  BenchConfig c;
  EXPECT_EQ(BatchCap(c, KVVariant::kPageOffload), 0);
  c.offload_max_batch = 16;
  EXPECT_EQ(BatchCap(c, KVVariant::kPageOffload), 16);
  EXPECT_EQ(BatchCap(c, KVVariant::kSparseKV), 0);
  c.max_batch = 8;
  EXPECT_EQ(BatchCap(c, KVVariant::kPageOffload), 8);
  EXPECT_EQ(BatchCap(c, KVVariant::kFullHbm), 8);
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

TEST(E2EReportTest, SummaryKeysComeFromThe32KPoints) {
  E2EReport r;
  auto add = [&](KVVariant v, std::optional<double> rate, int32_t batch, double tpot,
                 double floor) {
    E2EPoint p;
    p.variant = v;
    p.context = 32768;
    p.miss_rate_target = rate;
    p.batch = batch;
    p.tpot_ms = tpot;
    p.tokens_per_s = batch * 1e3 / tpot;
    p.floor_ms = floor;
    p.ideal_ms = floor;  // the summary's ideal bound reads ideal_ms
    p.step_to_floor = tpot / floor;
    r.points.push_back(p);
  };
  add(KVVariant::kFullHbm, std::nullopt, 1, 20, 19);
  add(KVVariant::kFullHbm, std::nullopt, 30, 30, 25);  // peak 1000 tok/s
  add(KVVariant::kSparseKV, 0.2, 1, 22, 20);
  add(KVVariant::kSparseKV, 0.2, 60, 40, 32);  // peak 1500 tok/s, ideal 60 / 32 ms
  add(KVVariant::kSparseKV, 0.05, 1, 21, 20);
  add(KVVariant::kPageOffload, 0.2, 8, 40, 30);   // peak 200 tok/s
  add(KVVariant::kPageOffload, 0.05, 8, 20, 15);  // another miss rate: not the key's
  const nlohmann::json j = nlohmann::json::parse(FormatE2ESummaryJson(r));
  EXPECT_DOUBLE_EQ(j["e2e_throughput_ratio_vs_full_hbm_32k_m20"].get<double>(), 1.5);
  EXPECT_DOUBLE_EQ(j["e2e_throughput_to_ideal_32k_m20"].get<double>(), 1500.0 / 1875.0);
  EXPECT_DOUBLE_EQ(j["e2e_throughput_ratio_vs_page_offload_32k_m20"].get<double>(), 1500.0 / 200);
  EXPECT_DOUBLE_EQ(j["e2e_tpot_overhead_b1_m5"].get<double>(), 21.0 / 20 - 1);
  EXPECT_DOUBLE_EQ(j["e2e_tpot_overhead_b1_m20"].get<double>(), 22.0 / 20 - 1);
  EXPECT_DOUBLE_EQ(j["e2e_step_to_floor_ratio"].get<double>(), 40.0 / 32);
  const nlohmann::json full = nlohmann::json::parse(FormatE2EJson(r));
  EXPECT_EQ(full["points"].size(), 7u);
  EXPECT_EQ(full["summary"], j);
  EXPECT_EQ(full["points"][5]["variant"], "page-offload");
  const std::string csv = FormatE2ECsv(r);
  EXPECT_EQ(std::count(csv.begin(), csv.end(), '\n'), 8);  // header + 7 points
  EXPECT_NE(csv.find(",page-offload,32768,0.2,8,"), std::string::npos) << csv;
  EXPECT_NE(FormatE2ETable(r).find("  page-offload   32K   20%     8"), std::string::npos)
      << FormatE2ETable(r);
  EXPECT_TRUE(nlohmann::json::parse(
                  FormatE2ESummaryJson(E2EReport{}))["e2e_throughput_ratio_vs_full_hbm_32k_m20"]
                  .is_null());
}

TEST(ArenaBackendTest, HandsOutPiecesAndStartsOverWhenAllAreFreed) {
  auto arena = ArenaBackend::Create(CreateCpuBackend(), 6 << 20);
  ASSERT_TRUE(arena.ok()) << arena.status().ToString();
  auto a = (*arena)->AllocateHost(1);
  auto b = (*arena)->AllocateHost(3 << 20);  // two 2 MB pieces
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(*a, (*arena)->arena());
  EXPECT_EQ(static_cast<std::byte*>(*b), (*arena)->arena() + (2 << 20));
  EXPECT_EQ((*arena)->AllocateHost(1).status().code(), StatusCode::kResourceExhausted);
  (*arena)->FreeHost(*a);
  (*arena)->FreeHost(*b);
  auto c = (*arena)->AllocateHost(6 << 20);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(*c, (*arena)->arena());
  (*arena)->FreeHost(*c);
}

// ---- The page-offload variant's cache on the CPU backend (page_offload.h) ----

// Row (request, layer, position) of the test's KV: every byte a function of the three.
std::vector<std::byte> TestRow(int32_t row_bytes, int32_t request, int32_t layer,
                               int32_t position) {
  uint64_t x =
      (uint64_t(uint32_t(request)) << 48) ^ (uint64_t(uint32_t(layer)) << 32) ^ uint32_t(position);
  std::vector<std::byte> row(row_bytes);
  for (std::byte& v : row) {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    v = static_cast<std::byte>(x >> 56);
  }
  return row;
}

TEST(PageOffloadTest, EverySelectedRowIsDeliveredFromCacheOrStaging) {
  RequestShape shape;
  shape.layers = 3;
  shape.row_bytes = 656;
  shape.top_k = 128;
  shape.hot_slots = 256;  // 16 cached pages per request and layer
  shape.offload_page_tokens = 16;
  const int32_t context = 2003;  // a partial last prompt page
  const int32_t steps = 10;
  const int32_t max_batch = 3;
  shape.tokens = context + steps;
  const PageOffloadPages pages = OffloadPages(shape);
  ASSERT_EQ(pages.cached, 16);
  auto created =
      PageOffloadCache::Create(shape, max_batch, CreateCpuBackend(), CreateCpuPageOffloadOps());
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  PageOffloadCache& cache = **created;
  const int32_t row = shape.row_bytes;
  for (int32_t l = 0; l < shape.layers; ++l) {
    for (int32_t b = 0; b < max_batch; ++b) {
      for (int32_t p = 0; p < context; ++p) {
        const std::vector<std::byte> r = TestRow(row, b, l, p);
        std::copy(r.begin(), r.end(), cache.host_layer(l) + (b * cache.request_rows() + p) * row);
      }
    }
  }
  ASSERT_TRUE(cache.LoadPrompt(context, nullptr).ok());

  TopKGeneratorOptions o;
  o.top_k = shape.top_k;
  o.miss_rate = 0.2;
  o.fresh_range = context;
  std::vector<LayerTopKGenerator> generators;
  for (int32_t l = 0; l < shape.layers; ++l) generators.emplace_back(o, l, max_batch);
  std::vector<int32_t> lens(max_batch, context);
  int64_t request_layers = 0;  // Resolve rows run
  for (int32_t step = 0; step < steps; ++step) {
    const int32_t batch = step % 3 == 1 ? 2 : max_batch;  // request 2 sits some steps out
    const std::vector<int32_t> positions(lens.begin(), lens.begin() + batch);
    std::vector<int32_t> seq_lens = positions;
    for (int32_t& n : seq_lens) ++n;
    ASSERT_TRUE(cache.Plan(positions, nullptr).ok());
    for (int32_t l = 0; l < shape.layers; ++l) {
      std::vector<std::byte> new_rows(size_t(max_batch) * row);
      for (int32_t b = 0; b < batch; ++b) {
        const std::vector<std::byte> r = TestRow(row, b, l, positions[b]);
        std::copy(r.begin(), r.end(), new_rows.begin() + b * row);
      }
      std::vector<int32_t> topk(size_t(max_batch) * shape.top_k, -1);
      generators[l].Next(seq_lens, std::span(topk.data(), size_t(batch) * shape.top_k));
      ASSERT_TRUE(cache.RunLayer(l, batch, topk.data(), new_rows.data(), nullptr).ok());
      for (int32_t i = 0; i < batch * shape.top_k; ++i) {
        const int32_t b = i / shape.top_k;
        ASSERT_GE(cache.Indices()[i], 0) << "step " << step << " layer " << l << " entry " << i;
        const std::byte* got = cache.cache_rows() + int64_t{cache.Indices()[i]} * row;
        const std::vector<std::byte> want = TestRow(row, b, l, topk[i]);
        ASSERT_TRUE(std::equal(want.begin(), want.end(), got))
            << "step " << step << " layer " << l << " request " << b << " position " << topk[i];
      }
      request_layers += batch;
    }
    for (int32_t b = 0; b < batch; ++b) ++lens[b];
  }
  StatusOr<ResolveCounters> stats = cache.ReadStats(nullptr);
  ASSERT_TRUE(stats.ok());
  EXPECT_GT(stats->hits, 0u);         // pages kept in the LRU cache across steps
  EXPECT_GT(stats->window_hits, 0u);  // the newest page
  EXPECT_GT(stats->duplicates, 0u);   // positions sharing a page
  // More pages copied than the cache has slots: the staging area served the rest.
  EXPECT_GT(stats->misses, static_cast<uint64_t>(request_layers * pages.cached));
  ASSERT_TRUE(cache.ResetStats(nullptr).ok());
  EXPECT_EQ(cache.ReadStats(nullptr)->misses, 0u);
}

TEST(PageOffloadTest, ShapesBeyond32BitRowsAreRefused) {
  RequestShape shape;
  shape.tokens = 131072;
  const auto r =
      PageOffloadCache::Create(shape, 20000, CreateCpuBackend(), CreateCpuPageOffloadOps());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(PageOffloadCache::Create(shape, 1, CreateCpuBackend(), nullptr).status().code(),
            StatusCode::kInvalidArgument);
}

// ---- Benchmark on the CPU backend ----

BenchConfig Tiny() {
  BenchConfig c;
  c.layers = 4;
  c.batch = 3;
  c.context = 2000;
  c.steps = 8;
  c.warmup_steps = 2;
  c.top_k = 128;
  c.hot_slots = 256;
  c.window = 4;
  c.page_tokens = 16;
  return c;
}

TEST(BenchTest, TinyCpuRunReportsConsistentFigures) {
  StatusOr<BenchResult> r = RunBench(Tiny(), CreateCpuBackend());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->config.layers, 4);
  EXPECT_EQ(r->preset_layers, 61);
  EXPECT_EQ(r->row_bytes, 656);
  EXPECT_EQ(r->timed_steps, 6);
  EXPECT_EQ(r->step_ms.size(), 6u);
  EXPECT_GT(r->ms_per_step_median, 0);
  EXPECT_GE(r->hit_rate, 0);
  EXPECT_LE(r->hit_rate, 1);
  EXPECT_NEAR(r->hit_rate + r->miss_rate, 1.0, 1e-12);
  EXPECT_GT(r->miss_rate, 0);  // a cache of 256 slots over 2000 positions must miss
  EXPECT_GT(r->bytes_h2d_per_step, 0);
  EXPECT_GT(r->h2d_gb_per_s, 0);
  EXPECT_EQ(r->skipped_entries, 0u);  // generated rows are distinct and in range
  ASSERT_EQ(r->layer_hit_rate.size(), 4u);
  EXPECT_LT(r->layer_hit_rate[0], r->layer_hit_rate[3]);  // layer 0 reuses almost nothing
  EXPECT_EQ(r->full_kv_bytes_per_request, int64_t{2000} * 4 * 656);
  EXPECT_EQ(r->hot_cache_bytes_per_request,
            int64_t{4} * (256 + 4) * 656 + int64_t{4} * (256 * 2 + 1) * 4);
  EXPECT_EQ(r->hbm_saved_bytes_per_request,
            r->full_kv_bytes_per_request - r->hot_cache_bytes_per_request);
  EXPECT_GT(r->host_pool_bytes, int64_t{3} * 2008 * 4 * 656 - 1);
  EXPECT_NE(FormatBenchTable(*r).find("CPU reference backend"), std::string::npos);
}

TEST(BenchTest, MissRateTargetIsMet) {
  BenchConfig c = Tiny();
  c.miss_rates = {0.2};  // round(0.2 * 128) = 26 fresh positions per row
  StatusOr<BenchResult> r = RunBench(c, CreateCpuBackend());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_NEAR(r->miss_rate, 26.0 / 128, 0.005);
  EXPECT_DOUBLE_EQ(r->miss_rate_target, 0.2);
  EXPECT_NE(FormatBenchTable(*r).find("(target 20.0 %)"), std::string::npos);
}

TEST(BenchTest, Bf16RowsAndAssemble) {
  BenchConfig c = Tiny();
  c.precision = KVPrecision::kBf16;
  c.assemble = true;
  StatusOr<BenchResult> r = RunBench(c, CreateCpuBackend());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->row_bytes, 1152);
  EXPECT_NE(FormatBenchTable(*r).find("with assemble"), std::string::npos);
}

TEST(BenchTest, InvalidConfigsNameTheOption) {
  auto expect = [](BenchConfig c, const std::string& option) {
    const Status s = ValidateBenchConfig(c);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << option;
    EXPECT_NE(s.message().find(option), std::string::npos) << s.message();
    EXPECT_EQ(RunBench(c, CreateCpuBackend()).status().code(), StatusCode::kInvalidArgument);
  };
  BenchConfig c = Tiny();
  c.top_k = c.context + 1;
  expect(c, "--top-k");
  c = Tiny();
  c.hot_slots = c.top_k - 1;
  expect(c, "--hot-slots");
  c = Tiny();
  c.warmup_steps = c.steps;
  expect(c, "--warmup");
  c = Tiny();
  c.reuse = 0.7;
  c.recency = 0.4;
  expect(c, "--reuse + --recency");
  c = Tiny();
  c.sinks = c.top_k + 1;
  expect(c, "--sinks");
  c = Tiny();
  c.mtp = 2;  // the default variants include page-offload and no-cache
  expect(c, "--mtp");
  c.variants = {"full-hbm", "sparsekv"};
  c.hot_slots = 2 * c.top_k - 1;
  expect(c, "--mtp");
  c.hot_slots = 2 * c.top_k;
  EXPECT_TRUE(ValidateBenchConfig(c).ok());
}

// ---- Command line ----

struct CliRun {
  int code;
  std::string out, err;
};

CliRun Cli(const std::vector<std::string>& args) {
  std::ostringstream out, err;
  const int code = RunCli(args, out, err, /*progress_bar=*/false);
  return {code, out.str(), err.str()};
}

// A small CPU run with every scaled-down option given.
std::vector<std::string> SmallCpuArgs() {
  return {"bench", "--backend", "cpu",  "--layers",    "3",  "--batch",
          "2",     "--context", "1024", "--steps",     "5",  "--warmup",
          "1",     "--top-k",   "64",   "--hot-slots", "128"};
}

TEST(CliTest, UsageErrorsExitWithTwo) {
  const std::vector<std::vector<std::string>> bad = {
      {},                               // no subcommand
      {"frobnicate"},                   // unknown subcommand
      {"bench", "--no-such-option"},    // unknown option
      {"bench", "--preset", "llama"},   // not a preset
      {"bench", "--precision", "fp4"},  // not a precision
      {"bench", "--backend", "tpu"},    // not a backend
      {"bench", "--batch", "0"},        // not positive
      {"bench", "--steps", "many"},     // not a number
      {"bench", "--reuse", "1.5"},      // not a fraction
      {"bench", "--layers", "0"},       // out of range
      {"bench", "--backend", "cpu", "--context", "100", "--top-k", "200"},
      {"bench", "--backend", "cpu", "--top-k", "512", "--hot-slots", "256"},
      {"bench", "--backend", "cpu", "--steps", "4", "--warmup", "4"},
      {"bench", "--miss-rate", "1.5"},                           // not a rate
      {"bench", "--miss-rate", "0.1,x"},                         // not a number
      {"bench", "--offload-page-tokens", "0"},                   // out of range
      {"bench", "--offload-max-batch", "-1"},                    // negative
      {"bench", "--overlap", "always"},                          // not an overlap mode
      {"bench", "--layers-per-index", "0"},                      // out of range
      {"bench", "--copy-blocks", "-1"},                          // negative
      {"bench", "--variants", "sparsekv,nope"},                  // not a variant
      {"bench", "--hbm-budget-gb", "0"},                         // not positive
      {"bench", "--host-pool-gb", "-5"},                         // not positive
      {"bench", "--weights-gb", "0"},                            // not positive
      {"bench", "--heads", "0"},                                 // out of range
      {"bench", "--max-batch", "-1"},                            // negative
      {"bench", "--time-limit", "-1"},                           // negative
      {"bench", "--contexts", "16384,0"},                        // not positive
      {"bench", "--backend", "cpu", "--contexts", "1000"},       // below --top-k
      {"bench", "--backend", "cpu", "--miss-rate", "0.05,0.2"},  // one value on the CPU
  };
  for (const auto& args : bad) {
    const CliRun r = Cli(args);
    std::string line;
    for (const std::string& a : args) line += a + " ";
    EXPECT_EQ(r.code, kExitUsage) << line << "\n" << r.err;
    EXPECT_FALSE(r.err.empty()) << line;
    EXPECT_TRUE(r.out.empty()) << line;
  }
}

TEST(CliTest, GpuFlagsAreAcceptedOnTheCpu) {
  std::vector<std::string> args = SmallCpuArgs();
  args.insert(args.end(), {"--miss-rate", "0.25", "--no-proxy", "--heads", "16", "--hbm-budget-gb",
                           "30", "--host-pool-gb", "50", "--max-batch", "8", "--variants",
                           "sparsekv,full-hbm", "--weights-gb", "40", "--time-limit", "100",
                           "--prefetch", "4", "--mtp", "2", "--sort-misses", "false",
                           "--copy-blocks", "16"});
  const CliRun r = Cli(args);
  ASSERT_EQ(r.code, kExitOk) << r.err;
  EXPECT_NE(r.out.find("(target 25.0 %)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("skipped on the CPU backend"), std::string::npos) << r.out;
}

TEST(CliTest, TopKAboveContextSaysWhich) {
  const CliRun r = Cli({"bench", "--backend", "cpu", "--context", "100", "--top-k", "200"});
  EXPECT_EQ(r.code, kExitUsage);
  EXPECT_NE(r.err.find("--top-k (200) must be <= --context (100)"), std::string::npos) << r.err;
}

TEST(CliTest, HelpExitsZero) {
  const CliRun r = Cli({"bench", "--help"});
  EXPECT_EQ(r.code, kExitOk);
  for (const char* option : {"--preset", "--top-k", "--reuse", "--recency", "--sinks", "--json"}) {
    EXPECT_NE(r.out.find(option), std::string::npos) << option;
  }
}

TEST(CliTest, CudaBackendUnavailableIsARunFailure) {
  if (CreateCudaBackend(0).ok()) GTEST_SKIP() << "a GPU is present";
  const CliRun r = Cli({"bench", "--backend", "cuda"});
  EXPECT_EQ(r.code, kExitFailure);
  EXPECT_NE(r.err.find("Unavailable"), std::string::npos) << r.err;
}

TEST(CliTest, SmallCpuRunPrintsTableAndWritesJson) {
  const std::string path = ::testing::TempDir() + "sparsekv_cli_test_small.json";
  std::vector<std::string> args = SmallCpuArgs();
  args.insert(args.end(), {"--json", path});
  const CliRun r = Cli(args);
  ASSERT_EQ(r.code, kExitOk) << r.err;
  EXPECT_NE(r.out.find("sparsekv bench: CPU reference backend\n"), std::string::npos) << r.out;
  for (const char* row :
       {"ms per step", "hit rate", "miss rate", "host->device", "HBM saved", "host pool"}) {
    EXPECT_NE(r.out.find(row), std::string::npos) << row;
  }
  std::ifstream file(path);
  const nlohmann::json j = nlohmann::json::parse(file);
  EXPECT_EQ(j["backend"], "cpu");
  EXPECT_EQ(j["scaled_down"], false);
  EXPECT_EQ(j["layers"], 3);
  EXPECT_EQ(j["batch"], 2);
  EXPECT_EQ(j["timed_steps"], 4);
  EXPECT_GE(j["hit_rate"].get<double>(), 0.0);
  EXPECT_LE(j["hit_rate"].get<double>(), 1.0);
  EXPECT_GT(j["bytes_h2d_per_step"].get<double>(), 0.0);
  EXPECT_EQ(j["command"].get<std::string>().rfind("sparsekv bench --backend cpu", 0), 0u);
}

TEST(CliTest, CpuDefaultsAreScaledDownAndLabelled) {
  const std::string path = ::testing::TempDir() + "sparsekv_cli_test_scaled.json";
  const CliRun r = Cli({"bench", "--backend", "cpu", "--steps", "6", "--json", path});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  EXPECT_NE(r.out.find("CPU reference backend (scaled down)"), std::string::npos) << r.out;
  std::ifstream file(path);
  const nlohmann::json j = nlohmann::json::parse(file);
  EXPECT_EQ(j["scaled_down"], true);
  EXPECT_EQ(j["layers"], 4);
  EXPECT_EQ(j["batch"], 4);
  EXPECT_EQ(j["context"], 8192);
  EXPECT_EQ(j["steps"], 6);  // given, so kept
  EXPECT_EQ(j["top_k"], 2048);
  EXPECT_EQ(j["hot_slots"], 4096);
}

TEST(CliTest, UnwritableJsonPathIsARunFailure) {
  std::vector<std::string> args = SmallCpuArgs();
  args.insert(args.end(), {"--json", "/nonexistent-dir/out.json"});
  const CliRun r = Cli(args);
  EXPECT_EQ(r.code, kExitFailure);
  EXPECT_NE(r.err.find("cannot write JSON"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace sparsekv::tools
