#include "tools/sparsekv/bench/step_trace.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <utility>

#include "tools/sparsekv/bench/e2e_report.h"

namespace sparsekv::tools {
namespace {

using Json = nlohmann::ordered_json;
using Interval = std::pair<uint64_t, uint64_t>;  // [start, end) in ns

bool Valid(const TraceRecord& r) { return r.start_ns != 0 && r.end_ns >= r.start_ns; }

double Us(uint64_t ns) { return static_cast<double>(ns) / 1e3; }

// Sorted, disjoint intervals covering the same time as `v` (touching intervals merge).
std::vector<Interval> Merge(std::vector<Interval> v) {
  std::sort(v.begin(), v.end());
  std::vector<Interval> out;
  for (const Interval& i : v) {
    if (!out.empty() && i.first <= out.back().second) {
      out.back().second = std::max(out.back().second, i.second);
    } else {
      out.push_back(i);
    }
  }
  return out;
}

uint64_t Measure(const std::vector<Interval>& merged) {
  uint64_t total = 0;
  for (const auto& [start, end] : merged) total += end - start;
  return total;
}

// |a ∩ b| for two merged lists.
uint64_t IntersectionMeasure(const std::vector<Interval>& a, const std::vector<Interval>& b) {
  uint64_t total = 0;
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    const uint64_t lo = std::max(a[i].first, b[j].first);
    const uint64_t hi = std::min(a[i].second, b[j].second);
    if (lo < hi) total += hi - lo;
    (a[i].second < b[j].second) ? ++i : ++j;
  }
  return total;
}

// |x ∩ merged|.
uint64_t OverlapMeasure(Interval x, const std::vector<Interval>& merged) {
  uint64_t total = 0;
  // The first interval that ends after x starts.
  auto it = std::upper_bound(merged.begin(), merged.end(), x.first,
                             [](uint64_t t, const Interval& m) { return t < m.second; });
  for (; it != merged.end() && it->first < x.second; ++it) {
    const uint64_t lo = std::max(x.first, it->first);
    const uint64_t hi = std::min(x.second, it->second);
    if (lo < hi) total += hi - lo;
  }
  return total;
}

std::string_view KindName(TraceKind kind) {
  switch (kind) {
    case TraceKind::kKernel:
      return "kernel";
    case TraceKind::kMemcpy:
      return "memcpy";
    case TraceKind::kMemset:
      return "memset";
  }
  return "kernel";
}

std::string Fixed(double value, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", digits, value);
  return buf;
}

Json SummaryJson(const StepTraceSummary& s) {
  Json j;
  j["records"] = s.records;
  j["invalid_records"] = s.invalid_records;
  j["unknown_lane_records"] = s.unknown_lane_records;
  j["span_us"] = s.span_us;
  j["idle_us"] = s.idle_us;
  j["main_busy_us"] = s.main_busy_us;
  j["side_busy_us"] = s.side_busy_us;
  j["hidden_us"] = s.hidden_us;
  j["exposed_us"] = s.exposed_us;
  j["main_gaps"] = s.main_gaps;
  j["main_gap_us"] = s.main_gap_us;
  j["main_gap_max_us"] = s.main_gap_max_us;
  j["main_gap_side_us"] = s.main_gap_side_us;
  Json names = Json::array();
  for (const TraceNameTotals& n : s.names) {
    names.push_back({{"name", n.name},
                     {"kind", KindName(n.kind)},
                     {"count", n.count},
                     {"main_count", n.main_count},
                     {"side_count", n.side_count},
                     {"total_us", n.total_us},
                     {"main_us", n.main_us},
                     {"side_us", n.side_us},
                     {"unknown_us", n.unknown_us},
                     {"hidden_us", n.hidden_us},
                     {"exposed_us", n.exposed_us}});
  }
  j["names"] = std::move(names);
  return j;
}

Json RecordJson(const TraceRecord& r, uint64_t origin) {
  Json j;
  j["kind"] = KindName(r.kind);
  j["name"] = r.name;
  if (Valid(r)) {
    j["start_ns"] = r.start_ns - origin;  // origin: the earliest valid start
    j["end_ns"] = r.end_ns - origin;
  } else {
    j["start_ns"] = nullptr;
    j["end_ns"] = nullptr;
  }
  j["lane"] = r.lane;
  j["stream_id"] = r.stream_id;
  j["graph_node_id"] = r.graph_node_id;
  if (r.kind == TraceKind::kKernel) {
    j["grid"] = r.grid;
    j["block"] = r.block;
  } else {
    j["bytes"] = r.bytes;
  }
  return j;
}

}  // namespace

StepTraceSummary SummarizeStepTrace(std::span<const TraceRecord> records) {
  StepTraceSummary s;
  std::vector<Interval> all, main, side;
  for (const TraceRecord& r : records) {
    if (!Valid(r)) {
      ++s.invalid_records;
      continue;
    }
    ++s.records;
    const Interval i{r.start_ns, r.end_ns};
    all.push_back(i);
    if (r.lane == kMainLane) {
      main.push_back(i);
    } else if (r.lane > kMainLane) {
      side.push_back(i);
    } else {
      ++s.unknown_lane_records;
    }
  }
  all = Merge(std::move(all));
  main = Merge(std::move(main));
  side = Merge(std::move(side));
  if (!all.empty()) {
    const uint64_t span = all.back().second - all.front().first;
    s.span_us = Us(span);
    s.idle_us = Us(span - Measure(all));
  }
  s.main_busy_us = Us(Measure(main));
  s.side_busy_us = Us(Measure(side));
  const uint64_t hidden = IntersectionMeasure(side, main);
  s.hidden_us = Us(hidden);
  s.exposed_us = Us(Measure(side) - hidden);

  std::vector<Interval> gaps;
  for (size_t k = 1; k < main.size(); ++k) gaps.emplace_back(main[k - 1].second, main[k].first);
  s.main_gaps = static_cast<int32_t>(gaps.size());
  for (const auto& [start, end] : gaps)
    s.main_gap_max_us = std::max(s.main_gap_max_us, Us(end - start));
  s.main_gap_us = Us(Measure(gaps));
  s.main_gap_side_us = Us(IntersectionMeasure(gaps, side));

  std::map<std::string, TraceNameTotals> by_name;
  for (const TraceRecord& r : records) {
    if (!Valid(r)) continue;
    TraceNameTotals& n = by_name[r.name];
    n.name = r.name;
    n.kind = r.kind;
    ++n.count;
    const double us = Us(r.end_ns - r.start_ns);
    n.total_us += us;
    if (r.lane == kMainLane) {
      ++n.main_count;
      n.main_us += us;
    } else if (r.lane > kMainLane) {
      ++n.side_count;
      n.side_us += us;
      const double hidden_us = Us(OverlapMeasure({r.start_ns, r.end_ns}, main));
      n.hidden_us += hidden_us;
      n.exposed_us += us - hidden_us;
    } else {
      n.unknown_us += us;
    }
  }
  for (auto& [name, totals] : by_name) s.names.push_back(std::move(totals));
  std::stable_sort(
      s.names.begin(), s.names.end(),
      [](const TraceNameTotals& a, const TraceNameTotals& b) { return a.total_us > b.total_us; });
  return s;
}

std::string FormatStepTraceLine(const TraceCapture& capture) {
  const StepTraceSummary s = SummarizeStepTrace(capture.records);
  if (s.records == 0) {
    return "no activity recorded (" + std::to_string(capture.records.size()) +
           " records without timestamps, " + std::to_string(capture.dropped_records) + " dropped)";
  }
  std::string line =
      "span " + Fixed(s.span_us / 1e3, 3) + " ms, main busy " + Fixed(s.main_busy_us / 1e3, 3) +
      " ms, " + std::to_string(s.main_gaps) + " gaps " + Fixed(s.main_gap_us / 1e3, 3) +
      " ms, side " + Fixed(s.side_busy_us / 1e3, 3) + " ms (hidden " + Fixed(s.hidden_us / 1e3, 3) +
      ", exposed " + Fixed(s.exposed_us / 1e3, 3) + "), " + std::to_string(s.records) + " records";
  if (s.unknown_lane_records > 0) {
    line += ", " + std::to_string(s.unknown_lane_records) + " of unknown stream";
  }
  if (s.invalid_records > 0) {
    line += ", " + std::to_string(s.invalid_records) + " without timestamps";
  }
  if (capture.dropped_records > 0) {
    line += ", " + std::to_string(capture.dropped_records) + " dropped";
  }
  return line;
}

std::string StepTraceKey(const StepTrace& t) {
  char rate[32] = "-";
  if (t.miss_rate_target) std::snprintf(rate, sizeof(rate), "%g", *t.miss_rate_target);
  return t.variant + "/" + std::to_string(t.context) + "/" + std::to_string(t.batch) + "/" + rate;
}

std::string FormatStepTraceJson(const E2EReport& report) {
  Json j;
  j["format"] = "sparsekv step trace 1";
  j["command"] = report.command;
  j["device"] = report.device;
  j["preset"] = report.preset;
  j["layers"] = report.layers;
  j["clock"] = "ns; CUPTI timestamps, relative to each point's first record (origin_ns, absolute)";
  Json points = Json::array();
  for (const StepTrace& t : report.step_traces) {
    const TraceCapture& c = t.capture;
    uint64_t origin = 0;
    for (const TraceRecord& r : c.records) {
      if (Valid(r) && (origin == 0 || r.start_ns < origin)) origin = r.start_ns;
    }
    Json p;
    p["key"] = StepTraceKey(t);
    p["variant"] = t.variant;
    p["context"] = t.context;
    p["batch"] = t.batch;
    p["miss_rate_target"] = t.miss_rate_target ? Json(*t.miss_rate_target) : Json(nullptr);
    p["tpot_ms"] = t.tpot_ms;
    p["origin_ns"] = origin;
    // From the start of the trace (just before cudaGraphLaunch) to the first record's start.
    p["launch_to_first_us"] = origin >= c.window_start_ns && origin > 0
                                  ? Json(Us(origin - c.window_start_ns))
                                  : Json(nullptr);
    p["dropped_records"] = c.dropped_records;
    p["lanes"] = c.lanes;
    p["summary"] = SummaryJson(SummarizeStepTrace(c.records));
    Json records = Json::array();
    for (const TraceRecord& r : c.records) records.push_back(RecordJson(r, origin));
    p["records"] = std::move(records);
    points.push_back(std::move(p));
  }
  j["points"] = std::move(points);
  return j.dump(1) + "\n";
}

}  // namespace sparsekv::tools
