// The parts of the metrics component that need no prometheus-cpp: reading a pool's occupancy and
// taking a manager's snapshot.

#include "sparsekv/metrics.h"

namespace sparsekv {

PoolOccupancy PoolOccupancy::Of(const HostKVPool& pool) {
  PoolOccupancy o;
  o.total_pages = pool.total_pages();
  o.free_pages = pool.free_pages();
  o.max_owners = pool.max_owners();
  o.free_owners = pool.free_owners();
  o.bytes = pool.bytes();
  o.live_processes = pool.is_node_pool() ? pool.live_processes() : -1;
  return o;
}

Status MetricsExporter::PublishFrom(SparseKVCacheManager& manager, const StepSchedule* schedule,
                                    StreamHandle stream) {
  StatusOr<CacheStats> stats = manager.ReadStats(stream);
  if (!stats.ok()) return stats.status();
  MetricsSnapshot snapshot;
  snapshot.cache = std::move(stats).value();
  snapshot.pool = PoolOccupancy::Of(manager.host_pool());
  if (schedule != nullptr) snapshot.schedule = schedule->stats();
  Publish(std::move(snapshot));
  return Status::Ok();
}

}  // namespace sparsekv
