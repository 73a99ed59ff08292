#include "tools/sparsekv/pool/pool_metrics.h"

#include <chrono>

namespace sparsekv::tools {

StatusOr<std::unique_ptr<PoolServerMetrics>> PoolServerMetrics::Start(const std::string& host,
                                                                      int port,
                                                                      const HostKVPool* pool,
                                                                      int64_t region_bytes) {
  MetricsOptions options;
  options.listen_address = host + ":" + std::to_string(port);
  auto exporter = MetricsExporter::Start(options);
  if (!exporter.ok()) return exporter.status();
  PoolServerCounters counters;
  counters.region_bytes = region_bytes;
  counters.start_time_seconds =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  const std::string url = "http://" + host + ":" + std::to_string((*exporter)->port()) + "/metrics";
  std::unique_ptr<PoolServerMetrics> metrics(
      new PoolServerMetrics(std::move(exporter).value(), pool, counters, url));
  metrics->Publish();
  return metrics;
}

void PoolServerMetrics::Publish() {
  MetricsSnapshot snapshot;
  snapshot.server = counters_;
  if (pool_ != nullptr) snapshot.pool = PoolOccupancy::Of(*pool_);
  exporter_->Publish(std::move(snapshot));
}

}  // namespace sparsekv::tools
