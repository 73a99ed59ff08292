// Tests of `sparsekv replay --preset`: the presets' replayed layers and units, the trace of that
// shape, a replay in entry units against a hand computation, the uncorrelated worst case against
// its formula, the lru of a preset the manager serves against the manager, and the refusals.
#include "tools/sparsekv/replay/preset_replay.h"

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "sparsekv/backend.h"
#include "sparsekv/manager.h"
#include "tools/sparsekv/cli.h"
#include "tools/sparsekv/common/exit_codes.h"
#include "tools/sparsekv/replay/replay.h"

namespace sparsekv::tools {
namespace {

int Cli(std::vector<std::string> args, std::ostream& out, std::ostream& err) {
  return RunCli(args, out, err, /*progress_bar=*/false);
}

PresetReplayShape Shape(const std::string& name) {
  StatusOr<PresetReplayShape> s = FindPresetReplayShape(name);
  EXPECT_TRUE(s.ok()) << s.status().message();
  return *s;
}

TEST(PresetReplayShapeTest, DeepSeekV4ReplaysItsCsaLayersInEntriesOfFourTokens) {
  const PresetReplayShape pro = Shape("deepseek-v4-pro");
  EXPECT_EQ(pro.model_layers, 62);
  EXPECT_EQ(pro.layers, 30);  // the CSA layers; 31 HCA and 1 window-only are not replayed
  EXPECT_EQ(pro.row_sources(), 30);
  EXPECT_EQ(pro.top_k, 1024);
  EXPECT_EQ(pro.entry_tokens, 4);
  EXPECT_EQ(pro.row_bytes, 584);
  EXPECT_FALSE(pro.manager_serves);
  EXPECT_EQ(pro.entries(1 << 20), 262144);
  EXPECT_EQ(pro.entries(131075), 32768);  // the newest 3 tokens have no entry yet
  const PresetReplayShape flash = Shape("deepseek-v4-flash");
  EXPECT_EQ(flash.model_layers, 44);
  EXPECT_EQ(flash.layers, 21);
  EXPECT_EQ(flash.top_k, 512);
  EXPECT_EQ(flash.entry_tokens, 4);
  EXPECT_FALSE(flash.manager_serves);
}

TEST(PresetReplayShapeTest, Glm53ReplaysEveryLayerWithItsIndexGroupsRow) {
  const PresetReplayShape glm = Shape("glm-5.3");
  EXPECT_EQ(glm.layers, 78);
  EXPECT_EQ(glm.row_sources(), 21);
  EXPECT_EQ(glm.top_k, 2048);
  EXPECT_EQ(glm.entry_tokens, 1);
  EXPECT_TRUE(glm.manager_serves);  // explicit index groups, keys on the groups' first layers
  EXPECT_EQ(glm.row_source[1], 1);
  EXPECT_EQ(glm.row_source[2], 2);
  EXPECT_EQ(glm.row_source[5], 2);
  EXPECT_EQ(glm.row_source[6], 6);
  EXPECT_EQ(glm.row_source[77], 74);
  const PresetReplayShape v32 = Shape("deepseek-v3.2");
  EXPECT_EQ(v32.layers, 61);
  EXPECT_EQ(v32.row_sources(), 61);
  EXPECT_TRUE(v32.manager_serves);
  EXPECT_EQ(FindPresetReplayShape("deepseek-v5").status().code(), StatusCode::kNotFound);
}

TEST(PresetReplayShapeTest, ContextMustHoldTheTopKAndStayWithin1M) {
  const PresetReplayShape pro = Shape("deepseek-v4-pro");
  EXPECT_TRUE(CheckPresetContext(pro, 4096, "--context").ok());
  EXPECT_TRUE(CheckPresetContext(pro, 1 << 20, "--context").ok());
  const Status low = CheckPresetContext(pro, 4095, "--context");
  EXPECT_EQ(low.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(low.message().find("--context 4095: deepseek-v4-pro replays histories of 4096 to "
                               "1048576 tokens"),
            std::string::npos)
      << low.message();
  EXPECT_FALSE(CheckPresetContext(pro, (1 << 20) + 1, "--context").ok());
}

TEST(PresetTraceTest, RowsAreEntriesOfTheGrowingHistoryAndGroupsShareRows) {
  const PresetReplayShape flash = Shape("deepseek-v4-flash");
  TopKGeneratorOptions o = *LocalityPreset("glm5-published");
  const Trace t = PresetTrace(flash, o, 8, 131072);
  ASSERT_EQ(t.layers, 21);
  ASSERT_EQ(t.top_k, 512);
  for (int32_t step = 0; step < 8; ++step) {
    for (int32_t layer = 0; layer < t.layers; ++layer) {
      const int32_t seq_len = t.seq_len_at(step, layer);
      EXPECT_EQ(seq_len, step < 4 ? 32768 : 32769);  // an entry per 4 tokens
      const std::span<const int32_t> row = t.row(step, layer);
      const std::set<int32_t> distinct(row.begin(), row.end());
      EXPECT_EQ(distinct.size(), row.size());
      EXPECT_GE(*distinct.begin(), 0);
      EXPECT_LT(*distinct.rbegin(), seq_len);
    }
  }
  EXPECT_FALSE(std::equal(t.row(3, 0).begin(), t.row(3, 0).end(), t.row(3, 1).begin()));

  const PresetReplayShape glm = Shape("glm-5.3");
  const Trace g = PresetTrace(glm, o, 3, 4096);
  for (int32_t step = 0; step < 3; ++step) {
    EXPECT_EQ(g.seq_len_at(step, 5), 4096 + step);
    for (int32_t layer : {3, 4, 5}) {
      EXPECT_TRUE(
          std::equal(g.row(step, 2).begin(), g.row(step, 2).end(), g.row(step, layer).begin()))
          << layer;
    }
    EXPECT_FALSE(std::equal(g.row(step, 2).begin(), g.row(step, 2).end(), g.row(step, 6).begin()));
  }
}

// A CSA-like layer (an entry per 4 tokens), top-k 2, a hot cache of 2 x top-k = 4 slots plus the
// newest entry's window, lru, every step counted. The history is 40 + s tokens at step s: 10
// entries at steps 0-3, 11 at steps 4-5.
//   step 0 {0, 1}: 2 misses                      cache {0, 1}
//   step 1 {2, 3}: 2 misses                      cache {0, 1, 2, 3}
//   step 2 {0, 4}: 0 hits, 4 misses, evicts 1    cache {0, 2, 3, 4}
//   step 3 {2, 9}: 2 hits, 9 is the newest entry (window)
//   step 4 {9, 10}: 9 has left the window (the newest is 10): misses, evicts 3; 10 window
//   step 5 {0, 3}: 0 hits, 3 misses, evicts 4
// 12 lookups, 5 hits (three in slots, two in the window), 7 misses: hit rate 5/12.
TEST(PresetReplayTest, EntryUnitReplayMatchesAHandComputation) {
  PresetReplayShape shape;
  shape.preset = "hand";
  shape.layers = 1;
  shape.top_k = 2;
  shape.entry_tokens = 4;
  Trace t;
  t.Resize(1, 2, 6);
  t.positions = {0, 1, 2, 3, 0, 4, 2, 9, 9, 10, 0, 3};
  for (int32_t s = 0; s < 6; ++s) t.seq_len[s] = shape.entries(40 + s);
  ASSERT_EQ(t.seq_len[3], 10);
  ASSERT_EQ(t.seq_len[4], 11);
  ReplayOptions o;
  o.hot_slots = {2 * shape.top_k};
  o.policies = {PolicyKind::kLru};
  o.warmup_steps = 0;
  o.row_bytes = 584;
  StatusOr<ReplayResult> r = Replay(t, o);
  ASSERT_TRUE(r.ok()) << r.status().message();
  ASSERT_EQ(r->results.size(), 1u);
  EXPECT_DOUBLE_EQ(r->results[0].hit_rate, 5.0 / 12.0);
  EXPECT_EQ(r->results[0].misses, 7u);
  EXPECT_DOUBLE_EQ(r->results[0].bytes_moved, 7.0 * 584);
}

// Uncorrelated rows, the worst case: whatever lru keeps, the next row is drawn independently,
// so the hit rate is (C + 1) / entries. Flash at 16K tokens: 4096 entries, C = 1024; 21 layers
// x 24 counted steps x 512 lookups.
TEST(PresetReplayTest, UncorrelatedRowsHitTheCacheShareOfTheHistory) {
  const std::string json_path = ::testing::TempDir() + "preset_uncorrelated.json";
  std::ostringstream out, err;
  ASSERT_EQ(
      Cli({"replay", "--preset", "deepseek-v4-flash", "--synthetic-locality", "uncorrelated",
           "--context", "16384", "--steps", "40", "--policies", "lru,clock", "--json", json_path},
          out, err),
      kExitOk)
      << err.str();
  std::ifstream file(json_path);
  const nlohmann::json j = nlohmann::json::parse(file);
  EXPECT_EQ(j["preset"]["offloaded_layers"], 21);
  EXPECT_EQ(j["preset"]["context_entries"], 4096);
  EXPECT_EQ(j["preset"]["manager_serves"], false);
  const double history = j["summary"]["uncorrelated_mean_history"].get<double>();
  EXPECT_NEAR(history, 4096 + 27.5 / 4, 0.5);  // steps 16-39: tokens 16400-16423
  ASSERT_GE(j["trace"]["results"].size(), 2u);
  for (const nlohmann::json& r : j["trace"]["results"]) {
    EXPECT_EQ(r["hot_slots"], 1024);  // 2 x top-k by default
    EXPECT_DOUBLE_EQ(r["bytes_moved"].get<double>(), r["misses"].get<double>() * 584);
    EXPECT_NEAR(r["hit_rate"].get<double>(), 1025 / history, 0.01) << r["policy"];
  }
  EXPECT_NE(out.str().find("the replay's own (the manager does not serve these layers yet)"),
            std::string::npos)
      << out.str();
  EXPECT_NE(out.str().find("uncorrelated rows: expected hit rate"), std::string::npos);
}

// Where the manager serves a preset's layers (DeepSeek-V3.2: a row per token, its own top-k per
// layer), the replay's lru over the preset's trace returns the manager's slots entry for entry on
// the CPU backend, at the preset's top-k and 2 x top-k hot slots.
TEST(PresetReplayTest, LruOfAManagerServedPresetIsTheManagers) {
  const PresetReplayShape shape = Shape("deepseek-v3.2");
  ASSERT_TRUE(shape.manager_serves);
  const int32_t prompt = 4096, steps = 12, layers = 2, k = shape.top_k, hot = 2 * k;
  const Trace t = PresetTrace(shape, *LocalityPreset("glm5-published"), steps, prompt + 1);
  CacheOptions o;
  o.eviction = EvictionPolicy::kLru;
  o.geometry = KVGeometry::Uniform(layers, 8);
  o.top_k = k;
  o.hot_slots = hot;
  o.window = 1;
  o.host_capacity_tokens = 8192;
  o.max_requests = 1;
  o.max_context = 8192;
  auto m = SparseKVCacheManager::Create(o, CreateCpuBackend());
  ASSERT_TRUE(m.ok()) << m.status().message();
  SparseKVCacheManager& mgr = **m;
  ASSERT_TRUE(mgr.Admit(1, prompt, steps, nullptr).ok());
  std::vector<std::byte> rows(static_cast<size_t>(prompt) * 8, std::byte{1});
  for (int32_t l = 0; l < layers; ++l) {
    ASSERT_TRUE(mgr.IngestPrompt(1, l, rows.data(), nullptr).ok());
  }
  std::vector<std::unique_ptr<PolicySimulator>> sims;
  for (int32_t l = 0; l < layers; ++l) sims.push_back(MakePolicy({PolicyKind::kLru, hot, 1}));
  std::vector<int32_t> slots(k), expected(k);
  const std::vector<uint64_t> batch = {1};
  for (int32_t s = 0; s < steps; ++s) {
    ASSERT_TRUE(mgr.PlanStep(batch, nullptr).ok());
    for (int32_t l = 0; l < layers; ++l) {
      ASSERT_EQ(t.seq_len_at(s, l), prompt + s + 1);
      std::vector<std::byte> new_row(8, std::byte{2});
      ASSERT_TRUE(mgr.AppendToken(l, new_row.data(), nullptr).ok());
      const std::span<const int32_t> row = t.row(s, l);
      ASSERT_TRUE(mgr.RunLayer(l, row.data(), slots.data(), nullptr, nullptr).ok());
      sims[l]->Step(row, t.seq_len_at(s, l), expected);
      for (int32_t e = 0; e < k; ++e) {
        ASSERT_EQ(slots[e] < 0 ? -1 : slots[e] % (hot + 1), expected[e])
            << "step " << s << " layer " << l << " entry " << e;
      }
    }
    ASSERT_TRUE(mgr.FinishStep(nullptr).ok());
  }
}

// --preset defaults to the calibrated locality; --miss-rate asks for miss-rate mode instead, its
// fresh positions drawn from the entries of the first step's history.
TEST(PresetReplayCommandTest, DefaultsToTheCalibratedLocalityUnlessMissRateIsAsked) {
  const std::string dir = ::testing::TempDir();
  std::ostringstream out, err;
  ASSERT_EQ(Cli({"replay", "--preset", "deepseek-v4-flash", "--context", "65536", "--steps", "24",
                 "--policies", "lru", "--json", dir + "preset_calibrated.json"},
                out, err),
            kExitOk)
      << err.str();
  ASSERT_EQ(
      Cli({"replay", "--preset", "deepseek-v4-flash", "--context", "65536", "--steps", "24",
           "--policies", "lru", "--miss-rate", "0.25", "--json", dir + "preset_missrate.json"},
          out, err),
      kExitOk)
      << err.str();
  std::ifstream calibrated_file(dir + "preset_calibrated.json");
  const nlohmann::json calibrated =
      nlohmann::json::parse(nlohmann::json::parse(calibrated_file)["metadata"].get<std::string>());
  EXPECT_EQ(calibrated["generator"]["locality"], true);
  EXPECT_FALSE(calibrated["generator"].contains("miss_rate"));
  std::ifstream missrate_file(dir + "preset_missrate.json");
  const nlohmann::json j = nlohmann::json::parse(missrate_file);
  const nlohmann::json missrate = nlohmann::json::parse(j["metadata"].get<std::string>());
  EXPECT_EQ(missrate["generator"]["locality"], false);
  EXPECT_EQ(missrate["generator"]["miss_rate"], 0.25);
  EXPECT_EQ(missrate["generator"]["fresh_range"], 16383);  // 16384 entries at the first step
  // An lru cache of 1024 slots misses the fresh 25% of each row of 512 (topk_generator.h).
  EXPECT_NEAR(j["trace"]["results"][0]["hit_rate"].get<double>(), 0.75, 0.01);
}

TEST(PresetReplayCommandTest, RefusesWhatDoesNotApplyNamingIt) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--preset", "deepseek-v4-pro", "--trace", "/dev/null"},
       "--preset replays the synthetic generator over the preset's layers, --trace"},
      {{"--preset", "deepseek-v4-pro", "--layers", "4", "--top-k", "64"},
       "--layers, --top-k: --preset deepseek-v4-pro sets them"},
      {{"--preset", "deepseek-v4-pro", "--context", "2048"},
       "--context 2048: deepseek-v4-pro replays histories of 4096 to 1048576 tokens"},
      {{"--preset", "deepseek-v4-flash", "--context", "1048576", "--steps", "2"},
       "--steps 2: the history would reach 1048577 tokens"},
      {{"--preset", "deepseek-v4-pro", "--context", "8192", "--prefetch", "window-exit"},
       "--prefetch: replays the manager's prefetch paths, and the manager path does not serve "
       "deepseek-v4-pro's offloaded layers"},
      {{"--preset", "deepseek-v4-flash", "--context", "8192", "--crosslayer-prefetch"},
       "--crosslayer-prefetch: replays the manager's prefetch paths"},
      {{"--preset", "deepseek-v4-pro", "--synthetic-locality", "uncorrelated", "--reuse", "0.5"},
       "--reuse: --synthetic-locality uncorrelated draws every row uniformly"},
      {{"--preset", "deepseek-v5"}, "--preset"},
  };
  for (const auto& [flags, expected] : cases) {
    std::vector<std::string> args = {"replay"};
    args.insert(args.end(), flags.begin(), flags.end());
    std::ostringstream o, e;
    EXPECT_EQ(Cli(args, o, e), kExitUsage) << expected << "\n" << e.str();
    EXPECT_NE(e.str().find(expected), std::string::npos) << expected << "\n" << e.str();
    EXPECT_TRUE(o.str().empty()) << o.str();
  }
}

}  // namespace
}  // namespace sparsekv::tools
