// Tests of `sparsekv replay`: the policies (lru and slru, run by the library's reference resolve,
// slot for slot against the manager on the CPU backend), the replay's statistics, and the
// command line.
#include "tools/sparsekv/replay/replay.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "sparsekv/backend.h"
#include "sparsekv/manager.h"
#include "tools/sparsekv/cli.h"
#include "tools/sparsekv/replay/crosslayer_prefetch.h"
#include "tools/sparsekv/replay/prefetch_predictors.h"

namespace sparsekv::tools {
namespace {

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

TEST(PolicyTest, ClockGivesAHitPositionASecondChance) {
  auto clock = MakePolicy({PolicyKind::kClock, 3, 1});
  StepRow(*clock, {0, 1, 2}, 20);  // fills slots 0, 1, 2 unused; the hand wraps to slot 0
  EXPECT_EQ(StepRow(*clock, {1}, 20).hits, 1);    // position 1's count rises to 1
  EXPECT_EQ(StepRow(*clock, {3}, 20).misses, 1);  // slot 0 (position 0) is taken
  // From slot 1: position 1's count falls to 0 and it is passed; slot 2 (position 2) is taken.
  EXPECT_EQ(StepRow(*clock, {4}, 20).misses, 1);
  EXPECT_EQ(StepRow(*clock, {1, 3, 4}, 20).hits, 3);
  EXPECT_EQ(StepRow(*clock, {2}, 20).misses, 1);
  EXPECT_EQ(StepRow(*clock, {0}, 20).misses, 1);
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

TEST(PolicyTest, SlruProtectsPositionsHitAgain) {
  // 4 slots, 2 protected (50%). Positions 0 and 1 are hit once more: protected.
  auto slru = MakePolicy({.kind = PolicyKind::kSlru, .slots = 4, .protected_percent = 50});
  StepRow(*slru, {0, 1}, 40);
  StepRow(*slru, {0, 1}, 40);
  // Four new positions over two steps: the probationary fills are evicted, 0 and 1 stay.
  EXPECT_EQ(StepRow(*slru, {2, 3}, 40).misses, 2);
  EXPECT_EQ(StepRow(*slru, {4, 5}, 40).misses, 2);
  EXPECT_EQ(StepRow(*slru, {0, 1}, 40).hits, 2);
  // lru keeps the most recent four instead.
  auto lru = MakePolicy({PolicyKind::kLru, 4, 1});
  for (auto row : {std::vector<int32_t>{0, 1}, {0, 1}, {2, 3}, {4, 5}}) StepRow(*lru, row, 40);
  EXPECT_EQ(StepRow(*lru, {0, 1}, 40).misses, 2);
  // Protected overflow is demoted, not evicted at once: with 1 protected slot, 0 then 1 are hit
  // again; 1 takes the protected slot and 0 returns to the probationary part, behind the fill of
  // 6 in the same step.
  auto small = MakePolicy({.kind = PolicyKind::kSlru, .slots = 3, .protected_percent = 34});
  StepRow(*small, {0}, 40);
  StepRow(*small, {0}, 40);  // 0 protected
  StepRow(*small, {1}, 40);
  StepRow(*small, {1, 6}, 40);                    // 1 promoted, 0 demoted after the fill of 6
  EXPECT_EQ(StepRow(*small, {8}, 40).misses, 1);  // evicts 6, the oldest probationary entry
  EXPECT_EQ(StepRow(*small, {0, 1}, 40).hits, 2);
}

TEST(PolicyTest, AgingPrefersFrequentPositionsAndShiftOneIsRecency) {
  auto aging = MakePolicy({.kind = PolicyKind::kAging, .slots = 2, .aging_shift = 3});
  for (int i = 0; i < 5; ++i) StepRow(*aging, {0}, 30);
  StepRow(*aging, {1}, 30);
  StepRow(*aging, {2}, 30);  // evicts 1: five uses decayed by 7/8 outweigh one newer use
  EXPECT_EQ(StepRow(*aging, {0}, 30).hits, 1);
  auto halving = MakePolicy({.kind = PolicyKind::kAging, .slots = 2, .aging_shift = 1});
  for (int i = 0; i < 5; ++i) StepRow(*halving, {0}, 30);
  StepRow(*halving, {1}, 30);
  StepRow(*halving, {2}, 30);  // evicts 0, as lru does
  EXPECT_EQ(StepRow(*halving, {0}, 30).misses, 1);
}

// The lru, slru and clock simulators return the manager's slots (EvictionPolicy kLru,
// kSegmentedLru and kClock), entry for entry, on random rows with reuse, padding, duplicates,
// out-of-range positions and window hits.
TEST(PolicyTest, LruSlruAndClockMatchTheManagerOnTheCpuBackend) {
  for (const auto& [window, eviction] :
       {std::pair{1, EvictionPolicy::kLru}, std::pair{3, EvictionPolicy::kLru},
        std::pair{1, EvictionPolicy::kSegmentedLru}, std::pair{3, EvictionPolicy::kSegmentedLru},
        std::pair{1, EvictionPolicy::kClock}, std::pair{3, EvictionPolicy::kClock}}) {
    CacheOptions o;
    o.eviction = eviction;
    o.protected_percent = 70;
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
    const PolicyKind kind = eviction == EvictionPolicy::kLru     ? PolicyKind::kLru
                            : eviction == EvictionPolicy::kClock ? PolicyKind::kClock
                                                                 : PolicyKind::kSlru;
    for (int32_t l = 0; l < 2; ++l) {
      sims.push_back(
          MakePolicy({.kind = kind, .slots = 24, .window = window, .protected_percent = 70}));
    }
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
          ASSERT_EQ(got, expected[k])
              << PolicyName(kind) << " window " << window << " step " << s << " layer " << l
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

// `sparsekv replay` prints what its ProgressBar is told (cli_test's ProgressBarTest): the replay
// and the cross-layer prefetch report every unit of work, in order, up to their totals.
TEST(ReplayTest, ReportsProgressUpToItsTotal) {
  TopKGeneratorOptions g;
  g.top_k = 16;
  const Trace t = SyntheticTrace(g, 3, 24, 256);
  struct Seen {
    std::vector<std::string> phases;
    int64_t calls = 0, last = -1, total = 0;
    bool ordered = true;
  };
  const auto recorder = [](Seen& seen) {
    return [&seen](std::string_view phase, int64_t done, int64_t total) {
      if (seen.phases.empty() || seen.phases.back() != phase) seen.phases.emplace_back(phase);
      seen.ordered = seen.ordered && done >= seen.last && done <= total;
      seen.last = done;
      seen.total = total;
      ++seen.calls;
    };
  };
  ReplayOptions o;
  o.hot_slots = {32, 64};
  o.policies = {PolicyKind::kLru, PolicyKind::kClock};
  o.warmup_steps = 4;
  Seen replay;
  ASSERT_TRUE(Replay(t, o, recorder(replay)).ok());
  EXPECT_FALSE(replay.phases.empty());
  EXPECT_GT(replay.calls, 1);
  EXPECT_TRUE(replay.ordered);
  EXPECT_GT(replay.total, 0);
  EXPECT_EQ(replay.last, replay.total);

  CrossLayerOptions c;
  c.hot_slots = {32};
  c.policies = {PolicyKind::kClock};
  c.warmup_steps = 4;
  Seen crosslayer;
  ASSERT_TRUE(ReplayCrossLayerPrefetch(t, c, recorder(crosslayer)).ok());
  EXPECT_EQ(crosslayer.phases, std::vector<std::string>{"cross-layer prefetch"});
  EXPECT_EQ(crosslayer.total, 3);  // a unit per layer
  EXPECT_EQ(crosslayer.last, crosslayer.total);
  EXPECT_GE(crosslayer.calls, 3);
  EXPECT_TRUE(crosslayer.ordered);
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
  EXPECT_EQ(j["trace"]["results"].size(), 6u);  // lru, clock, lfu-decay, slru, aging, window8
}

// One layer, top-k 2, hot slots 2, seq_len growing by one from 10. Step t selects {3 + t, the
// newest token of step t - 1}: every step but the first misses both without prefetch (3 + t is
// new and the previous newest token left the window). window-exit proposes that token, which
// step t + 1 selects: one useful fetch per step, and the other entry still misses.
Trace WindowExitTrace(int32_t steps) {
  Trace t;
  t.Resize(1, 2, steps);
  for (int32_t s = 0; s < steps; ++s) {
    t.seq_len[s] = 10 + s;
    t.positions[2 * s] = 3 + s;
    t.positions[2 * s + 1] = s == 0 ? 0 : 10 + s - 2;
  }
  return t;
}

TEST(PrefetchReplayTest, WindowExitTurnsTheLeavingTokenIntoAHit) {
  PrefetchOptions o;
  o.hot_slots = {2};
  o.predictors = {PredictorKind::kWindowExit};
  o.budgets = {1};
  o.warmup_steps = 1;
  o.row_bytes = 100;
  const Trace t = WindowExitTrace(9);
  StatusOr<std::vector<PrefetchResult>> r = ReplayPrefetch(t, o);
  ASSERT_TRUE(r.ok()) << r.status().message();
  ASSERT_EQ(r->size(), 1u);
  const PrefetchResult& p = (*r)[0];
  EXPECT_EQ(p.lookups, 16u);          // steps 1..8, two entries each
  EXPECT_EQ(p.baseline_misses, 16u);  // both entries miss at every counted step
  EXPECT_EQ(p.misses, 8u);            // only the new position misses
  EXPECT_EQ(p.fetched, 8u);           // after steps 0..7, counted from step 1 on
  EXPECT_EQ(p.useful, 8u);
  EXPECT_DOUBLE_EQ(p.precision, 1.0);
  EXPECT_DOUBLE_EQ(p.recall, 0.5);
  EXPECT_DOUBLE_EQ(p.baseline_miss_rate, 1.0);
  EXPECT_DOUBLE_EQ(p.net_miss_rate, 0.5);
  EXPECT_DOUBLE_EQ(p.extra_bytes, 800);
  EXPECT_DOUBLE_EQ(p.net_bytes, 1600);
}

// A useless prefetch evicts: with one slot per position of the row, the neighbours of the first
// step's misses (window-exit's 999 stays in the window: seq_len does not grow) push out the rows
// that every later step reuses, whose misses then make new wrong guesses.
TEST(PrefetchReplayTest, WrongGuessesEvictUsefulRows) {
  Trace t;
  t.Resize(1, 2, 6);
  for (int32_t s = 0; s < 6; ++s) {
    t.seq_len[s] = 1000;  // fixed: the window never moves, window-exit proposes 999 (useless)
    t.positions[2 * s] = 100;
    t.positions[2 * s + 1] = 500;
  }
  PrefetchOptions o;
  o.hot_slots = {2};
  o.predictors = {PredictorKind::kNeighbours};
  o.budgets = {2};
  o.warmup_steps = 1;
  StatusOr<std::vector<PrefetchResult>> r = ReplayPrefetch(t, o);
  ASSERT_TRUE(r.ok()) << r.status().message();
  const PrefetchResult& p = (*r)[0];
  EXPECT_EQ(p.baseline_misses, 0u);  // both rows stay resident without prefetch
  EXPECT_GT(p.fetched, 0u);
  EXPECT_EQ(p.useful, 0u);
  EXPECT_DOUBLE_EQ(p.precision, 0.0);
  EXPECT_GT(p.misses, 0u);
  EXPECT_GT(p.net_miss_rate, p.baseline_miss_rate);
}

TEST(PrefetchReplayTest, EveryPredictorRunsAndStaysWithinItsBudget) {
  TopKGeneratorOptions g;
  g.top_k = 64;
  const Trace t = SyntheticTrace(g, 2, 40, 2048);
  PrefetchOptions o;
  o.hot_slots = {64, 128};
  o.predictors = {PredictorKind::kWindowExit, PredictorKind::kNeighbours, PredictorKind::kEvicted,
                  PredictorKind::kDropped, PredictorKind::kCombined};
  o.budgets = {1, 8};
  StatusOr<std::vector<PrefetchResult>> r = ReplayPrefetch(t, o);
  ASSERT_TRUE(r.ok()) << r.status().message();
  ASSERT_EQ(r->size(), 2u * 5 * 2);
  const uint64_t transitions = static_cast<uint64_t>(t.layers) * (t.steps - o.warmup_steps);
  for (const PrefetchResult& p : *r) {
    SCOPED_TRACE(p.predictor + " budget " + std::to_string(p.budget));
    EXPECT_LE(p.fetched, transitions * p.budget);
    EXPECT_LE(p.useful, p.fetched);
    EXPECT_GE(p.precision, 0.0);
    EXPECT_LE(p.recall, 1.0);
    EXPECT_EQ(p.baseline_misses, (*r)[p.hot_slots == 64 ? 0 : 10].baseline_misses);
  }
  const PrefetchResult* best = BestPrefetch(*r, 128);
  ASSERT_NE(best, nullptr);
  EXPECT_EQ(best->hot_slots, 128);
  for (const PrefetchResult& p : *r) {
    if (p.hot_slots == 128) {
      EXPECT_LE(best->net_miss_rate, p.net_miss_rate);
    }
  }
}

TEST(PrefetchReplayTest, RejectsBadOptions) {
  const Trace t = WindowExitTrace(4);
  PrefetchOptions o;
  o.hot_slots = {2};
  o.predictors = {PredictorKind::kNeighbours};
  o.budgets = {3};  // above the hot slots
  o.warmup_steps = 0;
  EXPECT_EQ(ReplayPrefetch(t, o).status().code(), StatusCode::kInvalidArgument);
  o.budgets = {};
  EXPECT_EQ(ReplayPrefetch(t, o).status().code(), StatusCode::kInvalidArgument);
  o.budgets = {1};
  o.hot_slots = {1};
  EXPECT_EQ(ReplayPrefetch(t, o).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ParsePredictor("oracle").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(*ParsePredictor("dropped"), PredictorKind::kDropped);
}

TEST(ReplayCommandTest, ReplaysPrefetchOnTheMissRateGenerator) {
  const std::string path = ::testing::TempDir() + "/prefetch.json";
  std::ostringstream out, err;
  std::vector<std::string> args = {"replay", "--layers", "2", "--steps", "30", "--context", "1024"};
  args.insert(args.end(), {"--top-k", "64", "--miss-rate", "0.25", "--hot-slots", "128"});
  args.insert(args.end(), {"--policies", "lru", "--prefetch", "window-exit,neighbours"});
  args.insert(args.end(), {"--prefetch-budget", "1,8", "--json", path});
  ASSERT_EQ(Cli(args, out, err), kExitOk) << err.str();
  EXPECT_NE(out.str().find("best prefetch at 128 slots"), std::string::npos) << out.str();
  std::ifstream file(path);
  const nlohmann::json j = nlohmann::json::parse(file);
  EXPECT_EQ(j["prefetch"].size(), 4u);
  EXPECT_TRUE(j["summary"].contains("prefetch_precision"));
  EXPECT_TRUE(j["summary"].contains("prefetch_recall"));
  EXPECT_NE(j["metadata"].get<std::string>().find("\"miss_rate\":0.25"), std::string::npos);
  // The generator's own miss rate without prefetch: a quarter of the row, but the newest token.
  EXPECT_NEAR(j["prefetch"][0]["baseline_miss_rate"].get<double>(), 0.25, 0.03);
  EXPECT_EQ(Cli({"replay", "--top-k", "64", "--context", "1024", "--hot-slots", "128", "--prefetch",
                 "neighbours", "--prefetch-budget", "200"},
                out, err),
            kExitUsage);
}

// One layer, three steps of top-k 4 at seq_len 10: step 1 holds two out-of-range positions (10
// and -5) and step 2 two repeats (7 three times), beside padding.
Trace MalformedTrace() {
  Trace t;
  t.Resize(/*layers=*/1, /*top_k=*/4, /*steps=*/3);
  const std::vector<std::vector<int32_t>> rows = {{0, 1, 2, -1}, {3, 10, -5, 4}, {7, 7, 7, 8}};
  for (int32_t s = 0; s < 3; ++s) {
    t.seq_len[s] = 10;
    std::copy(rows[s].begin(), rows[s].end(), t.positions.begin() + 4 * s);
  }
  return t;
}

TEST(ReplayTest, CountsOutOfRangeAndRepeatedEntries) {
  const TraceEntryCounts c = CountTraceEntries(MalformedTrace());
  EXPECT_EQ(c.entries, 12u);
  EXPECT_EQ(c.padding, 1u);
  EXPECT_EQ(c.out_of_range, 2u);
  EXPECT_EQ(c.duplicates, 2u);
}

TEST(ReplayCommandTest, ReportsMalformedTraceEntries) {
  const std::string trace_path = ::testing::TempDir() + "/malformed.skvt";
  const std::string json_path = ::testing::TempDir() + "/malformed.json";
  ASSERT_TRUE(WriteTrace(trace_path, MalformedTrace()).ok());
  std::ostringstream out, err;
  ASSERT_EQ(Cli({"replay", "--trace", trace_path, "--warmup", "0", "--json", json_path}, out, err),
            kExitOk)
      << err.str();
  EXPECT_NE(out.str().find("entries: 12, padding 1, out of [0, seq_len) 2, repeated in a row 2 "
                           "(malformed entries: every policy skips them)"),
            std::string::npos)
      << out.str();
  std::ifstream file(json_path);
  const nlohmann::json j = nlohmann::json::parse(file);
  EXPECT_EQ(j["trace_entries"]["out_of_range"], 2);
  EXPECT_EQ(j["trace_entries"]["duplicates"], 2);
  EXPECT_EQ(j["trace_entries"]["padding"], 1);
}

TEST(ReplayCommandTest, RejectsBadArguments) {
  std::ostringstream out, err;
  EXPECT_EQ(Cli({"replay", "--top-k", "64", "--context", "2048", "--hot-slots", "32"}, out, err),
            kExitUsage);
  EXPECT_EQ(Cli({"replay", "--policies", "fifo"}, out, err), kExitUsage);
  EXPECT_EQ(Cli({"replay", "--protected-percent", "101"}, out, err), kExitUsage);
  EXPECT_EQ(Cli({"replay", "--aging-shift", "0"}, out, err), kExitUsage);
  EXPECT_EQ(Cli({"replay", "--top-k", "4096", "--context", "2048"}, out, err), kExitUsage);
}

// Flags the run would not read are refused before it starts, naming them.
TEST(ReplayCommandTest, RefusesFlagsThatDoNotApplyNamingThem) {
  const std::string trace = ::testing::TempDir() + "replay_flags.skvt";
  std::ostringstream out, err;
  ASSERT_EQ(Cli({"replay", "--layers", "2", "--steps", "24", "--context", "256", "--top-k", "16",
                 "--policies", "lru", "--write-trace", trace},
                out, err),
            kExitOk)
      << err.str();
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--trace", trace, "--layers", "4"}, "--layers: the synthetic generator's"},
      {{"--trace", trace, "--steps", "4", "--miss-rate", "0.1"}, "--steps, --miss-rate"},
      {{"--trace", trace, "--seed", "3"}, "--seed"},
      {{"--fit-locality", "--fit-target", "4096:abc"},
       "--fit-target: want SLOTS:MISS_RATE, SLOTS a whole number >= 1 and MISS_RATE in [0, 1] "
       "(got '4096:abc')"},
      {{"--fit-locality", "--fit-target", "4096:0.3x"}, "(got '4096:0.3x')"},
      {{"--fit-target", "4096:0.3"}, "--fit-target: the fit's, which is off"},
      {{"--fresh-range", "100"}, "--fresh-range applies in miss-rate mode only"},
      {{"--miss-rate", "0.2", "--synthetic-locality", "calibrated"},
       "--miss-rate selects miss-rate mode, --synthetic-locality calibrated locality mode"},
      {{"--zipf-exponent", "1"}, "--zipf-exponent: locality mode's, which is off"},
      {{"--decay", "0.5", "--policies", "lru"}, "--decay is lfu-decay's"},
      {{"--prefetch-budget", "4"}, "--prefetch-budget: the prefetch replay's, which is off"},
      {{"--crosslayer-prefetch", "--policies", "lfu-decay,aging"},
       "--crosslayer-prefetch replays the manager's policies (lru, slru, clock) only: add one of "
       "them to --policies (got lfu-decay,aging)"},
  };
  for (const auto& [flags, expected] : cases) {
    std::vector<std::string> args = {"replay"};
    args.insert(args.end(), flags.begin(), flags.end());
    std::ostringstream o, e;
    const auto start = std::chrono::steady_clock::now();
    EXPECT_EQ(Cli(args, o, e), kExitUsage) << expected << "\n" << e.str();
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(1)) << expected;
    EXPECT_NE(e.str().find(expected), std::string::npos) << expected << "\n" << e.str();
    EXPECT_TRUE(o.str().empty()) << o.str();
  }
  // What the fit reads on a trace is accepted with --fit-locality.
  std::ostringstream o, e;
  EXPECT_EQ(Cli({"replay", "--trace", trace, "--policies", "lru", "--fit-locality", "--sinks", "2",
                 "--fit-target", "32:0.5"},
                o, e),
            kExitOk)
      << e.str();
}

// Without lru, nothing of lru is replayed or reported as the best.
TEST(ReplayCommandTest, PoliciesWithoutLruReplayNoLru) {
  const std::string json_path = ::testing::TempDir() + "replay_clock.json";
  std::ostringstream out, err;
  ASSERT_EQ(Cli({"replay", "--layers", "2", "--steps", "24", "--context", "512", "--top-k", "32",
                 "--policies", "clock", "--json", json_path},
                out, err),
            kExitOk)
      << err.str();
  for (const char* lru : {"-lru", "lru miss rate", "vs lru\n"}) {
    EXPECT_EQ(out.str().find(lru), std::string::npos) << lru << "\n" << out.str();
  }
  EXPECT_NE(out.str().find("best policy at 64 slots: clock, hit rate "), std::string::npos)
      << out.str();
  std::ifstream file(json_path);
  const nlohmann::json j = nlohmann::json::parse(file);
  EXPECT_EQ(j["summary"]["replay_best_policy"], "clock");
  EXPECT_TRUE(j["summary"]["replay_best_policy_hit_rate_gain"].is_null());
  for (const auto& r : j["trace"]["results"]) EXPECT_EQ(r["policy"], "clock");
}

// The cross-layer prefetch replays the policies asked for, and only those: clock alone.
TEST(ReplayCommandTest, CrossLayerPrefetchWithClockReplaysOnlyClock) {
  const std::string json_path = ::testing::TempDir() + "replay_crosslayer_clock.json";
  std::ostringstream out, err;
  ASSERT_EQ(Cli({"replay", "--layers", "3", "--steps", "24", "--context", "512", "--top-k", "32",
                 "--hot-slots", "64", "--warmup", "4", "--policies", "clock",
                 "--crosslayer-prefetch", "--json", json_path},
                out, err),
            kExitOk)
      << err.str();
  std::ifstream file(json_path);
  const nlohmann::json j = nlohmann::json::parse(file);
  ASSERT_FALSE(j["crosslayer_prefetch"].empty()) << j.dump();
  for (const auto& r : j["crosslayer_prefetch"]) EXPECT_EQ(r["policy"], "clock") << r.dump();
  for (const auto& r : j["trace"]["results"]) EXPECT_EQ(r["policy"], "clock") << r.dump();
  EXPECT_EQ(j["summary"]["crosslayer_prefetch_policy"], "clock");
  for (const char* row : {"64 lru", "64 slru"}) {
    EXPECT_EQ(out.str().find(row), std::string::npos) << row << "\n" << out.str();
  }
  EXPECT_NE(out.str().find("cross-layer prefetch at 64 slots (clock)"), std::string::npos)
      << out.str();
}

// The published preset at its calibration shape (32K context, top-2048, one layer, 64 steps):
// within 2 points of GLM-5.1's published LRU misses at 4096 and 8192 slots, ~30% at 2048.
TEST(LocalityCalibrationTest, PublishedPresetMatchesThePublishedCurve) {
  TopKGeneratorOptions g = *LocalityPreset("glm5-published");
  g.top_k = 2048;
  const Trace t = SyntheticTrace(g, 1, 64, 32768);
  const std::vector<MissCurvePoint> curve = LruMissCurve(t, {2048, 4096, 8192}, 24);
  EXPECT_NEAR(curve[0].miss_rate, 0.30, 0.03);
  EXPECT_NEAR(curve[1].miss_rate, 0.134, 0.02);
  EXPECT_NEAR(curve[2].miss_rate, 0.067, 0.02);
}

// With the calibrated cross-layer overlap, a layer that takes its shared positions from the one
// below keeps the curve.
TEST(LocalityCalibrationTest, CrossLayerOverlapKeepsThePublishedCurve) {
  TopKGeneratorOptions g = *LocalityPreset("glm5-published");
  g.top_k = 2048;
  const Trace t = SyntheticTrace(g, 2, 48, 32768);
  EXPECT_NEAR(MeasureLayerOverlap(t).mean, g.cross_layer_overlap, 0.05);
  const std::vector<MissCurvePoint> curve = LruMissCurve(t, {4096, 8192}, 24);
  EXPECT_NEAR(curve[0].miss_rate, 0.134, 0.025);
  EXPECT_NEAR(curve[1].miss_rate, 0.067, 0.025);
}

TEST(LocalityCalibrationTest, MeasuresAdjacentLayerOverlap) {
  Trace t;
  t.Resize(3, 4, 2);
  // Step 0: layers share {1, 2} / {2, 3, 4}; step 1: all / nothing (padding never matches).
  t.positions = {0, 1, 2, 3, /**/ 1, 2, 8, 9, /**/ 2,  3,  4,  5,
                 0, 1, 2, 3, /**/ 0, 1, 2, 3, /**/ -1, -1, -1, -1};
  t.seq_len.assign(6, 16);
  const LayerOverlap o = MeasureLayerOverlap(t);
  ASSERT_EQ(o.pair.size(), 2u);
  EXPECT_DOUBLE_EQ(o.pair[0], (0.5 + 1.0) / 2);
  EXPECT_DOUBLE_EQ(o.pair[1], (0.25 + 0.0) / 2);
  EXPECT_DOUBLE_EQ(o.mean, (0.75 + 0.125) / 2);
}

// The fit recovers a curve the generator itself produced, at a small shape.
TEST(LocalityCalibrationTest, FitReproducesAKnownCurve) {
  TopKGeneratorOptions g = *LocalityPreset("smollm2");
  g.top_k = 64;
  g.cross_layer_overlap = 0;
  LocalityFitOptions fit;
  fit.context = 2048;
  fit.steps = 48;
  fit.warmup_steps = 16;
  const Trace t = SyntheticTrace(g, 1, fit.steps, fit.context);
  const std::vector<MissCurvePoint> target = LruMissCurve(t, {64, 128, 256}, fit.warmup_steps);
  const LocalityFit f = FitLocality(target, g, fit);
  for (size_t i = 0; i < target.size(); ++i) {
    EXPECT_NEAR(f.curve[i].miss_rate, target[i].miss_rate, 0.02) << target[i].hot_slots;
  }
  EXPECT_LT(f.squared_error, 1e-3);
}

TEST(ReplayCommandTest, ReplaysTheCalibratedGeneratorAndReportsOverlap) {
  const std::string dir = ::testing::TempDir();
  std::ostringstream out, err;
  ASSERT_EQ(Cli({"replay",
                 "--synthetic-locality",
                 "calibrated",
                 "--layers",
                 "2",
                 "--steps",
                 "40",
                 "--context",
                 "4096",
                 "--top-k",
                 "128",
                 "--hot-slots",
                 "128,256,512",
                 "--policies",
                 "lru",
                 "--layer-overlap",
                 "--cross-layer-overlap",
                 "0.7",
                 "--json",
                 dir + "/loc.json"},
                out, err),
            kExitOk)
      << err.str();
  EXPECT_NE(out.str().find("lru miss rate vs hot slots: 128:"), std::string::npos) << out.str();
  EXPECT_NE(out.str().find("adjacent-layer top-k overlap"), std::string::npos) << out.str();
  std::ifstream file(dir + "/loc.json");
  const nlohmann::json j = nlohmann::json::parse(file);
  EXPECT_TRUE(j["summary"].contains("calibrated_miss_rate_256"));
  EXPECT_NEAR(j["layer_overlap"]["mean"].get<double>(), 0.7, 0.06);
  EXPECT_EQ(j["lru_miss_curve"].size(), 3u);
  std::ostringstream bad_out, bad_err;
  EXPECT_EQ(Cli({"replay", "--steps", "20", "--context", "1024", "--top-k", "64", "--policies",
                 "lru", "--fit-locality", "--fit-target", "32:0.3"},
                bad_out, bad_err),
            kExitUsage);
}

}  // namespace
}  // namespace sparsekv::tools
