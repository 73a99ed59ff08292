// Prometheus metrics: a manager's statistics, its host pool's occupancy, a step schedule's
// choices and a pool server's health, served over HTTP at /metrics in the text exposition format
// (prometheus-cpp). Every metric's name, type, labels and source: docs/metrics.md.
//
// A scrape runs on the exporter's HTTP threads, while a manager is driven by one thread and is not
// thread-safe. So the driving thread publishes a snapshot between steps (Publish, PublishFrom) and
// a scrape shows the last one published; `<prefix>_stats_timestamp_seconds` says when that was.
//
// Built with prometheus-cpp (Debian's prometheus-cpp-dev; SPARSEKV_PROMETHEUS in the top-level
// CMakeLists.txt). Without it, MetricsExporter::Start and FormatMetrics return Unavailable.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "sparsekv/host_kv_pool.h"
#include "sparsekv/manager.h"
#include "sparsekv/status.h"
#include "sparsekv/step_schedule.h"

namespace sparsekv {

// A host pool's occupancy, now (HostKVPool's getters, each read under the pool's mutex).
struct PoolOccupancy {
  int32_t total_pages = 0;
  int32_t free_pages = 0;
  int32_t max_owners = 0;   // page-table rows
  int32_t free_owners = 0;  // rows no request or prompt holds
  int64_t bytes = 0;        // bytes of rows: total_pages * page_tokens * token_stride_bytes
  // A node pool's attached processes not known to have exited; -1 for a pool of one process.
  int32_t live_processes = -1;

  static PoolOccupancy Of(const HostKVPool& pool);
};

// What a pool server (`sparsekv pool`) counts while it serves.
struct PoolServerCounters {
  uint64_t heartbeat_failures = 0;   // heartbeats the control plane refused or did not answer
  uint64_t rejoins = 0;              // memberships lost (lease lapsed) and rejoined
  uint64_t reclaimed_processes = 0;  // dead processes whose pages a node pool reclaimed
  int64_t region_bytes = 0;          // the UCX region contributed (0 for a node pool)
  double start_time_seconds = 0;     // when it started serving, seconds since the Unix epoch
};

// What one scrape shows. A part left empty is not shown.
struct MetricsSnapshot {
  std::optional<CacheStats> cache;
  std::optional<PoolOccupancy> pool;
  std::optional<ScheduleStats> schedule;
  std::optional<PoolServerCounters> server;
  // When the snapshot was taken, seconds since the Unix epoch; 0: Publish sets the current time.
  double timestamp_seconds = 0;
};

struct MetricsOptions {
  // ---- Behaviour ----
  // Where /metrics is served: "HOST:PORT"; port 0 takes a free one (MetricsExporter::port).
  std::string listen_address = "127.0.0.1:0";
  // The first word of every metric name ([a-zA-Z_][a-zA-Z0-9_]*).
  std::string prefix = "sparsekv";
  // Labels added to every sample, e.g. {"tp_rank", "0"} for one manager per GPU in one process
  // group; names as Prometheus allows them and not the ones the metrics use (result, reason,
  // direction,
  // choice, use).
  std::map<std::string, std::string> labels;

  // ---- Performance ----
  int32_t http_threads = 2;  // threads answering scrapes
};

class MetricsExporter {
 public:
  // Serves /metrics at options.listen_address; scrapes show an empty snapshot until the first
  // Publish. InvalidArgument for a bad prefix, label or address; Unavailable if the address cannot
  // be bound, or without prometheus-cpp.
  static StatusOr<std::unique_ptr<MetricsExporter>> Start(const MetricsOptions& options);
  // Stops serving (waits for a scrape in progress).
  ~MetricsExporter();
  MetricsExporter(const MetricsExporter&) = delete;
  MetricsExporter& operator=(const MetricsExporter&) = delete;

  // The port /metrics is served on.
  int port() const;
  // Replaces what the next scrape shows. Thread-safe.
  void Publish(MetricsSnapshot snapshot);
  // Publishes manager.ReadStats(stream) (which synchronises `stream`), the occupancy of the
  // manager's host pool and, when `schedule` is not null, schedule->stats(). REQUIRES: called by
  // the thread that drives `manager`, between steps. Errors: ReadStats's (nothing is published).
  Status PublishFrom(SparseKVCacheManager& manager, const StepSchedule* schedule,
                     StreamHandle stream);

 private:
  class Impl;
  explicit MetricsExporter(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The text exposition of `snapshot` (options.prefix and options.labels; the address is not used),
// as a scrape shows it less the HTTP server's own metrics. InvalidArgument as Start; Unavailable
// without prometheus-cpp.
StatusOr<std::string> FormatMetrics(const MetricsSnapshot& snapshot, const MetricsOptions& options);

}  // namespace sparsekv
