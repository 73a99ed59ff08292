// MetricsExporter and FormatMetrics over prometheus-cpp: a snapshot becomes metric families
// (prometheus::MetricFamily) when a scrape asks for them, so that counters are the library's own
// totals rather than increments kept a second time. docs/metrics.md lists what each one shows.
#include "sparsekv/metrics.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <prometheus/check_names.h>
#include <prometheus/collectable.h>
#include <prometheus/exposer.h>
#include <prometheus/metric_family.h>
#include <prometheus/text_serializer.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <exception>
#include <mutex>
#include <sstream>
#include <thread>
#include <utility>
#include <vector>

namespace sparsekv {
namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;

// Label names the metrics themselves use; a constant label may not take one.
constexpr const char* kMetricLabels[] = {"result", "reason", "direction", "choice", "use"};

Status CheckOptions(const MetricsOptions& options) {
  if (options.prefix.empty() || options.prefix.find(':') != std::string::npos ||
      !prometheus::CheckMetricName(options.prefix)) {
    return InvalidArgument("metrics prefix '" + options.prefix +
                           "' is not a metric name ([a-zA-Z_][a-zA-Z0-9_]*)");
  }
  for (const auto& [name, value] : options.labels) {
    if (!prometheus::CheckLabelName(name)) {
      return InvalidArgument("metrics label '" + name + "' is not a label name");
    }
    for (const char* used : kMetricLabels) {
      if (name == used) {
        return InvalidArgument("metrics label '" + name + "' is one the metrics use themselves");
      }
    }
  }
  if (options.http_threads < 1) {
    return InvalidArgument("metrics http_threads must be at least 1, got " +
                           std::to_string(options.http_threads));
  }
  return Status::Ok();
}

// Appends the families of one snapshot, every sample with the constant labels.
class FamilyBuilder {
 public:
  FamilyBuilder(const MetricsOptions& options, std::vector<MetricFamily>* out)
      : options_(options), out_(out) {}

  // A family with one sample per (label value, value); no label when `label` is empty.
  void Add(MetricType type, const std::string& name, const std::string& help,
           const std::string& label, const std::vector<std::pair<std::string, double>>& values) {
    MetricFamily family;
    family.name = options_.prefix + "_" + name;
    family.help = help;
    family.type = type;
    for (const auto& [label_value, value] : values) {
      ClientMetric metric;
      for (const auto& [n, v] : options_.labels) metric.label.push_back({n, v});
      if (!label.empty()) metric.label.push_back({label, label_value});
      if (type == MetricType::Counter) {
        metric.counter.value = value;
      } else {
        metric.gauge.value = value;
      }
      family.metric.push_back(std::move(metric));
    }
    out_->push_back(std::move(family));
  }
  void Counter(const std::string& name, const std::string& help, double value) {
    Add(MetricType::Counter, name, help, "", {{"", value}});
  }
  void Gauge(const std::string& name, const std::string& help, double value) {
    Add(MetricType::Gauge, name, help, "", {{"", value}});
  }

 private:
  const MetricsOptions& options_;
  std::vector<MetricFamily>* out_;
};

double D(uint64_t v) { return static_cast<double>(v); }
double D(int64_t v) { return static_cast<double>(v); }
double D(int32_t v) { return static_cast<double>(v); }

void AddCache(const CacheStats& s, FamilyBuilder& b) {
  const LayerStats& t = s.total;
  b.Add(MetricType::Counter, "topk_lookups_total",
        "Top-k entries resolved against the hot cache, by result (hit rate = the non-miss "
        "results over all).",
        "result",
        {{"hit", D(t.hits)},
         {"window_hit", D(t.window_hits)},
         {"resident_hit", D(t.resident_hits)},
         {"miss", D(t.misses)}});
  b.Add(MetricType::Counter, "topk_skipped_entries_total",
        "Top-k entries skipped, by reason (out_of_range: an engine error).", "reason",
        {{"padding", D(t.padding)},
         {"duplicate", D(t.duplicates)},
         {"out_of_range", D(t.out_of_range)}});
  b.Add(MetricType::Counter, "transfer_bytes_total",
        "KV bytes copied, by direction: host_to_device (misses, prefetch, window loads), "
        "device_to_host (write-back of new tokens), device_to_device (assembled rows).",
        "direction",
        {{"host_to_device", D(s.bytes_host_to_device)},
         {"device_to_host", D(s.bytes_device_to_host)},
         {"device_to_device", D(s.bytes_assembled)}});
  b.Counter("ingested_bytes_total", "Prompt KV bytes written into the host pool.",
            D(s.bytes_ingested));
  b.Counter("prefix_lookup_tokens_total", "Prompt tokens of admissions that looked up a prefix.",
            D(s.prefix_lookup_tokens));
  b.Counter("prefix_hit_tokens_total", "Of those, tokens found in the host pool (not ingested).",
            D(s.prefix_hit_tokens));
  b.Counter("copy_on_write_pages_total", "Shared, partially filled pages copied before an append.",
            D(s.copy_on_write_pages));
  b.Counter("retained_evictions_total",
            "Retained conversations evicted to make room for an admission.", D(s.evictions));
  b.Counter("retained_evicted_pages_total", "Host pages those evictions freed.",
            D(s.evicted_pages));
  b.Counter("demotions_total", "Resident requests demoted to hot-cache mode.", D(s.demotions));
  b.Counter("promotions_total", "Hot-cache requests made resident.", D(s.promotions));
  b.Counter("prefetch_lookups_total", "Positions the cross-layer prefetch looked up.",
            D(s.prefetch_lookups));
  b.Counter("prefetch_rows_total", "Of those, rows fetched (not resident).", D(s.prefetch_rows));
  b.Counter("prefetch_useful_rows_total",
            "Prefetched rows a resolve then hit (precision = useful / prefetch_rows).",
            D(s.prefetch_useful_rows));
  b.Counter("prefetch_wasted_rows_total", "Prefetched rows evicted before any resolve hit them.",
            D(s.prefetch_wasted_rows));
  b.Counter("prefetch_missed_rows_total",
            "Misses of resolves that followed a prefetch: rows it did not bring (recall = useful "
            "/ (useful + missed)).",
            D(s.prefetch_missed_rows));
  b.Counter("invalid_copy_entries_total",
            "Copy entries skipped as out of bounds (0 unless something is wrong).",
            D(s.invalid_copy_entries));
  b.Gauge("hot_cache_used_blocks", "Hot-cache blocks held by requests in hot-cache mode.",
          D(s.hot_blocks_used));
  b.Gauge("resident_requests", "Requests whose whole KV is in device memory.",
          D(s.resident_requests));
  b.Gauge("device_memory_bytes",
          "Device memory the manager holds: hot cache, replacement state, page table, plan "
          "buffers.",
          D(s.device_bytes));
  const DeviceMemoryUse& d = s.device_memory;
  b.Add(MetricType::Gauge, "device_memory_use_bytes",
        "Device memory the manager holds, by use (the uses add up to device_memory_bytes).", "use",
        {{"resident_rows", D(d.resident_rows)},
         {"hot_cache_rows", D(d.hot_cache_rows)},
         {"indexer_keys", D(d.indexer_keys)},
         {"free_rows", D(d.free_rows)},
         {"replacement_state", D(d.replacement_state)},
         {"tables", D(d.tables)},
         {"plan", D(d.plan)},
         {"counters", D(d.counters)},
         {"resident_entries", D(d.resident_entries)},
         {"windows", D(d.windows)}});
  const HostMemoryUse& h = s.host_memory;
  b.Add(MetricType::Gauge, "host_pool_use_bytes",
        "Pages of the host pool by use, in bytes (the uses add up to the pool's pages).", "use",
        {{"private", D(h.private_pages)},
         {"shared", D(h.shared_pages)},
         {"retained", D(h.retained_pages)},
         {"free", D(h.free_pages)}});
  b.Gauge("host_pool_shared_pages", "Host pages with more than one holder.", D(s.pages_shared));
  b.Gauge("prefix_saved_bytes",
          "Host bytes that sharing saves: page copies private histories "
          "would store.",
          D(s.bytes_saved));
  b.Gauge("retained_conversations", "Conversations retained in the host pool.",
          D(s.retained_conversations));
  b.Gauge("retained_entries_bytes",
          "Host copies of retained conversations' resident-layer entries and raw windows, "
          "outside the host pool.",
          D(h.retained_entries));
}

void AddPool(const PoolOccupancy& p, FamilyBuilder& b) {
  b.Gauge("host_pool_capacity_pages", "Pages of the host pool.", D(p.total_pages));
  b.Gauge("host_pool_used_pages", "Pages of the host pool in use (by every process).",
          D(p.total_pages - p.free_pages));
  b.Gauge("host_pool_capacity_bytes", "Bytes of rows of the host pool.", D(p.bytes));
  b.Gauge("host_pool_capacity_owners", "Page-table rows of the host pool.", D(p.max_owners));
  b.Gauge("host_pool_used_owners", "Page-table rows held by requests and prompts.",
          D(p.max_owners - p.free_owners));
  if (p.live_processes >= 0) {
    b.Gauge("node_pool_live_processes", "Processes attached to the node pool.",
            D(p.live_processes));
  }
}

void AddSchedule(const ScheduleStats& s, FamilyBuilder& b) {
  std::vector<std::pair<std::string, double>> by_choice;
  for (const auto& [choice, steps] : s.steps_by_choice) by_choice.emplace_back(choice, D(steps));
  b.Add(MetricType::Counter, "schedule_steps_total", "Steps the step schedule planned, by choice.",
        "choice", by_choice);
  b.Counter("schedule_calibration_steps_total", "Of those, steps that measured a candidate.",
            D(s.calibration_steps));
  if (s.steps > 0) {
    b.Add(MetricType::Gauge, "schedule_last_choice_info", "The last planned step's choice (1).",
          "choice", {{s.last_choice.ToString(), 1.0}});
  }
}

void AddServer(const PoolServerCounters& s, FamilyBuilder& b) {
  b.Counter("pool_server_heartbeat_failures_total",
            "Heartbeats the control plane refused or did not answer.", D(s.heartbeat_failures));
  b.Counter("pool_server_rejoins_total", "Memberships lost (lease lapsed) and rejoined.",
            D(s.rejoins));
  b.Counter("node_pool_reclaimed_processes_total",
            "Dead processes whose pages the node pool reclaimed.", D(s.reclaimed_processes));
  b.Gauge("pool_server_region_bytes", "Bytes of the UCX region served (0 for a node pool).",
          D(s.region_bytes));
  b.Gauge("pool_server_start_time_seconds", "When the server started, seconds since the epoch.",
          s.start_time_seconds);
}

std::vector<MetricFamily> Families(const MetricsSnapshot& snapshot, const MetricsOptions& options) {
  std::vector<MetricFamily> families;
  FamilyBuilder b(options, &families);
  if (snapshot.cache) AddCache(*snapshot.cache, b);
  if (snapshot.pool) {
    AddPool(*snapshot.pool, b);
  } else if (snapshot.cache) {
    // Without the pool, its pages as the manager last counted them.
    b.Gauge("host_pool_capacity_pages", "Pages of the host pool.",
            D(snapshot.cache->host_pages_total));
    b.Gauge("host_pool_used_pages", "Pages of the host pool in use (by every process).",
            D(snapshot.cache->host_pages_used));
  }
  if (snapshot.schedule) AddSchedule(*snapshot.schedule, b);
  if (snapshot.server) AddServer(*snapshot.server, b);
  if (!families.empty()) {
    b.Gauge("stats_timestamp_seconds",
            "When the statistics shown were read, seconds since the epoch.",
            snapshot.timestamp_seconds);
  }
  return families;
}

double NowSeconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// What the exposer asks at every scrape: the families of the last snapshot published.
class SnapshotCollectable : public prometheus::Collectable {
 public:
  explicit SnapshotCollectable(MetricsOptions options) : options_(std::move(options)) {}
  void Publish(MetricsSnapshot snapshot) {
    std::lock_guard<std::mutex> lock(mutex_);
    snapshot_ = std::move(snapshot);
  }
  std::vector<MetricFamily> Collect() const override {
    std::lock_guard<std::mutex> lock(mutex_);
    return Families(snapshot_, options_);
  }

 private:
  const MetricsOptions options_;
  mutable std::mutex mutex_;
  MetricsSnapshot snapshot_;  // guarded by mutex_
};

// Connects to 127.0.0.1:port and closes at once (errors ignored).
void Knock(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return;
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address));
  close(fd);
}

}  // namespace

class MetricsExporter::Impl {
 public:
  std::shared_ptr<SnapshotCollectable> collectable;
  std::unique_ptr<prometheus::Exposer> exposer;
  int port = 0;
  bool loopback = false;  // the server listens on 127.0.0.1 or every address

  // The exposer goes first, so that no scrape outlives the rest. Its HTTP server (civetweb)
  // notices a stop only when its listening poll returns, which without a connection takes up to
  // 2 s; knocking on the port while it stops makes shutdown immediate.
  ~Impl() {
    if (exposer == nullptr) return;
    std::atomic<bool> stopped{false};
    std::thread knocker;
    if (loopback) {
      knocker = std::thread([&] {
        while (!stopped.load()) {
          Knock(port);
          std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
      });
    }
    exposer.reset();
    stopped = true;
    if (knocker.joinable()) knocker.join();
  }
};

StatusOr<std::unique_ptr<MetricsExporter>> MetricsExporter::Start(const MetricsOptions& options) {
  SPARSEKV_RETURN_IF_ERROR(CheckOptions(options));
  const size_t colon = options.listen_address.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == options.listen_address.size()) {
    return InvalidArgument("metrics address must be HOST:PORT, got '" + options.listen_address +
                           "'");
  }
  auto impl = std::make_unique<Impl>();
  impl->collectable = std::make_shared<SnapshotCollectable>(options);
  try {
    impl->exposer = std::make_unique<prometheus::Exposer>(
        options.listen_address, static_cast<size_t>(options.http_threads));
  } catch (const std::exception& e) {
    return Unavailable("cannot serve metrics at " + options.listen_address + ": " + e.what());
  }
  impl->exposer->RegisterCollectable(impl->collectable);
  const std::vector<int> ports = impl->exposer->GetListeningPorts();
  if (ports.empty())
    return Unavailable("metrics server at " + options.listen_address + " listens on no port");
  impl->port = ports.front();
  const std::string host = options.listen_address.substr(0, colon);
  impl->loopback = host == "127.0.0.1" || host == "0.0.0.0" || host == "localhost";
  return std::unique_ptr<MetricsExporter>(new MetricsExporter(std::move(impl)));
}

MetricsExporter::MetricsExporter(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
MetricsExporter::~MetricsExporter() = default;

int MetricsExporter::port() const { return impl_->port; }

void MetricsExporter::Publish(MetricsSnapshot snapshot) {
  if (snapshot.timestamp_seconds == 0) snapshot.timestamp_seconds = NowSeconds();
  impl_->collectable->Publish(std::move(snapshot));
}

StatusOr<std::string> FormatMetrics(const MetricsSnapshot& snapshot,
                                    const MetricsOptions& options) {
  SPARSEKV_RETURN_IF_ERROR(CheckOptions(options));
  std::ostringstream out;
  prometheus::TextSerializer().Serialize(out, Families(snapshot, options));
  return out.str();
}

}  // namespace sparsekv
