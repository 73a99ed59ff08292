// Tests of `sparsekv replay`: the trace format, the policy simulators (lru slot for slot against
// the manager on the CPU backend), the replay's statistics, and the command line.
#include "tools/sparsekv/replay.h"

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "sparsekv/backend.h"
#include "sparsekv/manager.h"
#include "tools/sparsekv/cli.h"

namespace sparsekv::tools {
namespace {

Trace SmallTrace() {
  Trace t;
  t.Resize(2, 3, 4);
  t.metadata = R"({"source": "test"})";
  for (size_t i = 0; i < t.seq_len.size(); ++i) t.seq_len[i] = 10 + static_cast<int32_t>(i);
  for (size_t i = 0; i < t.positions.size(); ++i) t.positions[i] = static_cast<int32_t>(i % 9) - 1;
  return t;
}

TEST(TraceFormatTest, RoundTrips) {
  const std::string path = ::testing::TempDir() + "/round.skvt";
  const Trace t = SmallTrace();
  ASSERT_TRUE(WriteTrace(path, t).ok());
  StatusOr<Trace> back = ReadTrace(path);
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->layers, 2);
  EXPECT_EQ(back->top_k, 3);
  EXPECT_EQ(back->steps, 4);
  EXPECT_EQ(back->metadata, t.metadata);
  EXPECT_EQ(back->seq_len, t.seq_len);
  EXPECT_EQ(back->positions, t.positions);
  EXPECT_EQ(back->row(1, 1)[0], t.positions[9]);
}

TEST(TraceFormatTest, RejectsBadFiles) {
  const std::string dir = ::testing::TempDir();
  std::ofstream(dir + "/bad_magic.skvt") << "NOTATRACE-------------------";
  EXPECT_EQ(ReadTrace(dir + "/bad_magic.skvt").status().code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(WriteTrace(dir + "/whole.skvt", SmallTrace()).ok());
  std::ifstream whole(dir + "/whole.skvt", std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(whole)), {});
  std::ofstream(dir + "/cut.skvt", std::ios::binary) << bytes.substr(0, bytes.size() - 4);
  EXPECT_EQ(ReadTrace(dir + "/cut.skvt").status().code(), StatusCode::kInvalidArgument);
  std::ofstream(dir + "/long.skvt", std::ios::binary) << bytes << "x";
  EXPECT_EQ(ReadTrace(dir + "/long.skvt").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ReadTrace(dir + "/missing.skvt").status().code(), StatusCode::kUnavailable);
  Trace wrong = SmallTrace();
  wrong.positions.pop_back();
  EXPECT_EQ(WriteTrace(dir + "/wrong.skvt", wrong).code(), StatusCode::kInvalidArgument);
}

RowOutcome StepRow(PolicySimulator& p, std::vector<int32_t> row, int32_t seq_len) {
  return p.Step(row, seq_len);
}

TEST(PolicyTest, LruEvictsLeastRecentlyUsed) {
  auto lru = MakePolicy({PolicyKind::kLru, 2, 1});
  EXPECT_EQ(StepRow(*lru, {0, 1}, 10).misses, 2);  // fills 0, 1
  EXPECT_EQ(StepRow(*lru, {0}, 10).hits, 1);       // 1 is now the least recently used
  EXPECT_EQ(StepRow(*lru, {2}, 10).misses, 1);     // evicts 1
  EXPECT_EQ(StepRow(*lru, {0, 2}, 10).hits, 2);
  const RowOutcome o = StepRow(*lru, {-1, 9, 10, 0, 0}, 10);  // pad, window, out of range, dup
  EXPECT_EQ(o.window_hits, 1);
  EXPECT_EQ(o.skipped, 3);
  EXPECT_EQ(o.hits, 1);
}

TEST(PolicyTest, ClockGivesASecondChance) {
  auto clock = MakePolicy({PolicyKind::kClock, 3, 1});
  StepRow(*clock, {0, 1, 2}, 20);  // every bit set, hand at slot 0
  // The sweep clears 0, 1, 2 and takes slot 0 (position 0) for position 3.
  EXPECT_EQ(StepRow(*clock, {3}, 20).misses, 1);
  StepRow(*clock, {1}, 20);  // sets position 1's bit again
  // Hand at slot 1: position 1 is referenced (cleared, skipped); slot 2 (position 2) is taken.
  StepRow(*clock, {4}, 20);
  EXPECT_EQ(StepRow(*clock, {1, 3, 4}, 20).hits, 3);
  EXPECT_EQ(StepRow(*clock, {2}, 20).misses, 1);
}

TEST(PolicyTest, LfuDecayKeepsFrequentlyUsedPositions) {
  auto lfu = MakePolicy({PolicyKind::kLfuDecay, 2, 1, 0.9});
  for (int i = 0; i < 5; ++i) StepRow(*lfu, {0}, 30);  // position 0: five uses
  StepRow(*lfu, {1}, 30);                              // position 1: one, more recent
  StepRow(*lfu, {2}, 30);                              // evicts 1 (lower score), where lru evicts 0
  EXPECT_EQ(StepRow(*lfu, {0}, 30).hits, 1);
  auto lru = MakePolicy({PolicyKind::kLru, 2, 1});
  for (int i = 0; i < 5; ++i) StepRow(*lru, {0}, 30);
  StepRow(*lru, {1}, 30);
  StepRow(*lru, {2}, 30);
  EXPECT_EQ(StepRow(*lru, {0}, 30).misses, 1);
}

// The lru simulator returns the manager's slots, entry for entry, on random rows with reuse,
// padding, duplicates, out-of-range positions and window hits.
TEST(PolicyTest, LruMatchesTheManagerOnTheCpuBackend) {
  for (int32_t window : {1, 3}) {
    CacheOptions o;
    o.geometry = KVGeometry::Uniform(2, 8);
    o.top_k = 16;
    o.hot_slots = 24;
    o.window = window;
    o.host_capacity_tokens = 1024;
    o.max_requests = 1;
    o.max_context = 256;
    auto m = SparseKVCacheManager::Create(o, CreateCpuBackend());
    ASSERT_TRUE(m.ok()) << m.status().message();
    SparseKVCacheManager& mgr = **m;
    const int32_t prompt = 64, steps = 60;
    ASSERT_TRUE(mgr.Admit(1, prompt, steps, nullptr).ok());
    std::vector<std::byte> rows(prompt * 8, std::byte{1});
    for (int32_t l = 0; l < 2; ++l) ASSERT_TRUE(mgr.IngestPrompt(1, l, rows.data(), nullptr).ok());

    std::vector<std::unique_ptr<PolicySimulator>> sims;
    for (int32_t l = 0; l < 2; ++l) sims.push_back(MakePolicy({PolicyKind::kLru, 24, window}));
    std::mt19937 rng(window);
    std::vector<int32_t> topk(16), slots(16), expected(16), previous(16, 0);
    const std::vector<uint64_t> batch = {1};
    for (int32_t s = 0; s < steps; ++s) {
      const int32_t seq_len = prompt + s + 1;
      ASSERT_TRUE(mgr.PlanStep(batch, nullptr).ok());
      for (int32_t l = 0; l < 2; ++l) {
        for (int32_t k = 0; k < 16; ++k) {
          const int32_t kind = static_cast<int32_t>(rng() % 10);
          topk[k] = kind < 5   ? previous[rng() % 16]
                    : kind < 8 ? static_cast<int32_t>(rng() % seq_len)
                    : kind < 9 ? seq_len - 1 - static_cast<int32_t>(rng() % 3)
                               : static_cast<int32_t>(rng() % (seq_len + 4)) - 2;
        }
        std::vector<std::byte> new_row(8, std::byte{2});
        ASSERT_TRUE(mgr.AppendToken(l, new_row.data(), nullptr).ok());
        ASSERT_TRUE(mgr.RunLayer(l, topk.data(), slots.data(), nullptr, nullptr).ok());
        sims[l]->Step(topk, seq_len, expected);
        for (int32_t k = 0; k < 16; ++k) {
          const int32_t got = slots[k] < 0 ? -1 : slots[k] % (24 + window);
          ASSERT_EQ(got, expected[k]) << "window " << window << " step " << s << " layer " << l
                                      << " entry " << k << " position " << topk[k];
        }
        previous = topk;
        for (int32_t& p : previous) p = std::clamp(p, 0, seq_len - 1);
      }
      ASSERT_TRUE(mgr.FinishStep(nullptr).ok());
    }
  }
}

TEST(ReplayTest, CountsHitsAndBytesOnATinyTrace) {
  // One layer, top-k 2, three steps: {0,1}, {0,1}, {2,3}; seq_len 10 (no window hits).
  Trace t;
  t.Resize(1, 2, 3);
  t.positions = {0, 1, 0, 1, 2, 3};
  t.seq_len = {10, 10, 10};
  ReplayOptions o;
  o.hot_slots = {2};
  o.policies = {PolicyKind::kLru};
  o.warmup_steps = 0;
  o.row_bytes = 100;
  StatusOr<ReplayResult> r = Replay(t, o);
  ASSERT_TRUE(r.ok()) << r.status().message();
  ASSERT_EQ(r->results.size(), 1u);
  EXPECT_DOUBLE_EQ(r->results[0].hit_rate, 2.0 / 6);
  EXPECT_EQ(r->results[0].misses, 4u);
  EXPECT_DOUBLE_EQ(r->results[0].bytes_moved, 400);
  EXPECT_EQ(r->results[0].step_hit_rate, (std::vector<double>{0, 1, 0}));
  // Reuse distances: 0 and 1 are reused after one step; 2 and 3 and the first 0, 1 are new.
  EXPECT_EQ(r->stats.reuse_distance[0], 2u);
  EXPECT_EQ(r->stats.first_uses, 4u);
  o.hot_slots = {1};
  EXPECT_EQ(Replay(t, o).status().code(), StatusCode::kInvalidArgument);
}

TEST(ReplayTest, FitsTheGeneratorsReuseFromItsOwnTrace) {
  TopKGeneratorOptions g;
  g.top_k = 128;
  g.reuse = 0.6;
  g.recency = 0.1;
  g.sinks = 4;
  const Trace t = SyntheticTrace(g, 4, 40, 4096);
  const TraceStats s = MeasureTrace(t, 16);
  EXPECT_EQ(s.fitted.sinks, 4);
  EXPECT_NEAR(s.fitted.reuse, 0.6, 0.05);  // chance overlaps add a little
  EXPECT_NEAR(s.fitted.recency, 0.1, 0.05);
  EXPECT_LT(s.fitted.early_layer_reuse, 0.1);
}

int Cli(std::vector<std::string> args, std::ostream& out, std::ostream& err) {
  return RunCli(args, out, err, /*progress_bar=*/false);
}

TEST(ReplayCommandTest, ReplaysSyntheticAndFileTraces) {
  const std::string dir = ::testing::TempDir();
  std::ostringstream out, err;
  ASSERT_EQ(Cli({"replay", "--layers", "3", "--steps", "40", "--context", "2048", "--top-k", "64",
                 "--write-trace", dir + "/syn.skvt", "--json", dir + "/r1.json"},
                out, err),
            kExitOk)
      << err.str();
  EXPECT_NE(out.str().find("window8-lru"), std::string::npos) << out.str();
  std::ostringstream out2;
  ASSERT_EQ(Cli({"replay", "--trace", dir + "/syn.skvt", "--hot-slots", "128", "--synthetic-like",
                 "--json", dir + "/r2.json"},
                out2, err),
            kExitOk)
      << err.str();
  std::ifstream file(dir + "/r2.json");
  const nlohmann::json j = nlohmann::json::parse(file);
  EXPECT_TRUE(j["summary"].contains("replay_best_policy_hit_rate_gain"));
  EXPECT_TRUE(j.contains("synthetic_like"));
  EXPECT_EQ(j["trace"]["results"].size(), 4u);  // lru, clock, lfu-decay, window8-lru
}

TEST(ReplayCommandTest, RejectsBadArguments) {
  std::ostringstream out, err;
  EXPECT_EQ(Cli({"replay", "--top-k", "64", "--context", "2048", "--hot-slots", "32"}, out, err),
            kExitUsage);
  EXPECT_EQ(Cli({"replay", "--policies", "fifo"}, out, err), kExitUsage);
  EXPECT_EQ(Cli({"replay", "--top-k", "4096", "--context", "2048"}, out, err), kExitUsage);
}

}  // namespace
}  // namespace sparsekv::tools
