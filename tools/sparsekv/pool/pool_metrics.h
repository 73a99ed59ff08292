// What `sparsekv pool --metrics-port` serves: the pool server's counters and, for a node pool,
// its occupancy, published to a MetricsExporter (sparsekv/metrics.h; docs/metrics.md) by the
// server's loop at every heartbeat. Not thread-safe: the server's loop owns it.
#pragma once

#include <memory>
#include <string>

#include "sparsekv/host_kv_pool.h"
#include "sparsekv/metrics.h"
#include "sparsekv/status.h"

namespace sparsekv::tools {

class PoolServerMetrics {
 public:
  // Serves /metrics at host:port (port 0: a free one). Errors: MetricsExporter::Start's.
  // `pool` (may be null: a UCX region) must outlive this object; region_bytes is what a UCX
  // server contributes (0 for a node pool).
  static StatusOr<std::unique_ptr<PoolServerMetrics>> Start(const std::string& host, int port,
                                                            const HostKVPool* pool,
                                                            int64_t region_bytes);
  // "http://host:port/metrics", with the port actually bound.
  const std::string& url() const { return url_; }

  void CountHeartbeatFailure() { ++counters_.heartbeat_failures; }
  void CountRejoin() { ++counters_.rejoins; }
  void CountReclaimed(int32_t processes) { counters_.reclaimed_processes += processes; }
  // Publishes the counters and the pool's occupancy now.
  void Publish();

 private:
  PoolServerMetrics(std::unique_ptr<MetricsExporter> exporter, const HostKVPool* pool,
                    PoolServerCounters counters, std::string url)
      : exporter_(std::move(exporter)), pool_(pool), counters_(counters), url_(std::move(url)) {}

  std::unique_ptr<MetricsExporter> exporter_;
  const HostKVPool* pool_;
  PoolServerCounters counters_;
  std::string url_;
};

}  // namespace sparsekv::tools
