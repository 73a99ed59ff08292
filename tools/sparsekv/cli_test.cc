// Tests of the sparsekv tool: the benchmark on the CPU backend, its report and page cache, and
// the command line's handling of good and bad arguments.
#include "tools/sparsekv/cli.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <streambuf>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "sparsekv/backend.h"
#include "sparsekv/capacity.h"
#include "sparsekv/config.h"
#include "sparsekv/hot_cache.h"
#include "sparsekv/kv_footprint.h"
#include "sparsekv/topk_generator.h"
#include "tools/sparsekv/bench/arena_backend.h"
#include "tools/sparsekv/bench/bench.h"
#include "tools/sparsekv/bench/e2e_report.h"
#include "tools/sparsekv/bench/page_offload.h"
#include "tools/sparsekv/common/progress.h"

namespace sparsekv::tools {
namespace {

// ---- The benchmark's batch cap (bench.h) ----

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

TEST(E2EPlanTest, TheStandardSweepKeepsWhatTheCommandLineGave) {
  BenchConfig c;
  c.contexts = {4096};
  c.miss_rates = {0.1};
  c.variants = {"sparsekv"};
  c.batch = 7;
  c.batch_given = true;
  const BenchConfig all = WithStandardSweep(c);
  EXPECT_EQ(all.contexts, (std::vector<int32_t>{32768, 16384, 65536, 131072}));
  EXPECT_EQ(all.miss_rates, (std::vector<double>{0.2, 0.05, 0.4}));
  EXPECT_EQ(all.variants.size(), 4u);
  EXPECT_FALSE(all.batch_given);  // every batch size
  const BenchConfig kept =
      WithStandardSweep(c, {.contexts = true, .miss_rates = false, .variants = true});
  EXPECT_EQ(kept.contexts, c.contexts);
  EXPECT_EQ(kept.miss_rates, all.miss_rates);
  EXPECT_EQ(kept.variants, c.variants);
}

// The GPU run's report names a --config file in its table and carries the file's options in its
// JSON (without one, config is null).
TEST(E2EReportTest, AConfigFileIsNamedInTheTableAndItsOptionsInTheJson) {
  E2EReport r;
  EXPECT_TRUE(nlohmann::json::parse(FormatE2EJson(r))["config"].is_null());
  BenchConfig c;
  c.config_path = "cache.json";
  c.config_keys = {"hot_slots", "max_requests"};
  c.cache_base.hot_slots = 6144;
  r.config = c.config_path;
  r.config_summary = ConfigSummary(c);
  r.config_options = CacheOptionsToJson(c.cache_base);
  EXPECT_NE(FormatE2ETable(r).find(
                "  config: cache.json (hot_slots; sized by the bench instead: max_requests)\n"),
            std::string::npos)
      << FormatE2ETable(r);
  const nlohmann::json j = nlohmann::json::parse(FormatE2EJson(r));
  EXPECT_EQ(j["config"], "cache.json");
  EXPECT_EQ(j["config_options"]["hot_slots"], 6144);
}

// ---- Progress (common/progress.h) ----

// Off a terminal, progress is plain lines (here one per update, every 0 ms).
TEST(ProgressBarTest, OffATerminalItPrintsLines) {
  std::ostringstream err;
  {
    ProgressBar bar(err, /*terminal=*/false, "sparsekv replay", std::chrono::milliseconds(0));
    bar.Update("replay", 1, 4);
    bar.Update("replay", 2, 4);
  }
  EXPECT_EQ(err.str().find("sparsekv replay: replay 1/4, 0 s\n"), 0u) << err.str();
  EXPECT_NE(err.str().find("sparsekv replay: replay 2/4, "), std::string::npos) << err.str();
  EXPECT_EQ(err.str().find('\r'), std::string::npos) << err.str();
  std::ostringstream quiet;
  {
    ProgressBar bar(quiet, /*terminal=*/false, "sparsekv replay");  // the default: every 10 s
    bar.Update("replay", 1, 4);
  }
  EXPECT_TRUE(quiet.str().empty()) << quiet.str();
}

// ---- End-to-end report (e2e_report.h) ----

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

// The calibrated ratio (peak over peak, the locality mode) names its model unless it is
// DeepSeek-V3.2's, so that GLM-5.3's sits beside it in one summary.
TEST(E2EReportTest, CalibratedRatioKeysNameTheModel) {
  E2EReport r;
  auto add = [&](KVVariant v, int32_t batch, double tokens_per_s) {
    E2EPoint p;
    p.variant = v;
    p.context = 32768;
    p.batch = batch;
    p.tokens_per_s = tokens_per_s;
    r.points.push_back(p);
  };
  add(KVVariant::kFullHbm, 8, 400);
  add(KVVariant::kSparseKV, 8, 380);
  add(KVVariant::kSparseKV, 40, 600);
  r.preset = "glm-5.3";
  const nlohmann::json glm = nlohmann::json::parse(FormatE2ESummaryJson(r));
  EXPECT_DOUBLE_EQ(glm["e2e_throughput_ratio_vs_full_hbm_glm53_32k_calibrated"].get<double>(), 1.5);
  EXPECT_FALSE(glm.contains("e2e_throughput_ratio_vs_full_hbm_32k_calibrated")) << glm.dump();
  r.preset = "deepseek-v3.2";
  const nlohmann::json v32 = nlohmann::json::parse(FormatE2ESummaryJson(r));
  EXPECT_DOUBLE_EQ(v32["e2e_throughput_ratio_vs_full_hbm_32k_calibrated"].get<double>(), 1.5);
}

// DeepSeek-V4-Pro's keys: per context (1M as "1m"), sparsekv at its largest batch (the host
// pool's) over full-hbm's peak, the same point's ideal over that peak, and the smallest ratio at
// the batches both ran.
TEST(E2EReportTest, DeepSeekV4KeysNameTheModelAndTheContext) {
  E2EReport r;
  r.preset = "deepseek-v4-pro";
  auto add = [&](KVVariant v, int32_t context, int32_t batch, double tokens_per_s,
                 double ideal_ms) {
    E2EPoint p;
    p.variant = v;
    p.context = context;
    p.batch = batch;
    p.tokens_per_s = tokens_per_s;
    p.ideal_ms = ideal_ms;
    r.points.push_back(p);
  };
  add(KVVariant::kFullHbm, 1048576, 2, 100, 0);
  add(KVVariant::kFullHbm, 1048576, 4, 160, 0);  // peak
  add(KVVariant::kSparseKV, 1048576, 2, 90, 0);  // 0.9 of full-hbm at batch 2
  add(KVVariant::kSparseKV, 1048576, 4, 150, 0);
  add(KVVariant::kSparseKV, 1048576, 17, 400, 34);  // ideal 17 / 34 ms = 500 tok/s
  add(KVVariant::kFullHbm, 262144, 16, 500, 0);
  add(KVVariant::kSparseKV, 262144, 16, 480, 0);
  add(KVVariant::kSparseKV, 262144, 69, 1000, 0);  // no ideal: null
  E2EPoint rated;                                  // a miss-rate point is not the locality mode's
  rated.variant = KVVariant::kSparseKV;
  rated.context = 1048576;
  rated.batch = 2;
  rated.tokens_per_s = 1;
  rated.miss_rate_target = 0.2;
  r.points.push_back(rated);
  const nlohmann::json j = nlohmann::json::parse(FormatE2ESummaryJson(r));
  EXPECT_DOUBLE_EQ(j["e2e_throughput_ratio_vs_full_hbm_v4pro_1m"].get<double>(), 400.0 / 160);
  EXPECT_DOUBLE_EQ(j["e2e_ideal_ratio_vs_full_hbm_v4pro_1m"].get<double>(), 500.0 / 160);
  EXPECT_DOUBLE_EQ(j["e2e_throughput_ratio_vs_full_hbm_v4pro_256k"].get<double>(), 2.0);
  EXPECT_TRUE(j["e2e_ideal_ratio_vs_full_hbm_v4pro_256k"].is_null()) << j.dump();
  EXPECT_DOUBLE_EQ(j["e2e_min_ratio_vs_full_hbm_v4pro"].get<double>(), 0.9);
  EXPECT_DOUBLE_EQ(j["e2e_throughput_ratio_vs_full_hbm_v4pro_1m_calibrated"].get<double>(),
                   400.0 / 160);
  EXPECT_FALSE(j.contains("e2e_throughput_ratio_vs_full_hbm_v4pro_512k")) << j.dump();
  r.preset = "deepseek-v3.2";  // the reference model has none of these keys
  const nlohmann::json v32 = nlohmann::json::parse(FormatE2ESummaryJson(r));
  EXPECT_FALSE(v32.contains("e2e_throughput_ratio_vs_full_hbm_1m")) << v32.dump();
  EXPECT_TRUE(v32.contains("e2e_throughput_ratio_vs_full_hbm_1m_calibrated")) << v32.dump();
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

// A pool carved from the arena is checked against what is left of the arena, not against the
// machine's available memory (which the arena already holds).
TEST(ArenaBackendTest, HostCapacityChecksCountWhatIsLeftOfTheArena) {
  auto arena = ArenaBackend::Create(CreateCpuBackend(), 6 << 20);
  ASSERT_TRUE(arena.ok()) << arena.status().ToString();
  EXPECT_EQ(*(*arena)->ReservedHostBytes(), 6 << 20);
  auto piece = (*arena)->AllocateHost(1);
  ASSERT_TRUE(piece.ok());
  EXPECT_EQ(*(*arena)->ReservedHostBytes(), 4 << 20);
  EXPECT_TRUE(CheckHostMemory({.what = "host pool", .bytes = 4 << 20}, **arena).ok());
  const Status refused = CheckHostMemory(
      {.what = "host pool", .bytes = (4 << 20) + 1, .remedy = "lower host_capacity_tokens"},
      **arena);
  EXPECT_EQ(refused.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(refused.message().find("of the host memory " + (*arena)->name() +
                                   " reserved, 4.19 MB "
                                   "is left; lower host_capacity_tokens"),
            std::string::npos)
      << refused.message();
  (*arena)->FreeHost(*piece);
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
  // Rows, then per layer the clock's state: 256 tokens and counts, its hand and a map of
  // max_context = 2000 + 8 steps + 16 (a page of headroom) positions.
  EXPECT_EQ(r->hot_cache_bytes_per_request,
            int64_t{4} * (256 + 4) * 656 + int64_t{4} * (256 * 5 + 4 + 2024 * 4));
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
  c.row_format = KVRowFormat::kBf16Row1152;
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

// Contexts to 1M tokens pass the checks (the GPU run sizes its host pool from them); 2^30 and
// more are refused, saying why.
TEST(BenchTest, ContextsUpToOneMillionAreAccepted) {
  BenchConfig c = Tiny();
  c.contexts = {131072, 1048576};
  EXPECT_TRUE(ValidateBenchConfig(c).ok()) << ValidateBenchConfig(c).message();
  c.contexts = {1 << 30};
  const Status s = ValidateBenchConfig(c);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("32-bit positions"), std::string::npos) << s.message();
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
// DeepSeek-V4-Pro's first 4 layers: two HCA layers (resident, an entry per 128 tokens), a CSA
// layer (offloaded, an entry per 4) and an HCA layer, 584-B entries and a raw window of 128. The
// hot cache and the host pool hold the CSA layer alone; full KV is every layer's entries and
// window.
TEST(BenchTest, DeepSeekV4FiguresCountWhatIsStored) {
  BenchConfig c = Tiny();
  c.preset = "deepseek-v4-pro";
  c.row_format = KVRowFormat::kFp8Entry584;
  c.top_k = 64;
  c.hot_slots = 128;
  StatusOr<BenchResult> r = RunBench(c, CreateCpuBackend());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const CacheOptions& o = r->options;
  ASSERT_EQ(o.raw_window, 128);
  const int32_t entries = o.max_context / 4;  // the clock's positions, in entries
  EXPECT_EQ(
      r->hot_cache_bytes_per_request,
      int64_t{128 + 4} * 584 + HotCache::StateBytesOf(1, 128, {EvictionPolicy::kClock, entries}));
  // Three resident layers of floor(2000 / 128) = 15 entries, one page of 64 each; four windows.
  EXPECT_EQ(r->dense_bytes_per_request, int64_t{3} * 64 * 584 + int64_t{4} * 128 * 584);
  EXPECT_EQ(r->full_kv_bytes_per_request, int64_t{2000 / 4 + 3 * 15} * 584 + 4 * 128 * 584);
  EXPECT_EQ(
      r->hbm_saved_bytes_per_request,
      r->full_kv_bytes_per_request - r->hot_cache_bytes_per_request - r->dense_bytes_per_request);
  // The pool: an entry row of the CSA layer per 4 tokens of host_capacity_tokens.
  EXPECT_EQ(r->host_pool_bytes, o.host_capacity_tokens / 4 * 584);
  EXPECT_NE(FormatBenchTable(*r).find("resident entries and raw windows"), std::string::npos);
}

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
      {"bench", "--miss-rate", "1.5"},          // not a rate
      {"bench", "--miss-rate", "0.1,x"},        // not a number
      {"bench", "--offload-page-tokens", "0"},  // out of range
      {"bench", "--offload-max-batch", "-1"},   // negative
      {"bench", "--overlap", "copies"},         // retired: the step schedule's chunks replace it
      {"bench", "--prefetch", "16"},  // retired: the schedule's cross-layer prefetch replaces it
      {"bench", "--layers-per-index", "0"},                      // out of range
      {"bench", "--copy-blocks", "-1"},                          // negative
      {"bench", "--planned-copy", "-2"},                         // out of range
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

TEST(CliTest, GpuOnlyFlagsAreRefusedOnTheCpuNamingThem) {
  const std::vector<std::string> gpu_only = {"--no-proxy",
                                             "--heads",
                                             "16",
                                             "--hbm-budget-gb",
                                             "30",
                                             "--host-pool-gb",
                                             "50",
                                             "--max-batch",
                                             "8",
                                             "--variants",
                                             "sparsekv",
                                             "--weights-gb",
                                             "40",
                                             "--time-limit",
                                             "100",
                                             "--mtp",
                                             "2",
                                             "--sort-misses",
                                             "false",
                                             "--copy-blocks",
                                             "16",
                                             "--hybrid",
                                             "--layers-per-index",
                                             "2",
                                             "--planned-copy",
                                             "16",
                                             "--offload-page-tokens",
                                             "32",
                                             "--trace-step",
                                             "trace.json"};
  for (const std::string backend : {"cpu", "auto"}) {
    if (backend == "auto" && CreateCudaBackend(0).ok()) continue;  // auto would pick the GPU
    std::vector<std::string> args = SmallCpuArgs();
    args[2] = backend;
    args.insert(args.end(), gpu_only.begin(), gpu_only.end());
    const CliRun r = Cli(args);
    EXPECT_EQ(r.code, kExitUsage) << r.err;
    EXPECT_TRUE(r.out.empty()) << r.out;
    for (const std::string& a : gpu_only) {
      if (a.rfind("--", 0) == 0) {
        EXPECT_NE(r.err.find(a), std::string::npos) << a << "\n" << r.err;
      }
    }
    EXPECT_NE(r.err.find("--hybrid"), std::string::npos) << r.err;
  }
}

TEST(CliTest, CpuSweepWithCsvIsRefusedBeforeWritingAnything) {
  const std::string csv = ::testing::TempDir() + "sparsekv_cli_test_refused.csv";
  std::remove(csv.c_str());
  const CliRun r =
      Cli({"bench", "--backend", "cpu", "--csv", csv, "--contexts", "16384,32768", "--sweep"});
  EXPECT_EQ(r.code, kExitUsage);
  for (const char* name : {"--csv", "--contexts", "--sweep"}) {
    EXPECT_NE(r.err.find(name), std::string::npos) << name << "\n" << r.err;
  }
  EXPECT_TRUE(r.out.empty()) << r.out;
  EXPECT_FALSE(std::ifstream(csv).good());
}

TEST(CliTest, MissRateIsTheOneEndToEndOptionTheCpuReads) {
  std::vector<std::string> args = SmallCpuArgs();
  args.insert(args.end(), {"--miss-rate", "0.25"});
  const CliRun r = Cli(args);
  ASSERT_EQ(r.code, kExitOk) << r.err;
  EXPECT_NE(r.out.find("(target 25.0 %)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("skipped on the CPU backend"), std::string::npos) << r.out;
}

TEST(CliTest, RangeErrorsSayTheRangeInWords) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"bench", "--batch", "0"}, "--batch: must be >= 1 (got 0)"},
      {{"bench", "--layers", "0"}, "--layers: must be in [1, 1000] (got 0)"},
      {{"bench", "--reuse", "1.5"}, "--reuse: must be in [0, 1] (got 1.5)"},
      {{"bench", "--warmup", "-1"}, "--warmup: must be >= 0 (got -1)"},
      {{"bench", "--contexts", "16384,0"}, "--contexts: must be >= 1 (got 0)"},
      {{"bench", "--hbm-budget-gb", "0"}, "--hbm-budget-gb: must be a number > 0 (got 0)"},
      {{"bench", "--time-limit", "-1"}, "--time-limit: must be >= 0 (got -1)"},
      {{"bench", "--seed", "-1"}, "--seed: must be a whole number in [0, 2^64) (got '-1')"},
      {{"bench", "--steps", "many"}, "--steps: must be a whole number (got 'many')"},
      {{"plan", "--hbm-gb", "0"}, "--hbm-gb: must be a number > 0 (got 0)"},
      {{"plan", "--reserved-gb", "-1"}, "--reserved-gb: must be >= 0 (got -1)"},
      {{"plan", "--hot-slots", "0"}, "--hot-slots: must be >= 1 (got 0)"},
      {{"plan", "--miss-rates", "0.2,2"}, "--miss-rates: must be in [0, 1] (got 2)"},
      {{"replay", "--aging-shift", "16"}, "--aging-shift: must be in [1, 15] (got 16)"},
      {{"replay", "--protected-percent", "101"}, "--protected-percent: must be in [0, 100]"},
      {{"replay", "--hot-slots", "64,0"}, "--hot-slots: must be >= 1 (got 0)"},
      {{"replay", "--seed", "-1"}, "--seed: must be a whole number in [0, 2^64)"},
      {{"multi-turn", "--turns", "0"}, "--turns: must be in [1, 10000] (got 0)"},
      {{"multi-turn", "--system-tokens", "2000000000"},
       "--system-tokens: must be in [0, 16777216]"},
      {{"multi-turn", "--branch-probability", "2"}, "--branch-probability: must be in [0, 1]"},
      {{"multi-turn", "--seed", "-1"}, "--seed: must be a whole number in [0, 2^64)"},
      {{"multi-turn", "--preset", "llama"}, "--preset"},
      {{"pool", "--node-id", "a", "--lease-ms", "10"}, "--lease-ms: must be in [30, 600000]"},
      {{"pool", "--node-id", ""}, "--node-id: must not be empty"},
      {{"pool", "--node-id", "a", "--layers", "4"}, "--layers requires --node-pool"},
      {{"pool", "--node-id", "a", "--node-pool", "x", "--transports", "tcp"},
       "--transports excludes --node-pool"},
      {{"pool", "--node-id", "a", "--node-pool", "x", "--max-processes", "0"},
       "--max-processes: must be in [1, 4096]"},
  };
  for (const auto& [args, expected] : cases) {
    const CliRun r = Cli(args);
    EXPECT_EQ(r.code, kExitUsage) << args[1] << "\n" << r.err;
    EXPECT_NE(r.err.find(expected), std::string::npos) << expected << "\n" << r.err;
    EXPECT_EQ(r.err.find("1797"), std::string::npos) << r.err;  // no DBL_MAX in full
    EXPECT_TRUE(r.out.empty()) << r.out;
  }
}

// What a newcomer types wrong gets a message that names the flag, the range and the reason.
TEST(CliTest, UnclearInputsGetClearMessages) {
  const bool gpu = CreateCudaBackend(0).ok();
  std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"frob"},
       "sparsekv: unknown subcommand 'frob'; the subcommands are bench, plan, replay, "
       "multi-turn, pool"},
      {{}, "a subcommand is required; the subcommands are bench, plan"},
      {{"bench", "--batch", "99999999999"},
       "--batch: must be in [1, 2147483647] (got 99999999999)"},
      {{"bench", "--layers", "99999999999999999999"}, "--layers: must be in [1, 1000]"},
      {{"replay", "--hot-slots", "99999999999"}, "--hot-slots: must be in [1, 2147483647]"},
      {{"bench", "--json", ""}, "--json: must not be empty"},
      {{"replay", "--write-trace", ""}, "--write-trace: must not be empty"},
      {{"plan", "--json", ""}, "--json: must not be empty"},
      {{"multi-turn", "--json", ""}, "--json: must not be empty"},
      {{"plan", "--tier", "a:1:1", "--tier", "a:2:2"}, "--tier: two tiers are named 'a'"},
      {{"plan", "--tier", "hbm:1:1"}, "'hbm' names the full-HBM baseline"},
      {{"plan", "--tpot-slo-ms", "0.001"},
       "no batch meets --tpot-slo-ms 0.001 in any case; their fastest step (batch 1) takes"},
  };
  if (!gpu) {
    // On the CPU the reason is the flag's (GPU only), and the shape quoted is the CPU's.
    cases.push_back({{"bench", "--mtp", "2"}, "--mtp: read only by the end-to-end GPU benchmark"});
    cases.push_back({{"bench", "--window", "100000"},
                     "--window (100000) must be <= --context (8192): the window holds the newest "
                     "tokens of the history (after the CPU scale-down"});
  }
  for (const auto& [args, expected] : cases) {
    const CliRun r = Cli(args);
    EXPECT_EQ(r.code, kExitUsage) << expected << "\n" << r.err;
    EXPECT_NE(r.err.find(expected), std::string::npos) << expected << "\n" << r.err;
    EXPECT_EQ(r.err.find("Could not convert"), std::string::npos) << r.err;
  }
}

// An SLO some cases cannot meet is said above the table.
TEST(CliTest, PlanSaysWhichCasesNoBatchMeetsTheSloIn) {
  const CliRun r = Cli({"plan", "--tpot-slo-ms", "22", "--contexts", "16384,1048576"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  EXPECT_NE(r.out.find("--tpot-slo-ms 22: no batch meets it in 8 of 9 cases (batch 0 below)"),
            std::string::npos)
      << r.out;
}

// DeepSeek-V4's presets run in multi-turn with every layer kind (fp8 is their 584-B entries), and
// its JSON holds the store's figures beside the pool's; bf16 is not a format they have. plan
// answers their capacity.
TEST(CliTest, MultiTurnRunsDeepSeekV4sLayerKindsAndPlanModelsThem) {
  for (const std::string preset : {"deepseek-v4-flash", "deepseek-v4-pro"}) {
    const std::string path = ::testing::TempDir() + "multi_turn_" + preset + ".json";
    const CliRun r = Cli({"multi-turn", "--preset", preset, "--conversations", "4", "--turns", "2",
                          "--system-tokens", "600", "--user-tokens", "40", "--reply-tokens", "30",
                          "--page-tokens", "16", "--json", path});
    ASSERT_EQ(r.code, kExitOk) << r.err;
    EXPECT_NE(r.out.find("B per host-pool entry of 4 tokens"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("resident entries and raw windows (584 B rows, every layer)"),
              std::string::npos)
        << r.out;
    std::ifstream file(path);
    const nlohmann::json j = nlohmann::json::parse(file);
    EXPECT_EQ(j["config"]["precision"], "fp8");
    EXPECT_EQ(j["entry_tokens"], 4);
    EXPECT_EQ(j["dense_row_bytes"], 584);
    EXPECT_GT(j["sharing"]["prefix_hit_tokens"].get<int64_t>(), 0);
    EXPECT_GT(j["sharing"]["peak_dense_device_rows"].get<int64_t>(), 0);
    EXPECT_GT(j["private"]["peak_dense_host_rows"].get<int64_t>(), 0);
    EXPECT_LT(j["sharing"]["peak_pages"].get<int64_t>(), j["private"]["peak_pages"].get<int64_t>());
    const CliRun bf16 = Cli({"multi-turn", "--preset", preset, "--precision", "bf16"});
    EXPECT_EQ(bf16.code, kExitUsage);
    EXPECT_NE(bf16.err.find("has no 1152-B rows"), std::string::npos) << bf16.err;
  }
  const CliRun plan = Cli({"plan", "--preset", "deepseek-v4-pro", "--contexts", "1048576", "--tier",
                           "dram-2t:2000:55"});
  ASSERT_EQ(plan.code, kExitOk) << plan.err;
  // 1.26 GB of HBM and 4.59 GB of host per request: 4 requests in full HBM, 19 offloaded.
  EXPECT_NE(plan.out.find("5784MB        4     1259MB     4.59GB       19           19"),
            std::string::npos)
      << plan.out;
}

// GLM-5.3 runs: its first 7 layers keep the preset's groups {0}, {1}, {2-5}, {6}, resolved once
// per group (the other layers copy and assemble with their group's slots).
TEST(CliTest, BenchRunsGlm53sIndexGroupsOnTheCpu) {
  std::vector<std::string> args = SmallCpuArgs();
  args[4] = "7";  // --layers
  args.insert(args.end(), {"--preset", "glm-5.3"});
  const CliRun r = Cli(args);
  ASSERT_EQ(r.code, kExitOk) << r.err;
  EXPECT_NE(r.out.find("glm-5.3, fp8 (656 B rows), 7 of 78 layers"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("index groups      4 (top-k resolved once per group)"), std::string::npos)
      << r.out;
  // On a GPU (refused before one is looked for) its groups are its own: --layers-per-index would
  // name others.
  const CliRun grouped =
      Cli({"bench", "--backend", "cuda", "--preset", "glm-5.3", "--layers-per-index", "2"});
  EXPECT_EQ(grouped.code, kExitUsage) << grouped.err;
  EXPECT_NE(grouped.err.find("--layers-per-index must be 1 with --preset glm-5.3"),
            std::string::npos)
      << grouped.err;
}

// DeepSeek-V4 runs on the CPU: its first 4 layers (two window-only, a CSA layer of entries every 4
// tokens, an HCA layer of resident entries every 128), every layer with its raw window; only the
// CSA layer resolves a top-k.
TEST(CliTest, BenchRunsDeepSeekV4sLayerKindsOnTheCpu) {
  std::vector<std::string> args = SmallCpuArgs();
  args[4] = "4";  // --layers
  args.insert(args.end(), {"--preset", "deepseek-v4-flash"});
  const CliRun r = Cli(args);
  ASSERT_EQ(r.code, kExitOk) << r.err;
  EXPECT_NE(r.out.find("deepseek-v4-flash, fp8 (584 B rows), 4 of 44 layers"), std::string::npos)
      << r.out;
  args.back() = "deepseek-v4-pro";
  const CliRun pro = Cli(args);
  ASSERT_EQ(pro.code, kExitOk) << pro.err;
  EXPECT_NE(pro.out.find("deepseek-v4-pro, fp8 (584 B rows), 4 of 62 layers"), std::string::npos)
      << pro.out;
}

// A node pool whose shape cannot be (the library's refusal) is a usage error too, and leaves no
// segment behind.
TEST(CliTest, PoolRefusesANodePoolShapeItCannotHave) {
  const std::string name = "sparsekv-cli-test-" + std::to_string(getpid());
  const CliRun r = Cli({"pool", "--node-id", "a", "--control-plane", "127.0.0.1:1", "--node-pool",
                        name, "--capacity-tokens", "64", "--page-tokens", "128", "--layers", "2"});
  EXPECT_EQ(r.code, kExitUsage) << r.err;
  EXPECT_NE(r.err.find("--node-pool '" + name + "'"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("host_capacity_tokens must hold at least one page"), std::string::npos)
      << r.err;
  EXPECT_FALSE(std::filesystem::exists("/dev/shm/" + name));
}

// More memory than the machine has is refused before anything is allocated, at once, naming the
// flags that size it (capacity.h). The newcomer's command (1000 bf16 layers at the CPU's batch 4)
// needs 57.1 GB, which some machines have; at batch 512, 128 times that (7.31 TB), none has.
TEST(CliTest, ABenchLargerThanTheMachineIsRefusedAtOnceNamingItsFlags) {
  const auto start = std::chrono::steady_clock::now();
  const CliRun r = Cli({"bench", "--backend", "cpu", "--preset", "glm-5", "--precision", "bf16",
                        "--layers", "1000", "--batch", "512", "--steps", "2", "--warmup", "1"});
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(1));
  EXPECT_EQ(r.code, kExitFailure) << r.err;
  EXPECT_TRUE(r.out.empty()) << r.out;
  for (const char* part : {"host pool and hot cache: --batch 512 x 8256 rows", "x 1000 layers",
                           "needs 7.31 TB of host memory",
                           "is available; lower --batch, --context, "
                           "--hot-slots or --layers"}) {
    EXPECT_NE(r.err.find(part), std::string::npos) << part << "\n" << r.err;
  }
}

TEST(CliTest, AHostPoolBeyond32BitRowsNamesTheFlags) {
  const CliRun r = Cli({"bench", "--backend", "cpu", "--context", "2000000000"});
  EXPECT_EQ(r.code, kExitUsage) << r.err;
  EXPECT_NE(r.err.find("more than its 2^31 - 1; lower --batch or --context"), std::string::npos)
      << r.err;
  EXPECT_EQ(r.err.find("host_capacity_tokens"), std::string::npos) << r.err;
}

// A node pool larger than its directory's file system is refused before its file is made, in
// the flags' words (86 TB: more than any file system here).
TEST(CliTest, PoolSaysHowMuchOfItsDirectoryANodePoolNeeds) {
  const std::string name = "sparsekv-cli-capacity-" + std::to_string(getpid());
  const std::string dir = ::testing::TempDir();
  const auto start = std::chrono::steady_clock::now();
  const CliRun r = Cli({"pool", "--node-id", "a", "--control-plane", "127.0.0.1:1", "--node-pool",
                        name, "--node-pool-dir", dir, "--capacity-tokens", "2147483584"});
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(1));
  EXPECT_EQ(r.code, kExitFailure) << r.err;
  for (const std::string part :
       {"node pool '" + name + "': (--capacity-tokens 2147483584 x --layers 61 x --row-bytes 656",
        std::string("needs 85.94 TB of ") + dir,
        std::string("is free there; lower --capacity-tokens")}) {
    EXPECT_NE(r.err.find(part), std::string::npos) << part << "\n" << r.err;
  }
  EXPECT_EQ(r.err.find("Bad address"), std::string::npos) << r.err;
  EXPECT_FALSE(std::filesystem::exists(dir + "/" + name));
}

TEST(CliTest, PoolRefusesARegionLargerThanTheMemory) {
  const CliRun r = Cli({"pool", "--node-id", "a", "--control-plane", "127.0.0.1:1", "--region-mib",
                        "1073741824"});  // 1 PiB
  EXPECT_EQ(r.code, kExitFailure) << r.err;
  EXPECT_NE(r.err.find("region: --region-mib 1073741824 needs 1.13 PB of host memory"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("is available; lower --region-mib"), std::string::npos) << r.err;
}

TEST(CliTest, WindowBeyondTheContextIsRefused) {
  std::vector<std::string> args = SmallCpuArgs();
  args.insert(args.end(), {"--window", "100000"});
  const CliRun r = Cli(args);
  EXPECT_EQ(r.code, kExitUsage);
  EXPECT_NE(r.err.find("--window (100000) must be <= --context (1024)"), std::string::npos)
      << r.err;
}

TEST(CliTest, AHotCacheLargerThanTheKVSavesNothingAndSaysSo) {
  std::vector<std::string> args = SmallCpuArgs();
  args.insert(args.end(), {"--window", "1024"});  // 128 slots + 1024 window > 1024 tokens
  const CliRun r = Cli(args);
  ASSERT_EQ(r.code, kExitOk) << r.err;
  EXPECT_NE(r.out.find("HBM saved         none"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("HBM saved         -"), std::string::npos) << r.out;
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

TEST(CliTest, UnwritableOutputPathsAreRefusedBeforeTheRun) {
  for (const char* option : {"--json", "--csv"}) {
    std::vector<std::string> args = SmallCpuArgs();
    args.insert(args.end(), {option, "/nonexistent-dir/out.txt"});
    const CliRun r = Cli(args);
    EXPECT_EQ(r.code, kExitUsage) << option;
    EXPECT_NE(r.err.find(std::string(option) + ": cannot open '/nonexistent-dir/out.txt' for "
                                               "writing"),
              std::string::npos)
        << r.err;
    EXPECT_TRUE(r.out.empty()) << r.out;  // nothing ran
  }
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"plan", "--json", "/nonexistent-dir/p.json"},
        {"replay", "--steps", "8", "--json", "/nonexistent-dir/r.json"},
        {"replay", "--steps", "8", "--write-trace", "/nonexistent-dir/r.skvt"},
        {"multi-turn", "--json", "/nonexistent-dir/m.json"}}) {
    const CliRun r = Cli(args);
    EXPECT_EQ(r.code, kExitUsage) << args[0] << "\n" << r.err;
    EXPECT_NE(r.err.find("cannot open '/nonexistent-dir/"), std::string::npos) << r.err;
    EXPECT_TRUE(r.out.empty()) << r.out;
  }
}

TEST(CliTest, CheckingAnOutputPathLeavesNoFileBehind) {
  const std::string path = ::testing::TempDir() + "sparsekv_cli_test_left.json";
  std::remove(path.c_str());
  // A usage error after the path check: the check's file must not stay.
  const CliRun r = Cli({"bench", "--backend", "cpu", "--json", path, "--window", "100000"});
  EXPECT_EQ(r.code, kExitUsage);
  EXPECT_FALSE(std::ifstream(path).good());
}

// ---- --config FILE (common/config_file.h) ----

// Writes `text` to a file of the test's temporary directory and returns its path.
std::string WriteConfig(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + "sparsekv_cli_test_" + name + ".json";
  std::ofstream(path) << text;
  return path;
}

// A small CPU run of the bench whose cache comes from the file.
std::vector<std::string> ConfigBenchArgs(const std::string& config) {
  return {"bench",     "--backend", "cpu",     "--config", config,     "--batch", "2",
          "--context", "1024",      "--steps", "5",        "--warmup", "1"};
}

TEST(CliTest, BenchConfigFileSetsTheCacheAndTheJsonEchoesIt) {
  const std::string config =
      WriteConfig("bench_config", R"({"geometry": {"num_layers": 3, "row_bytes": 656}, "top_k": 64,
                          "hot_slots": 128, "eviction": "lru", "max_requests": 99})");
  const std::string path = ::testing::TempDir() + "sparsekv_cli_test_config_out.json";
  std::vector<std::string> args = ConfigBenchArgs(config);
  args.insert(args.end(), {"--json", path});
  const CliRun r = Cli(args);
  ASSERT_EQ(r.code, kExitOk) << r.err;
  EXPECT_NE(r.out.find("sparsekv bench: CPU reference backend\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("config            " + config +
                       " (geometry, top_k, hot_slots, eviction; sized by the bench instead: "
                       "max_requests)"),
            std::string::npos)
      << r.out;
  std::ifstream file(path);
  const nlohmann::json j = nlohmann::json::parse(file);
  EXPECT_EQ(j["config"], config);
  EXPECT_EQ(j["layers"], 3);
  const nlohmann::json& o = j["cache_options"];
  EXPECT_EQ(o["geometry"]["num_layers"], 3);
  EXPECT_EQ(o["top_k"], 64);
  EXPECT_EQ(o["hot_slots"], 128);
  EXPECT_EQ(o["eviction"], "lru");
  EXPECT_EQ(o["max_requests"], 2);  // --batch: the bench sizes it
}

TEST(CliTest, BenchConfigFlagsSetWhatTheFileLeavesOut) {
  const std::string config = WriteConfig("bench_partial", R"({"eviction": "lru", "window": 4})");
  std::vector<std::string> args = ConfigBenchArgs(config);
  const std::string path = ::testing::TempDir() + "sparsekv_cli_test_partial_out.json";
  args.insert(args.end(), {"--layers", "2", "--top-k", "64", "--hot-slots", "256", "--json", path});
  const CliRun r = Cli(args);
  ASSERT_EQ(r.code, kExitOk) << r.err;
  std::ifstream file(path);
  const nlohmann::json o = nlohmann::json::parse(file)["cache_options"];
  EXPECT_EQ(o["geometry"]["num_layers"], 2);
  EXPECT_EQ(o["top_k"], 64);
  EXPECT_EQ(o["hot_slots"], 256);
  EXPECT_EQ(o["window"], 4);
  EXPECT_EQ(o["eviction"], "lru");
}

TEST(CliTest, BenchConfigFlagForAKeyOfTheFileIsRefusedNamingBoth) {
  const std::string config = WriteConfig(
      "bench_conflict", R"({"geometry": {"num_layers": 3, "row_bytes": 656}, "top_k": 64,
                            "hot_slots": 128})");
  for (const auto& [flag, value, key] : {std::tuple{"--hot-slots", "256", "hot_slots"},
                                         {"--layers", "2", "geometry"},
                                         {"--precision", "bf16", "geometry"}}) {
    std::vector<std::string> args = ConfigBenchArgs(config);
    args.insert(args.end(), {flag, value});
    const CliRun r = Cli(args);
    EXPECT_EQ(r.code, kExitUsage) << flag;
    EXPECT_NE(r.err.find("--config " + config + ": " + flag + " sets \"" + key +
                         "\", which the file sets too"),
              std::string::npos)
        << r.err;
    EXPECT_TRUE(r.out.empty()) << r.out;
  }
}

TEST(CliTest, BenchConfigBadFilesNameTheFileAndWhatIsWrong) {
  const std::string missing = ::testing::TempDir() + "sparsekv_cli_test_no_such_config.json";
  const std::vector<std::pair<std::string, std::string>> bad = {
      {missing, "cannot read the file: No such file or directory"},
      {::testing::TempDir(), "cannot read the file: it is a directory"},
      {WriteConfig("not_json", R"({"top_k": 64,)"), "not valid JSON"},
      {WriteConfig("unknown_key", R"({"hot_slot": 128})"), "unknown key \"hot_slot\""},
      {WriteConfig("wrong_type", R"({"top_k": "64"})"), "top_k must be an integer"},
      {WriteConfig("invalid", R"({"top_k": 64, "hot_slots": 32})"), "hot_slots (32)"},
      {WriteConfig("bad_rows", R"({"geometry": {"num_layers": 2, "row_bytes": 500}})"),
       "geometry: the bench runs the presets' rows"},
  };
  for (const auto& [config, part] : bad) {
    const CliRun r = Cli(ConfigBenchArgs(config));
    EXPECT_EQ(r.code, kExitUsage) << config;
    EXPECT_NE(r.err.find("sparsekv bench: --config " + config + ": "), std::string::npos) << r.err;
    EXPECT_NE(r.err.find(part), std::string::npos) << part << "\n" << r.err;
    EXPECT_TRUE(r.out.empty()) << r.out;
  }
}

// The node pool takes its shape from the file and says so before it joins the control plane
// (none listens here: the run then fails, and leaves no segment behind). The file's hot-cache
// keys are the processes' and are checked against the library's defaults, not the pool's.
TEST(CliTest, PoolConfigFileSetsTheNodePoolShape) {
  const std::string config = WriteConfig(
      "pool_config", R"({"geometry": {"num_layers": 2, "row_bytes": 656}, "host_page_tokens": 16,
                         "host_capacity_tokens": 1024, "max_context": 512, "top_k": 2048,
                         "indexer_key_bytes": 132})");
  const std::string name = "sparsekv-cli-config-" + std::to_string(getpid());
  const std::string dir = ::testing::TempDir();
  const CliRun r = Cli({"pool", "--node-id", "a", "--control-plane", "127.0.0.1:1", "--node-pool",
                        name, "--node-pool-dir", dir, "--config", config});
  EXPECT_EQ(r.code, kExitFailure) << r.err;
  EXPECT_NE(r.out.find("pool: --config " + config +
                       ": node pool of 2 layers, 1312 B per token, host_page_tokens 16, "
                       "host_capacity_tokens 1024, max_context 512"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.err.find("control plane"), std::string::npos) << r.err;
  EXPECT_FALSE(std::filesystem::exists(dir + "/" + name));
}

TEST(CliTest, PoolConfigRefusesAFlagForAKeyOfTheFileAndABadFile) {
  const std::string config =
      WriteConfig("pool_conflict", R"({"host_capacity_tokens": 1024, "max_context": 512})");
  const std::vector<std::string> pool = {"pool",   "--node-id",       "a",          "--node-pool",
                                         "unused", "--control-plane", "127.0.0.1:1"};
  std::vector<std::string> conflict = pool;
  conflict.insert(conflict.end(), {"--config", config, "--max-context", "256"});
  const CliRun r = Cli(conflict);
  EXPECT_EQ(r.code, kExitUsage) << r.err;
  EXPECT_NE(r.err.find("--config " + config +
                       ": --max-context sets \"max_context\", which the file sets too"),
            std::string::npos)
      << r.err;
  std::vector<std::string> unknown = pool;
  unknown.insert(unknown.end(), {"--config", WriteConfig("pool_unknown", R"({"pages": 4})")});
  const CliRun u = Cli(unknown);
  EXPECT_EQ(u.code, kExitUsage) << u.err;
  EXPECT_NE(u.err.find("unknown key \"pages\""), std::string::npos) << u.err;
  EXPECT_TRUE(r.out.empty() && u.out.empty()) << r.out << u.out;
}

// A stream whose every write fails, as standard output does on a full disk.
class FullStreamBuf : public std::streambuf {
 protected:
  int overflow(int) override { return traits_type::eof(); }
  std::streamsize xsputn(const char*, std::streamsize) override { return 0; }
};

TEST(CliTest, AFailedWriteOfTheReportIsAFailedRun) {
  FullStreamBuf full;
  std::ostream out(&full);
  std::ostringstream err;
  EXPECT_EQ(RunCli(std::vector<std::string>{"plan", "--contexts", "32768"}, out, err, false),
            kExitFailure);
  EXPECT_NE(err.str().find("cannot write the output"), std::string::npos) << err.str();
}

}  // namespace
}  // namespace sparsekv::tools
