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
#include "tools/sparsekv/bench.h"
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
            int64_t{4} * (256 + 4) * 656 + int64_t{4} * 256 * 2 * 4);
  EXPECT_EQ(r->hbm_saved_bytes_per_request,
            r->full_kv_bytes_per_request - r->hot_cache_bytes_per_request);
  EXPECT_GT(r->host_pool_bytes, int64_t{3} * 2008 * 4 * 656 - 1);
  EXPECT_NE(FormatBenchTable(*r).find("CPU reference backend"), std::string::npos);
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
