// Tests of `sparsekv plan`: its tier argument and the command line (the model and its calibration
// are tested beside them, in src/planner/).
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "sparsekv/planner_calibration.h"
#include "tools/sparsekv/cli.h"
#include "tools/sparsekv/plan/plan_command.h"

namespace sparsekv::tools {
namespace {

TEST(PlanTierTest, ParsesAndRejects) {
  StatusOr<MemoryTier> t = ParseTier("cxl:500:50.5");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->name, "cxl");
  EXPECT_EQ(t->capacity_gb, 500);
  EXPECT_EQ(t->gbps, 50.5);
  for (const char* bad : {"cxl", "cxl:500", ":1:2", "cxl:x:50", "cxl:500:0", "cxl:500:50GB"}) {
    EXPECT_FALSE(ParseTier(bad).ok()) << bad;
  }
}

int Cli(std::vector<std::string> args, std::string* out_text = nullptr) {
  std::ostringstream out, err;
  const int code = RunCli(args, out, err, false);
  if (out_text != nullptr) *out_text = out.str() + err.str();
  return code;
}

TEST(PlanCommandTest, PrintsTableAndWritesJson) {
  const std::string json_path = ::testing::TempDir() + "/plan.json";
  std::string text;
  ASSERT_EQ(Cli({"plan", "--contexts", "32768,1048576", "--miss-rates", "0.2", "--json", json_path},
                &text),
            kExitOk)
      << text;
  EXPECT_NE(text.find("nvlink-c2c"), std::string::npos);
  std::ifstream file(json_path);
  const nlohmann::json j = nlohmann::json::parse(file);
  // Per context: the full-HBM baseline and the four default tiers.
  ASSERT_EQ(j["cases"].size(), 10u);
  EXPECT_EQ(j["cases"][0]["variant"], "full-hbm");
  EXPECT_GT(j["cases"][1]["max_batch"].get<int>(), j["cases"][0]["max_batch"].get<int>());
}

TEST(PlanCommandTest, ModelsTheTimeToAReadyPoolOfOneAndTwoTerabytes) {
  const std::string json_path = ::testing::TempDir() + "/plan-ready.json";
  std::string text;
  ASSERT_EQ(
      Cli({"plan", "--contexts", "32768", "--host-ready-gbps", "2", "--json", json_path}, &text),
      kExitOk)
      << text;
  EXPECT_NE(text.find("Host pool start-up at 2.00 GB/s"), std::string::npos) << text;
  EXPECT_NE(text.find("2000 GB: ready in   16.7 min,  30 chunks"), std::string::npos) << text;
  std::ifstream file(json_path);
  const nlohmann::json j = nlohmann::json::parse(file);
  // The four default tiers, then 1 and 2 TB.
  ASSERT_EQ(j["host_pool_ready"].size(), 6u);
  EXPECT_EQ(j["host_pool_ready"][4]["pool_gb"], 1000);
  EXPECT_EQ(j["host_pool_ready"][4]["seconds"], 500);
  EXPECT_EQ(j["host_pool_ready"][5]["single_registration_fails"], true);
  EXPECT_EQ(j["host_pool_ready"][0]["single_registration_fails"], false);  // pcie-dram, 250 GB
  EXPECT_NE(Cli({"plan", "--host-ready-gbps", "0"}), kExitOk);
}

TEST(PlanCommandTest, HiddenFractionRaisesTheLatencyLimitedBatch) {
  const auto best_pcie_batch = [](const std::string& hidden) {
    const std::string json_path = ::testing::TempDir() + "/plan_hidden.json";
    EXPECT_EQ(Cli({"plan", "--contexts", "32768", "--miss-rates", "0.2", "--hidden-fraction",
                   hidden, "--json", json_path}),
              kExitOk);
    std::ifstream file(json_path);
    const nlohmann::json j = nlohmann::json::parse(file);
    EXPECT_EQ(j["hidden_fraction"].get<double>(), std::stod(hidden));
    EXPECT_EQ(j["cases"][1]["tier"], "pcie-dram");
    return j["cases"][1]["best"]["batch"].get<int>();
  };
  // Hiding transfer time shortens every step, so more requests fit under the 50 ms SLO.
  EXPECT_GT(best_pcie_batch("0.7"), best_pcie_batch("0"));
  EXPECT_EQ(Cli({"plan", "--hidden-fraction", "1.5"}), kExitUsage);
}

TEST(PlanCommandTest, CalibrationReportsEveryPoint) {
  const std::string dir = std::string(SPARSEKV_SOURCE_DIR) + "/bench/results/e2e/";
  const std::string json_path = ::testing::TempDir() + "/plan_cal.json";
  ASSERT_EQ(Cli({"plan", "--contexts", "32768", "--calibration", dir + "e2e-glm-5.json",
                 "--calibration", dir + "e2e-deepseek-v3.2.json", "--json", json_path}),
            kExitOk);
  std::ifstream file(json_path);
  const nlohmann::json j = nlohmann::json::parse(file);
  EXPECT_EQ(j["check"]["points"].size(), 252u);
  EXPECT_LT(j["summary"]["plan_max_error_pct"].get<double>(), 15);
}

TEST(PlanCommandTest, RejectsBadArguments) {
  EXPECT_EQ(Cli({"plan", "--tier", "cxl:500"}), kExitUsage);
  EXPECT_EQ(Cli({"plan", "--miss-rates", "1.5"}), kExitUsage);
  EXPECT_EQ(Cli({"plan", "--preset", "llama"}), kExitUsage);
  EXPECT_EQ(Cli({"plan", "--calibration", "/nonexistent.json"}), kExitUsage);
  const std::string path = ::testing::TempDir() + "/empty.json";
  std::ofstream(path) << "{}";
  EXPECT_EQ(Cli({"plan", "--calibration", path}), kExitFailure);
}

std::string ReadDoc(const std::string& name) {
  std::ifstream file(std::string(SPARSEKV_SOURCE_DIR) + "/docs/" + name);
  std::ostringstream text;
  text << file.rdbuf();
  return text.str();
}

TEST(PlanCommandTest, DocsShowTheBuiltInCalibration) {
  const std::string table = CalibrationTable(Calibration{});
  EXPECT_NE(ReadDoc("planning.md").find(table), std::string::npos)
      << "docs/planning.md must show the built-in calibration as:\n"
      << table;
  // The refit to the committed results, which the docs' check is of.
  const std::string e2e = std::string(SPARSEKV_SOURCE_DIR) + "/bench/results/e2e/";
  StatusOr<MeasuredRun> run =
      ReadMeasured({e2e + "e2e-deepseek-v3.2.json", e2e + "e2e-glm-5.json"});
  ASSERT_TRUE(run.ok()) << run.status().ToString();
  StatusOr<Calibration> refit = FitCalibration(*run);
  ASSERT_TRUE(refit.ok()) << refit.status().ToString();
  const std::string refit_table = CalibrationTable(*refit);
  EXPECT_NE(ReadDoc("planning.md").find(refit_table), std::string::npos)
      << "docs/planning.md must show the refit calibration as:\n"
      << refit_table;
  // The same values as plain `sparsekv plan` prints.
  std::string text;
  ASSERT_EQ(Cli({"plan", "--contexts", "32768"}, &text), kExitOk);
  const Calibration c;
  EXPECT_NE(text.find("attention " + std::to_string(c.attention_fixed_us).substr(0, 5)),
            std::string::npos)
      << text;
}

TEST(PlanCommandTest, RefusesAHotCacheSmallerThanTheTopK) {
  std::string text;
  EXPECT_EQ(Cli({"plan", "--hot-slots", "1"}, &text), kExitUsage);
  EXPECT_NE(text.find("--hot-slots (1) must be >= the preset's top-k (2048)"), std::string::npos)
      << text;
  EXPECT_EQ(Cli({"plan", "--contexts", "1024"}, &text), kExitUsage);
  EXPECT_NE(text.find("--contexts: 1024 is below the preset's top-k"), std::string::npos) << text;
}

TEST(PlanCommandTest, SaysSoWhenNoHbmIsLeftForKV) {
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"plan", "--hbm-gb", "1"},
        {"plan", "--weights-gb", "1000"},
        {"plan", "--hbm-gb", "100", "--weights-gb", "92", "--reserved-gb", "8"}}) {
    std::string text;
    EXPECT_EQ(Cli(args, &text), kExitUsage) << args[1];
    EXPECT_NE(text.find("no HBM is left for KV: --hbm-gb"), std::string::npos) << text;
    EXPECT_EQ(text.find("Max batch per GPU"), std::string::npos) << text;  // no table of zeros
  }
}

}  // namespace
}  // namespace sparsekv::tools
