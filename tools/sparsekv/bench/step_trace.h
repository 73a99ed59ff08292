// One decode step's timeline as `sparsekv bench --trace-step` records it (a CUPTI activity trace of
// one replay of the captured step, gpu_trace.h), and the arithmetic over it: the busy time of the
// main stream, how much of the side streams' work ran under the main stream's (hidden) and how
// much did not (exposed), the main stream's gaps, totals per kernel name; and the JSON file of all
// traced points. Pure code: the tests build records by hand (docs/benchmark.md, "Profile a step").
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace sparsekv::tools {

struct E2EReport;

// The stream a record's graph node was captured on ("lane"): the step's launch stream (the main,
// critical stream) is kMainLane, the streams the capture forked work to are 1, 2, ... in the
// order the capture first used them, and kUnknownLane a node the tracer did not see captured.
// A graph runs its branches on streams of its own, so CUPTI's stream of a record does not tell
// them apart; the lane does.
inline constexpr int32_t kMainLane = 0;
inline constexpr int32_t kUnknownLane = -1;

enum class TraceKind : uint8_t { kKernel, kMemcpy, kMemset };

// One activity of a traced step.
struct TraceRecord {
  TraceKind kind = TraceKind::kKernel;
  std::string name;       // kernel: demangled; memcpy: "memcpy HtoD" (DtoH, DtoD, ...); "memset"
  uint64_t start_ns = 0;  // CUPTI timestamps (the clock of cuptiGetTimestamp); 0 = not collected
  uint64_t end_ns = 0;
  int32_t lane = kUnknownLane;
  uint32_t stream_id = 0;         // CUPTI's id of the stream it ran on
  uint64_t graph_node_id = 0;     // CUPTI's id of its node in the launched graph; 0 = not a graph's
  std::array<int32_t, 3> grid{};  // kernels
  std::array<int32_t, 3> block{};  // kernels
  uint64_t bytes = 0;              // memcpy, memset
};

// What one traced replay returned (StepTracer::Stop).
struct TraceCapture {
  uint64_t window_start_ns = 0;  // cuptiGetTimestamp when the trace started (before the launch)
  uint64_t window_end_ns = 0;    // ... and when it stopped (after the synchronisation)
  uint64_t dropped_records = 0;  // records CUPTI had no buffer for (then the timeline has holes)
  int32_t lanes = 0;             // streams the traced graph was captured on, the main one included
  std::vector<TraceRecord> records;  // in start order
};

// One benchmark point's traced step.
struct StepTrace {
  std::string variant;  // VariantName
  int32_t context = 0;
  int32_t batch = 0;
  std::optional<double> miss_rate_target;  // as the point's
  double tpot_ms = 0;                      // the point's median timed step, for comparison
  TraceCapture capture;
};

// Totals of the records of one name. Durations are end - start.
struct TraceNameTotals {
  std::string name;
  TraceKind kind = TraceKind::kKernel;
  int32_t count = 0;       // all lanes
  int32_t main_count = 0;  // on the main lane
  int32_t side_count = 0;  // on side lanes
  double total_us = 0;     // main_us + side_us + unknown_us
  double main_us = 0;
  double side_us = 0;
  double unknown_us = 0;
  // Of side_us: the time these records ran while a main-lane record ran (hidden) and the rest
  // (exposed). hidden_us + exposed_us = side_us.
  double hidden_us = 0;
  double exposed_us = 0;
};

// The figures of one traced step. Unions are time measures: overlapping records count once.
struct StepTraceSummary {
  int32_t records = 0;          // with valid timestamps (the only ones counted below)
  int32_t invalid_records = 0;  // timestamps not collected (0) or end < start: left out
  int32_t unknown_lane_records = 0;
  double span_us = 0;       // first start to last end, all records
  double idle_us = 0;       // of the span, no record running: span - union of all records
  double main_busy_us = 0;  // union of the main lane's records
  double side_busy_us = 0;  // union of the side lanes' records
  double hidden_us = 0;     // side busy while the main lane is busy: |side ∩ main|
  double exposed_us = 0;    // side busy while the main lane is not: side_busy - hidden
  // Gaps: the intervals between consecutive (merged) main-lane records, where the main stream
  // waits (on a side stream, on a dependency, or on nothing but launch latency). main_gap_us =
  // main lane's first start to last end - main_busy.
  int32_t main_gaps = 0;
  double main_gap_us = 0;
  double main_gap_max_us = 0;
  double main_gap_side_us = 0;         // of main_gap_us, time a side-lane record ran
  std::vector<TraceNameTotals> names;  // by total_us, largest first (then by name)
};

StepTraceSummary SummarizeStepTrace(std::span<const TraceRecord> records);

// "span 5.310 ms, main busy 4.900 ms, 123 gaps 0.410 ms, side 1.200 ms (hidden 0.900, exposed
// 0.300), 1830 records": the log line of one traced replay, saying also what is missing from it
// (records without a known stream or without timestamps, records CUPTI dropped).
std::string FormatStepTraceLine(const TraceCapture& capture);

// "sparsekv/32768/4/0.2" ("full-hbm/32768/4/-" without a target): how the file keys a point.
std::string StepTraceKey(const StepTrace& trace);

// The --trace-step file: the run's identity (command, device, preset, layers) and, per traced
// point, its key, identity, summary and records (times relative to the point's first record).
std::string FormatStepTraceJson(const E2EReport& report);

}  // namespace sparsekv::tools
