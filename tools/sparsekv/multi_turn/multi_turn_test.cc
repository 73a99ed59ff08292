#include "tools/sparsekv/multi_turn/multi_turn.h"

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

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

TEST(MultiTurnTest, InvalidConfigurationIsAnError) {
  MultiTurnConfig c = Small();
  c.branch_probability = 2;
  EXPECT_EQ(RunMultiTurn(c).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace sparsekv::tools
