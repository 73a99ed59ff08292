// Tests of `sparsekv plan`: its tier argument and the command line (the model and its calibration
// are tested beside them, in src/planner/).
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

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
  const std::string dir = std::string(SPARSEKV_SOURCE_DIR) + "/bench/results/2026-11-30-e2e-sweep/";
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
  const std::string e2e = std::string(SPARSEKV_SOURCE_DIR) + "/bench/results/2026-11-30-e2e-sweep/";
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

// DeepSeek-V4-Pro at 1M tokens with a host tier of 250 GB and of 2 TB of DRAM per 8-GPU node:
// 4.59 GB of host memory per request, 31.25 GB per GPU hold 6 requests; 250 GB per GPU hold all
// 19 that the HBM admits.
TEST(PlanCommandTest, DeepSeekV4ProAtOneMillionOnNodeDramTiers) {
  const std::string json_path = ::testing::TempDir() + "/plan-v4-node.json";
  std::string text;
  ASSERT_EQ(Cli({"plan", "--preset", "deepseek-v4-pro", "--contexts", "1048576", "--node-dram-gb",
                 "250,2000", "--json", json_path},
                &text),
            kExitOk)
      << text;
  EXPECT_NE(text.find("node-250GB"), std::string::npos) << text;
  std::ifstream file(json_path);
  const nlohmann::json j = nlohmann::json::parse(file);
  ASSERT_EQ(j["capacity"].size(), 1u);
  const nlohmann::json& c = j["capacity"][0];
  EXPECT_EQ(c["context"], 1048576);
  EXPECT_EQ(c["full_hbm_max_batch"], 4);
  EXPECT_EQ(c["offloaded_max_batch_by_hbm"], 19);
  ASSERT_EQ(c["offloaded_max_batch_by_tier"].size(), 2u);  // only the node tiers
  EXPECT_EQ(c["offloaded_max_batch_by_tier"][0]["tier"], "node-250GB");
  EXPECT_EQ(c["offloaded_max_batch_by_tier"][0]["max_batch"], 6);
  EXPECT_EQ(c["offloaded_max_batch_by_tier"][1]["tier"], "node-2000GB");
  EXPECT_EQ(c["offloaded_max_batch_by_tier"][1]["max_batch"], 19);
}

// `--context` names the same option: one context, here DeepSeek-V4-Pro's 1M.
TEST(PlanCommandTest, ContextIsTheContextsOption) {
  const std::string json_path = ::testing::TempDir() + "/plan-v4-context.json";
  std::string text;
  ASSERT_EQ(
      Cli({"plan", "--preset", "deepseek-v4-pro", "--context", "1048576", "--json", json_path},
          &text),
      kExitOk)
      << text;
  std::ifstream file(json_path);
  const nlohmann::json capacity = nlohmann::json::parse(file)["capacity"];
  ASSERT_EQ(capacity.size(), 1u);
  EXPECT_EQ(capacity[0]["context"], 1048576);
  EXPECT_EQ(capacity[0]["offloaded_max_batch_by_hbm"], 19);
}

TEST(PlanCommandTest, NodeDramTiersAreSharedByTheNodesGpus) {
  const std::string json_path = ::testing::TempDir() + "/plan-v4-gpus.json";
  std::string text;
  ASSERT_EQ(Cli({"plan", "--preset", "deepseek-v4-pro", "--contexts", "1048576", "--node-dram-gb",
                 "250", "--gpus-per-node", "4", "--tier", "cxl:500:50", "--json", json_path},
                &text),
            kExitOk)
      << text;
  std::ifstream file(json_path);
  const nlohmann::json tiers =
      nlohmann::json::parse(file)["capacity"][0]["offloaded_max_batch_by_tier"];
  ASSERT_EQ(tiers.size(), 2u);  // --tier's, then the node's
  EXPECT_EQ(tiers[0]["tier"], "cxl");
  EXPECT_EQ(tiers[1]["max_batch"], 13);  // 62.5 GB per GPU / 4.59 GB
  EXPECT_EQ(Cli({"plan", "--node-dram-gb", "250,250"}, &text), kExitUsage);
  EXPECT_NE(text.find("'node-250GB' is given twice"), std::string::npos) << text;
  EXPECT_EQ(Cli({"plan", "--node-dram-gb", "0"}, &text), kExitUsage);
  EXPECT_EQ(Cli({"plan", "--gpus-per-node", "0"}, &text), kExitUsage);
}

// DeepSeek-V4-Pro from 256K to 1M: TPOT rows per batch for full HBM and for sparsekv on each
// tier, with the ideal beside them and the note that the terms are projected, in the text and in
// the JSON (whose capacity section stays).
TEST(PlanCommandTest, DeepSeekV4ProPrintsTpotRowsToOneMillion) {
  const std::string json_path = ::testing::TempDir() + "/plan-v4-tpot.json";
  std::string text;
  ASSERT_EQ(Cli({"plan", "--preset", "deepseek-v4-pro", "--contexts", "262144,524288,1048576",
                 "--node-dram-gb", "250,2000", "--json", json_path},
                &text),
            kExitOk)
      << text;
  EXPECT_NE(text.find("PROJECTED from DeepSeek-V3.2's measured constants"), std::string::npos)
      << text;
  EXPECT_NE(text.find("TPOT and throughput per batch"), std::string::npos) << text;
  // A full-HBM row and a sparsekv row at 1M: context, tier, miss, batch 1.
  EXPECT_NE(text.find("   1048576 hbm               -     1 "), std::string::npos) << text;
  EXPECT_NE(text.find("   1048576 node-2000GB    0.20     1 "), std::string::npos) << text;

  std::ifstream file(json_path);
  const nlohmann::json j = nlohmann::json::parse(file);
  EXPECT_EQ(j["capacity"].size(), 3u);
  EXPECT_EQ(j["step_model"]["projected"], true);
  // Per context: full HBM, then the two node tiers.
  ASSERT_EQ(j["cases"].size(), 9u);
  for (size_t i = 0; i < j["cases"].size(); ++i) {
    const nlohmann::json& c = j["cases"][i];
    EXPECT_EQ(c["variant"], i % 3 == 0 ? "full-hbm" : "sparsekv");
    ASSERT_FALSE(c["points"].empty()) << i;
    for (const nlohmann::json& p : c["points"]) {
      EXPECT_GT(p["tpot_ms"].get<double>(), 0);
      EXPECT_LE(p["ideal_tpot_ms"].get<double>(), p["tpot_ms"].get<double>());
      EXPECT_GT(p["indexer_ms"].get<double>(), 0);
      EXPECT_TRUE(p["schedule"].is_null());
    }
    EXPECT_GT(c["bytes_per_request"]["resident_attention"].get<double>(), 0);
  }
  // At 1M: the HBM limits are the capacity section's (4 and 19), the 250-GB node's is 6.
  EXPECT_EQ(j["cases"][6]["max_batch_by_hbm"], 4);
  EXPECT_EQ(j["cases"][7]["max_batch_by_hbm"], 19);
  EXPECT_EQ(j["cases"][7]["max_batch_by_capacity"], 6);
  // More context, more HCA entries read and more keys scanned per request.
  EXPECT_GT(j["cases"][7]["bytes_per_request"]["resident_attention"].get<double>(),
            j["cases"][1]["bytes_per_request"]["resident_attention"].get<double>());
  EXPECT_GT(j["cases"][7]["bytes_per_request"]["indexer"].get<double>(),
            j["cases"][1]["bytes_per_request"]["indexer"].get<double>());
}

// The per-kind step takes --hidden-fraction (1: every TPOT is its ideal) and --calibration (the
// refit's attention rate, not the built-in one).
TEST(PlanCommandTest, DeepSeekV4TakesTheHiddenFractionAndARefit) {
  const std::string json_path = ::testing::TempDir() + "/plan-v4-refit.json";
  const std::string dir = std::string(SPARSEKV_SOURCE_DIR) + "/bench/results/2026-11-30-e2e-sweep/";
  std::string text;
  ASSERT_EQ(
      Cli({"plan", "--preset", "deepseek-v4-flash", "--contexts", "1048576", "--tier",
           "pcie:250:55", "--hidden-fraction", "1", "--calibration", dir + "e2e-deepseek-v3.2.json",
           "--calibration", dir + "e2e-glm-5.json", "--json", json_path},
          &text),
      kExitOk)
      << text;
  std::ifstream file(json_path);
  const nlohmann::json j = nlohmann::json::parse(file);
  EXPECT_NE(j["step_model"]["attention_gbps_per_request"].get<double>(),
            Calibration{}.attention_gbps());
  for (const nlohmann::json& c : j["cases"]) {
    for (const nlohmann::json& p : c["points"]) {
      EXPECT_DOUBLE_EQ(p["tpot_ms"].get<double>(), p["ideal_tpot_ms"].get<double>());
    }
  }
}

// GLM-5.3's keys on 21 of its 78 layers and its shared top-k take the per-kind model too; the
// step schedule's options, a manager's for uniform layers, are refused for it.
TEST(PlanCommandTest, Glm53IsPlannedPerLayerKind) {
  std::string text;
  ASSERT_EQ(
      Cli({"plan", "--preset", "glm-5.3", "--contexts", "131072", "--tier", "pcie:250:55"}, &text),
      kExitOk)
      << text;
  EXPECT_NE(text.find("78 offloaded"), std::string::npos) << text;
  EXPECT_NE(text.find("TPOT and throughput per batch"), std::string::npos) << text;
  EXPECT_EQ(Cli({"plan", "--preset", "glm-5.3", "--copy-chunk-rows", "8"}, &text), kExitUsage);
  EXPECT_NE(text.find("--copy-chunk-rows: the step schedule is forecast for uniform layers only"),
            std::string::npos)
      << text;
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

// ---- The step schedule per row (ForecastSchedule, tested on hand-computed cases in
// src/planner/planner_test.cc) ----

// One sparsekv case at 32K on one tier, written as JSON; returns the parsed file.
nlohmann::json PlanJson(std::vector<std::string> extra, const std::string& name) {
  const std::string path = ::testing::TempDir() + "/plan-" + name + ".json";
  std::vector<std::string> args = {"plan",         "--contexts", "32768",  "--tier", "pcie:250:55",
                                   "--miss-rates", "0.2",        "--json", path};
  args.insert(args.end(), extra.begin(), extra.end());
  std::string text;
  EXPECT_EQ(Cli(args, &text), kExitOk) << text;
  std::ifstream file(path);
  return nlohmann::json::parse(file);
}

TEST(PlanScheduleTest, DefaultOptionsLeaveSerialTheOnlyCandidate) {
  std::string text;
  ASSERT_EQ(Cli({"plan", "--contexts", "32768", "--tier", "pcie:250:55"}, &text), kExitOk);
  EXPECT_NE(text.find("schedule"), std::string::npos) << text;
  EXPECT_NE(text.find("serial* "), std::string::npos) << text;
  EXPECT_NE(text.find("serial: the only choice the options allow (max_prefetch < top_k: no "
                      "prefetch; copy_chunk_rows 0: no chunks)"),
            std::string::npos)
      << text;
  const nlohmann::json j = PlanJson({}, "serial");
  EXPECT_TRUE(j["cases"][0]["best"]["schedule"].is_null());  // full-hbm: no schedule
  const nlohmann::json& best = j["cases"][1]["best"];
  ASSERT_EQ(best["schedule"]["candidates"].size(), 1u);
  EXPECT_EQ(best["schedule"]["expected"], "serial");
  // Serial is the step the plan's own columns model (--hidden-fraction 0).
  EXPECT_DOUBLE_EQ(best["schedule"]["expected_ms"].get<double>(), best["tpot_ms"].get<double>());
}

// With chunks of 8 rows and the cross-layer prefetch allowed, every point lists what
// AllowedChoices gives at its batch, and the expected winner is the fastest modelled one. The
// prefetch on 16 blocks is the step the plan models at --hidden-fraction 0.34.
TEST(PlanScheduleTest, CandidatesFollowTheOptionsAndTheFastestIsExpected) {
  const nlohmann::json j = PlanJson({"--copy-chunk-rows", "8", "--crosslayer-prefetch"}, "both");
  const nlohmann::json h = PlanJson({"--hidden-fraction", "0.34"}, "hidden");
  EXPECT_EQ(j["schedule_options"]["copy_chunk_rows"], 8);
  EXPECT_EQ(j["schedule_options"]["max_prefetch"], 2048);
  std::map<int, double> hidden_ms;  // batch -> TPOT at --hidden-fraction 0.34
  for (const nlohmann::json& p : h["cases"][1]["points"]) hidden_ms[p["batch"]] = p["tpot_ms"];
  const nlohmann::json& points = j["cases"][1]["points"];
  int compared = 0;
  for (size_t p = 0; p < points.size(); ++p) {
    const nlohmann::json& s = points[p]["schedule"];
    const int batch = points[p]["batch"];
    double fastest = 1e30;
    std::string fastest_name;
    size_t chunked = 0;
    for (const nlohmann::json& c : s["candidates"]) {
      const std::string name = c["choice"];
      if (name.find("chunks") != std::string::npos && name.find("prefetch") == std::string::npos) {
        ++chunked;
        EXPECT_LT(std::stoi(name.substr(6)), batch) << name;
      }
      if (name == "prefetch:16" && hidden_ms.contains(batch)) {
        EXPECT_NEAR(c["expected_ms"].get<double>(), hidden_ms[batch], 1e-9) << "batch " << batch;
        ++compared;
      }
      if (c["modelled"] && c["expected_ms"].get<double>() < fastest) {
        fastest = c["expected_ms"];
        fastest_name = name;
      }
    }
    // Chunks 8, 16, 32, ... below the batch.
    size_t want = 0;
    for (int rows = 8; rows < batch; rows *= 2) ++want;
    EXPECT_EQ(chunked, want) << "batch " << batch;
    EXPECT_EQ(s["expected"], fastest_name) << "batch " << batch;
    EXPECT_DOUBLE_EQ(s["expected_ms"].get<double>(), fastest);
  }
  EXPECT_GE(compared, 5);  // batches 1, 2, 4, 8, 16 at least
}

TEST(PlanScheduleTest, ConfigFileSetsTheManagerOptions) {
  const std::string config = ::testing::TempDir() + "/plan-config.json";
  std::ofstream(config) << R"({"layers_per_index": 61, "max_prefetch": 2048,
                               "copy_chunk_rows": 16, "hot_slots": 6144, "eviction": "lru"})";
  const nlohmann::json j = PlanJson({"--config", config}, "config");
  EXPECT_EQ(j["config"], config);
  EXPECT_EQ(j["hot_slots"], 6144);
  EXPECT_EQ(j["schedule_options"]["layers_per_index"], 61);
  EXPECT_EQ(j["schedule_options"]["copy_chunk_rows"], 16);
  // One index group: no prefetch, whatever max_prefetch says; the planned copy, not modelled.
  int32_t planned = 0;
  for (const nlohmann::json& c : j["cases"][1]["best"]["schedule"]["candidates"]) {
    EXPECT_EQ(c["choice"].get<std::string>().find("prefetch"), std::string::npos) << c;
    if (c["choice"].get<std::string>().starts_with("planned")) {
      ++planned;
      EXPECT_FALSE(c["modelled"].get<bool>()) << c;
    }
  }
  EXPECT_GT(planned, 0);
}

TEST(PlanScheduleTest, ConfigFileConflictsAndOtherModelsAreRefused) {
  const std::string config = ::testing::TempDir() + "/plan-conflict.json";
  std::ofstream(config) << R"({"copy_chunk_rows": 16})";
  std::string text;
  EXPECT_EQ(Cli({"plan", "--config", config, "--copy-chunk-rows", "8"}, &text), kExitUsage);
  EXPECT_NE(text.find("--config " + config +
                      ": --copy-chunk-rows sets \"copy_chunk_rows\", which the file sets too"),
            std::string::npos)
      << text;
  const std::string other = ::testing::TempDir() + "/plan-other-model.json";
  std::ofstream(other) << R"({"geometry": {"num_layers": 3, "row_bytes": 656}})";
  EXPECT_EQ(Cli({"plan", "--config", other}, &text), kExitUsage);
  EXPECT_NE(text.find("its geometry (3 layers, 1968 B per token) and top_k (2048) are not those "
                      "of --preset deepseek-v3.2 --precision fp8 (61 layers"),
            std::string::npos)
      << text;
}

}  // namespace
}  // namespace sparsekv::tools
