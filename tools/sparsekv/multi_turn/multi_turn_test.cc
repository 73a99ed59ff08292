#include "tools/sparsekv/multi_turn/multi_turn.h"

#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tools/sparsekv/cli.h"

namespace sparsekv::tools {
namespace {

MultiTurnConfig Small() {
  MultiTurnConfig c;
  c.conversations = 6;
  c.turns = 3;
  c.system_tokens = 300;
  c.user_tokens = 40;
  c.reply_tokens = 30;
  c.think_steps = 20;
  c.branch_probability = 0.5;
  c.branch_tokens = 20;
  c.page_tokens = 16;
  return c;
}

TEST(MultiTurnTest, SharingHoldsTheSameConversationsInLessPool) {
  StatusOr<MultiTurnReport> r = RunMultiTurn(Small());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const MultiTurnModeResult& s = r->sharing;
  const MultiTurnModeResult& p = r->private_history;
  EXPECT_EQ(s.steps, p.steps) << "both modes replay the same schedule";
  EXPECT_LT(s.peak_pages, p.peak_pages);
  EXPECT_LT(s.ingested_tokens, p.ingested_tokens);
  EXPECT_GT(s.prefix_hit_tokens, 0u);
  EXPECT_EQ(p.prefix_hit_tokens, 0u);
  EXPECT_GT(s.conversations_per_host_gb, p.conversations_per_host_gb);
  EXPECT_EQ(r->page_bytes, 16 * 61 * 656);
}

// Replies of one token and no thinking start a turn every step, while the branches of earlier
// turns still decode: the manager is sized from the schedule, not at one forking turn per
// conversation.
TEST(MultiTurnTest, OverlappingBranchesFitTheManager) {
  std::ostringstream out, err;
  const std::vector<std::string> args = {"multi-turn", "--system-tokens", "0", "--user-tokens",
                                         "1",          "--reply-tokens",  "1", "--think-steps",
                                         "0"};
  ASSERT_EQ(RunCli(args, out, err, false), kExitOk) << err.str();
  EXPECT_NE(out.str().find("private"), std::string::npos) << out.str();
}

TEST(MultiTurnTest, CommandWritesTheSummaryKeys) {
  const std::string path = ::testing::TempDir() + "multi_turn.json";
  const std::vector<std::string> args = {"multi-turn", "--conversations", "4",   "--turns",
                                         "2",          "--system-tokens", "100", "--json",
                                         path};
  std::ostringstream out, err;
  ASSERT_EQ(RunCli(args, out, err, false), kExitOk) << err.str();
  EXPECT_NE(out.str().find("sharing"), std::string::npos);
  std::ifstream file(path);
  const nlohmann::json j = nlohmann::json::parse(file);
  EXPECT_GT(j["summary"]["conversations_per_host_gb_multi_turn"].get<double>(),
            j["summary"]["conversations_per_host_gb_private"].get<double>());
  EXPECT_EQ(j["config"]["conversations"], 4);
}

// DeepSeek-V4's presets run with every layer kind: the pool's rows are the CSA layers' entries of
// 4 tokens, and the resident entries and raw windows are the store's, on the device while a
// request decodes and as a host copy between turns.
TEST(MultiTurnTest, DeepSeekV4PresetsRunEveryLayerKind) {
  for (const std::string name : {"deepseek-v4-flash", "deepseek-v4-pro"}) {
    SCOPED_TRACE(name);
    MultiTurnConfig c = Small();
    c.preset = name;
    c.row_format = KVRowFormat::kFp8Entry584;
    c.branch_probability = 0;  // every prompt token is ingested or found, in both modes
    StatusOr<MultiTurnReport> r = RunMultiTurn(c);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    const StatusOr<ModelPreset> preset = FindPreset(name);
    ASSERT_TRUE(preset.ok());
    EXPECT_TRUE(r->layer_kinds);
    EXPECT_EQ(r->entry_tokens, 4);
    EXPECT_EQ(r->token_bytes, int64_t{preset->layers_of(LayerKind::kOffloaded)} * 584);
    EXPECT_EQ(r->page_bytes, r->token_bytes * c.page_tokens);
    EXPECT_EQ(r->dense_row_bytes, 584);
    const MultiTurnModeResult& s = r->sharing;
    const MultiTurnModeResult& p = r->private_history;
    EXPECT_EQ(s.steps, p.steps);
    // The manager's prefix hits (CacheStats) are the tokens the sharing replay did not ingest.
    EXPECT_GT(s.prefix_hit_tokens, 0u);
    EXPECT_EQ(p.prefix_hit_tokens, 0u);
    EXPECT_EQ(s.ingested_tokens + static_cast<int64_t>(s.prefix_hit_tokens), p.ingested_tokens);
    // A hit is whole pages of page_tokens entries of 4 tokens.
    EXPECT_EQ(s.prefix_hit_tokens % (4 * c.page_tokens), 0u);
    EXPECT_LT(s.peak_pages, p.peak_pages);
    // A request's store rows: a raw window of 128 rows in every layer, and the resident layers'
    // pages of resident_page_rows entries of 128 tokens for its reservation (at least one each,
    // at most those of the longest history).
    const int64_t layers = preset->num_layers;
    const int64_t resident = preset->layers_of(LayerKind::kResident);
    const int64_t page_rows = CacheOptions{}.resident_page_rows;
    const int64_t longest = c.system_tokens + c.turns * (c.user_tokens * 3 / 2 + 1) +
                            c.turns * (c.reply_tokens * 3 / 2 + 1);
    const int64_t least = layers * 128 + resident * page_rows;
    const int64_t most =
        layers * 128 + resident * ((longest / 128 + page_rows) / page_rows) * page_rows;
    for (const MultiTurnModeResult* m : {&s, &p}) {
      EXPECT_GE(m->peak_dense_device_rows, least);
      EXPECT_LE(m->peak_dense_device_rows, c.conversations * most);
      // Between turns a conversation holds a copy (retained or retracted) of its store rows.
      EXPECT_GE(m->peak_dense_host_rows, least);
      EXPECT_LE(m->peak_dense_host_rows, c.conversations * most);
      EXPECT_DOUBLE_EQ(m->peak_dense_host_gb, m->peak_dense_host_rows * 584 / 1e9);
      EXPECT_DOUBLE_EQ(m->peak_dense_device_gb, m->peak_dense_device_rows * 584 / 1e9);
      // The host peak counts the pool and the copies, sampled together.
      EXPECT_GE(m->peak_host_gb * 1e9, static_cast<double>(m->peak_pages) * r->page_bytes - 1);
      EXPECT_LE(m->peak_host_gb * 1e9, static_cast<double>(m->peak_pages) * r->page_bytes +
                                           static_cast<double>(m->peak_dense_host_rows) * 584 + 1);
      EXPECT_DOUBLE_EQ(m->conversations_per_host_gb, c.conversations / m->peak_host_gb);
    }
  }
}

// Without layer kinds there is no store: its figures are zero and the host is the pool.
TEST(MultiTurnTest, UniformPresetsHaveNoStoreFigures) {
  StatusOr<MultiTurnReport> r = RunMultiTurn(Small());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_FALSE(r->layer_kinds);
  EXPECT_EQ(r->entry_tokens, 1);
  for (const MultiTurnModeResult* m : {&r->sharing, &r->private_history}) {
    EXPECT_EQ(m->peak_dense_device_rows, 0);
    EXPECT_EQ(m->peak_dense_host_rows, 0);
    EXPECT_DOUBLE_EQ(m->peak_host_gb, m->peak_pages * r->page_bytes / 1e9);
  }
}

TEST(MultiTurnTest, InvalidConfigurationIsAnError) {
  MultiTurnConfig c = Small();
  c.branch_probability = 2;
  EXPECT_EQ(RunMultiTurn(c).status().code(), StatusCode::kInvalidArgument);
}

struct CliRun {
  int code;
  std::string out, err;
};
CliRun Cli(const std::vector<std::string>& args) {
  std::ostringstream out, err;
  const int code = RunCli(args, out, err, false);
  return {code, out.str(), err.str()};
}

TEST(MultiTurnTest, EveryOptionIsCheckedBeforeTheRunNamingIt) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--turns", "0"}, "--turns"},
      {{"--conversations", "0"}, "--conversations"},
      {{"--system-tokens", "2000000000"}, "--system-tokens"},
      {{"--user-tokens", "0"}, "--user-tokens"},
      {{"--reply-tokens", "-3"}, "--reply-tokens"},
      {{"--think-steps", "-1"}, "--think-steps"},
      {{"--branches", "65"}, "--branches"},
      {{"--branch-tokens", "0"}, "--branch-tokens"},
      {{"--branch-probability", "-0.1"}, "--branch-probability"},
      {{"--page-tokens", "0"}, "--page-tokens"},
      {{"--seed", "-1"}, "--seed"},
      // Each in range, together too long for one conversation, or too large a pool.
      {{"--system-tokens", "16000000", "--turns", "10000"}, "a conversation may hold"},
      {{"--conversations", "1000000", "--turns", "100"}, "--conversations * (1 + --branches)"},
  };
  for (const auto& [options, expected] : cases) {
    std::vector<std::string> args = {"multi-turn"};
    args.insert(args.end(), options.begin(), options.end());
    const auto start = std::chrono::steady_clock::now();
    const CliRun r = Cli(args);
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(1)) << options[0];
    EXPECT_EQ(r.code, kExitUsage) << options[0] << "\n" << r.err;
    EXPECT_NE(r.err.find(expected), std::string::npos) << expected << "\n" << r.err;
    EXPECT_TRUE(r.out.empty()) << r.out;
  }
}

TEST(MultiTurnTest, ValidateNamesTheOption) {
  MultiTurnConfig c = Small();
  c.turns = 0;
  const Status s = ValidateMultiTurnConfig(c);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("--turns must be in [1, 10000] (got 0)"), std::string::npos)
      << s.message();
  EXPECT_TRUE(ValidateMultiTurnConfig(Small()).ok());
}

TEST(MultiTurnTest, ReportsProgressPerReplay) {
  std::vector<std::string> phases;
  int64_t last_done = 0, total = 0;
  ASSERT_TRUE(RunMultiTurn(Small(), [&](std::string_view phase, int64_t done, int64_t all) {
                if (phases.empty() || phases.back() != phase) phases.emplace_back(phase);
                last_done = done;
                total = all;
              }).ok());
  EXPECT_EQ(phases, (std::vector<std::string>{"sharing", "private"}));
  EXPECT_EQ(total, 6 * 3);
  EXPECT_EQ(last_done, total);
}

}  // namespace
}  // namespace sparsekv::tools
