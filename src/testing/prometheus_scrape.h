// Test helper: scrape a Prometheus endpoint with a plain HTTP GET and read the text exposition
// format, and read the metrics docs/metrics.md documents.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "sparsekv/status.h"

namespace sparsekv::testing {

// A scrape, parsed. A sample's key is its name and labels as written: `name{a="x",b="y"}`, or
// `name` without labels.
struct Exposition {
  std::map<std::string, std::string> types;  // family name -> counter, gauge, ...
  std::map<std::string, std::string> help;   // family name -> its HELP text
  std::map<std::string, double> samples;     // sample key -> value
};

// GET http://127.0.0.1:port<path> (HTTP/1.0). Returns the body; Unavailable if the connection
// fails, Internal for a status other than 200.
StatusOr<std::string> HttpGet(int port, const std::string& path);

// Parses the text exposition format; InvalidArgument for a line it cannot read.
StatusOr<Exposition> ParseExposition(const std::string& text);

// One row of docs/metrics.md's tables: a metric, its type and where its value comes from.
struct DocumentedMetric {
  std::string name;    // with the default prefix, e.g. sparsekv_topk_lookups_total
  std::string type;    // counter or gauge
  std::string source;  // manager, pool, node pool, schedule or pool server
};
// The rows of every table in `path` whose first cell is a `sparsekv_...` name.
std::vector<DocumentedMetric> ReadDocumentedMetrics(const std::string& path);

}  // namespace sparsekv::testing
