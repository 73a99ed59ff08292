// MetricsExporter and FormatMetrics when the library is built without prometheus-cpp
// (SPARSEKV_PROMETHEUS=OFF, or AUTO without prometheus-cpp-dev): both fail, so no exporter exists.
#include "sparsekv/metrics.h"

namespace sparsekv {
namespace {

Status NotBuilt() {
  return Unavailable(
      "sparsekv was built without Prometheus metrics (install prometheus-cpp-dev, then "
      "reconfigure with SPARSEKV_PROMETHEUS=AUTO or ON)");
}

}  // namespace

class MetricsExporter::Impl {};

StatusOr<std::unique_ptr<MetricsExporter>> MetricsExporter::Start(const MetricsOptions&) {
  return NotBuilt();
}
MetricsExporter::MetricsExporter(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
MetricsExporter::~MetricsExporter() = default;
int MetricsExporter::port() const { return 0; }
void MetricsExporter::Publish(MetricsSnapshot) {}

StatusOr<std::string> FormatMetrics(const MetricsSnapshot&, const MetricsOptions&) {
  return NotBuilt();
}

}  // namespace sparsekv
