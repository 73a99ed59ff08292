// The arithmetic over a traced step (step_trace.h) on hand-built records, and the file that
// `sparsekv bench --trace-step` writes, against the one scripts/step_profile.py's test reads.
#include "tools/sparsekv/bench/step_trace.h"

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tools/sparsekv/bench/e2e_report.h"

namespace sparsekv::tools {
namespace {

TraceRecord Record(const std::string& name, uint64_t start, uint64_t end, int32_t lane,
                   TraceKind kind = TraceKind::kKernel) {
  TraceRecord r;
  r.kind = kind;
  r.name = name;
  r.start_ns = start;
  r.end_ns = end;
  r.lane = lane;
  r.stream_id = lane < 0 ? 99 : 10 + lane;
  r.graph_node_id = lane < 0 ? 0 : 1000 + start;
  if (kind == TraceKind::kKernel) {
    r.grid = {4, 1, 1};
    r.block = {256, 1, 1};
  } else {
    r.bytes = 4096;
  }
  return r;
}

// Main lane: attn [1000, 3000), attn [4000, 5000), proxy [5000, 7000), resolve [9000, 10000).
// Side lanes: copy [2000, 4500) and [7500, 8500) on lane 1, a memcpy [2500, 3500) on lane 2.
// Not labelled: stray [10000, 10500). Without timestamps: lost.
std::vector<TraceRecord> HandBuiltStep() {
  return {Record("attn", 1000, 3000, kMainLane),
          Record("copy", 2000, 4500, 1),
          Record("memcpy DtoH", 2500, 3500, 2, TraceKind::kMemcpy),
          Record("attn", 4000, 5000, kMainLane),
          Record("proxy", 5000, 7000, kMainLane),
          Record("copy", 7500, 8500, 1),
          Record("resolve", 9000, 10000, kMainLane),
          Record("stray", 10000, 10500, kUnknownLane),
          Record("lost", 0, 0, 1)};
}

TEST(StepTraceTest, SummaryOfAHandBuiltStep) {
  const std::vector<TraceRecord> records = HandBuiltStep();
  const StepTraceSummary s = SummarizeStepTrace(records);
  EXPECT_EQ(s.records, 8);
  EXPECT_EQ(s.invalid_records, 1);
  EXPECT_EQ(s.unknown_lane_records, 1);
  EXPECT_DOUBLE_EQ(s.span_us, 9.5);  // 1000 .. 10500
  // Nothing runs in [7000, 7500) and [8500, 9000).
  EXPECT_DOUBLE_EQ(s.idle_us, 1.0);
  EXPECT_DOUBLE_EQ(s.main_busy_us, 6.0);  // [1000, 3000) + [4000, 7000) + [9000, 10000)
  EXPECT_DOUBLE_EQ(s.side_busy_us, 3.5);  // [2000, 4500) + [7500, 8500): overlaps count once
  EXPECT_DOUBLE_EQ(s.hidden_us, 1.5);     // [2000, 3000) + [4000, 4500)
  EXPECT_DOUBLE_EQ(s.exposed_us, 2.0);
  EXPECT_EQ(s.main_gaps, 2);  // [3000, 4000), [7000, 9000); touching records make no gap
  EXPECT_DOUBLE_EQ(s.main_gap_us, 3.0);
  EXPECT_DOUBLE_EQ(s.main_gap_max_us, 2.0);
  EXPECT_DOUBLE_EQ(s.main_gap_side_us, 2.0);  // [3000, 4000) + [7500, 8500)

  ASSERT_EQ(s.names.size(), 6u);
  // By total, largest first; equal totals by name.
  const char* order[] = {"copy", "attn", "proxy", "memcpy DtoH", "resolve", "stray"};
  for (size_t i = 0; i < s.names.size(); ++i) EXPECT_EQ(s.names[i].name, order[i]) << i;
  const TraceNameTotals& copy = s.names[0];
  EXPECT_EQ(copy.count, 2);
  EXPECT_EQ(copy.side_count, 2);
  EXPECT_EQ(copy.main_count, 0);
  EXPECT_DOUBLE_EQ(copy.total_us, 3.5);
  EXPECT_DOUBLE_EQ(copy.side_us, 3.5);
  EXPECT_DOUBLE_EQ(copy.hidden_us, 1.5);
  EXPECT_DOUBLE_EQ(copy.exposed_us, 2.0);
  const TraceNameTotals& attn = s.names[1];
  EXPECT_EQ(attn.count, 2);
  EXPECT_EQ(attn.main_count, 2);
  EXPECT_DOUBLE_EQ(attn.main_us, 3.0);
  EXPECT_DOUBLE_EQ(attn.hidden_us, 0.0);  // hidden and exposed are of side-lane time only
  const TraceNameTotals& memcpy = s.names[3];
  EXPECT_EQ(memcpy.kind, TraceKind::kMemcpy);
  EXPECT_DOUBLE_EQ(memcpy.hidden_us, 0.5);  // [2500, 3000)
  EXPECT_DOUBLE_EQ(memcpy.exposed_us, 0.5);
  EXPECT_DOUBLE_EQ(s.names[5].unknown_us, 0.5);
}

TEST(StepTraceTest, SideRecordsOverlappingEachOtherAndManyMainRecords) {
  // A side record under three main records, with a second side record inside it.
  const std::vector<TraceRecord> records = {
      Record("m", 0 + 100, 200, kMainLane), Record("m", 300, 400, kMainLane),
      Record("m", 500, 600, kMainLane),     Record("side", 150, 550, 1),
      Record("side2", 160, 170, 2),
  };
  const StepTraceSummary s = SummarizeStepTrace(records);
  EXPECT_DOUBLE_EQ(s.side_busy_us, 0.4);
  EXPECT_DOUBLE_EQ(s.hidden_us, 0.05 + 0.1 + 0.05);  // [150, 200) + [300, 400) + [500, 550)
  EXPECT_NEAR(s.exposed_us, 0.2, 1e-12);
  const auto side = std::find_if(s.names.begin(), s.names.end(),
                                 [](const TraceNameTotals& n) { return n.name == "side"; });
  ASSERT_NE(side, s.names.end());
  EXPECT_NEAR(side->hidden_us, 0.2, 1e-12);
  EXPECT_NEAR(side->exposed_us, 0.2, 1e-12);
  EXPECT_EQ(s.main_gaps, 2);
  EXPECT_NEAR(s.main_gap_side_us, 0.2, 1e-12);  // the side record fills both gaps
}

TEST(StepTraceTest, EmptyTraceHasNoFigures) {
  const StepTraceSummary s = SummarizeStepTrace({});
  EXPECT_EQ(s.records, 0);
  EXPECT_DOUBLE_EQ(s.span_us, 0);
  EXPECT_DOUBLE_EQ(s.main_gap_us, 0);
  EXPECT_TRUE(s.names.empty());
  TraceCapture c;
  c.dropped_records = 3;
  EXPECT_EQ(FormatStepTraceLine(c),
            "no activity recorded (0 records without timestamps, 3 dropped)");
}

TEST(StepTraceTest, LogLineSaysWhatIsMissing) {
  TraceCapture c;
  c.records = HandBuiltStep();
  c.dropped_records = 2;
  const std::string line = FormatStepTraceLine(c);
  for (const char* part : {"2 gaps", "8 records", "1 of unknown stream", "1 without timestamps",
                           "2 dropped", "main busy 0.006 ms"}) {
    EXPECT_NE(line.find(part), std::string::npos) << part << "\n" << line;
  }
}

TEST(StepTraceTest, KeysNameVariantContextBatchAndRate) {
  StepTrace t;
  t.variant = "sparsekv";
  t.context = 32768;
  t.batch = 4;
  t.miss_rate_target = 0.2;
  EXPECT_EQ(StepTraceKey(t), "sparsekv/32768/4/0.2");
  t.variant = "full-hbm";
  t.miss_rate_target.reset();
  EXPECT_EQ(StepTraceKey(t), "full-hbm/32768/4/-");
}

// The report of a run that traced one point: the hand-built step.
E2EReport TracedReport() {
  E2EReport report;
  report.command = "sparsekv bench --trace-step trace.json";
  report.device = "test device";
  report.preset = "deepseek-v3.2";
  report.layers = 2;
  StepTrace t;
  t.variant = "sparsekv";
  t.context = 32768;
  t.batch = 4;
  t.miss_rate_target = 0.2;
  t.tpot_ms = 0.012;
  t.capture.window_start_ns = 500;
  t.capture.window_end_ns = 11000;
  t.capture.lanes = 3;
  t.capture.records = HandBuiltStep();
  report.step_traces.push_back(t);
  return report;
}

TEST(StepTraceTest, JsonHoldsRelativeTimesAndTheSummary) {
  const nlohmann::json j = nlohmann::json::parse(FormatStepTraceJson(TracedReport()));
  EXPECT_EQ(j["format"], "sparsekv step trace 1");
  EXPECT_EQ(j["layers"], 2);
  ASSERT_EQ(j["points"].size(), 1u);
  const nlohmann::json& p = j["points"][0];
  EXPECT_EQ(p["key"], "sparsekv/32768/4/0.2");
  EXPECT_EQ(p["origin_ns"], 1000);
  EXPECT_DOUBLE_EQ(p["launch_to_first_us"].get<double>(), 0.5);
  EXPECT_EQ(p["lanes"], 3);
  EXPECT_DOUBLE_EQ(p["summary"]["hidden_us"].get<double>(), 1.5);
  ASSERT_EQ(p["records"].size(), 9u);
  EXPECT_EQ(p["records"][0]["start_ns"], 0);
  EXPECT_EQ(p["records"][0]["end_ns"], 2000);
  EXPECT_EQ(p["records"][0]["grid"], nlohmann::json::array({4, 1, 1}));
  EXPECT_EQ(p["records"][2]["kind"], "memcpy");
  EXPECT_EQ(p["records"][2]["bytes"], 4096);
  EXPECT_TRUE(p["records"][8]["start_ns"].is_null());  // no timestamps
}

// scripts/testdata/step_trace.json is what this report writes; scripts/step_profile_test.py reads
// it, so that the script and the writer agree on the format. If the format changes on purpose,
// rewrite the file with the output of FormatStepTraceJson(TracedReport()).
TEST(StepTraceTest, WritesTheFileTheScriptTestReads) {
  std::ifstream in(std::string(SPARSEKV_SOURCE_DIR) + "/scripts/testdata/step_trace.json");
  ASSERT_TRUE(in.good());
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_EQ(nlohmann::json::parse(FormatStepTraceJson(TracedReport())),
            nlohmann::json::parse(text.str()));
}

}  // namespace
}  // namespace sparsekv::tools
