#include "tools/sparsekv/pool/pool_command.h"

#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <csignal>
#include <memory>

#include "sparsekv/capacity.h"
#include "sparsekv/control_plane.h"
#include "sparsekv/node_pool.h"
#include "sparsekv/transport.h"
#include "tools/sparsekv/common/config_file.h"
#include "tools/sparsekv/common/exit_codes.h"
#include "tools/sparsekv/common/validators.h"
#include "tools/sparsekv/pool/pool_metrics.h"

namespace sparsekv::tools {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

volatile std::sig_atomic_t stop_requested = 0;
extern "C" void OnStopSignal(int) { stop_requested = 1; }

// The region a pool server contributes: anonymous, page-aligned memory (zero until written).
class Mapping {
 public:
  explicit Mapping(size_t bytes) : bytes_(bytes) {
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    base_ = p == MAP_FAILED ? nullptr : p;
  }
  ~Mapping() {
    if (base_ != nullptr) munmap(base_, bytes_);
  }
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  void* base() const { return base_; }

 private:
  size_t bytes_;
  void* base_;
};

// "host:port" -> (host, port); false if malformed.
bool ParseHostPort(const std::string& text, std::string* host, int* port) {
  const size_t colon = text.rfind(':');
  if (colon == std::string::npos || colon == 0) return false;
  *host = text.substr(0, colon);
  try {
    size_t used = 0;
    *port = std::stoi(text.substr(colon + 1), &used);
    return used == text.size() - colon - 1 && *port > 0 && *port < 65536;
  } catch (const std::exception&) {
    return false;
  }
}

// SIGTERM and SIGINT set stop_requested. They are blocked in every thread started while the
// returned guard lives (the transport's), so that they interrupt the main thread's wait.
class StopSignals {
 public:
  StopSignals() {
    struct sigaction action {};
    action.sa_handler = OnStopSignal;
    sigemptyset(&action.sa_mask);
    action.sa_flags = 0;  // no SA_RESTART: the wait for events returns early
    sigaction(SIGTERM, &action, nullptr);
    sigaction(SIGINT, &action, nullptr);
    sigemptyset(&set_);
    sigaddset(&set_, SIGTERM);
    sigaddset(&set_, SIGINT);
    pthread_sigmask(SIG_BLOCK, &set_, nullptr);
  }
  // Unblocks them in this thread (call once the helper threads exist).
  void Unblock() { pthread_sigmask(SIG_UNBLOCK, &set_, nullptr); }

 private:
  sigset_t set_;
};

}  // namespace

PoolCommand::PoolCommand(CLI::App& parent) {
  app_ = parent.add_subcommand(
      "pool",
      "Pool server: contribute registered host memory to the shared KV pool (UCX), announced in "
      "the control plane (Redis); runs until SIGTERM/SIGINT.");
  app_->add_option("--node-id", node_id_, "Name of this pool server in the control plane")
      ->required()
      ->check(NonEmpty());
  app_->add_option("--control-plane", control_plane_, "Redis server, HOST:PORT")
      ->capture_default_str();
  app_->add_option("--key-prefix", key_prefix_, "Prefix of every control-plane key")
      ->check(NonEmpty())
      ->capture_default_str();
  CLI::Option* region_mib =
      app_->add_option("--region-mib", region_mib_, "Size of the contributed region, MiB")
          ->capture_default_str()
          ->check(Between<int64_t>(1, int64_t{1} << 30));
  CLI::Option* transports =
      app_->add_option("--transports", transports_,
                       "UCX transports (UCX_TLS), e.g. tcp or shm; empty = UCX's choice");
  CLI::Option* net_devices =
      app_->add_option("--net-devices", net_devices_, "UCX network devices, e.g. lo; empty = all");
  app_->add_option("--lease-ms", lease_ms_, "Membership lease; heartbeats every third of it")
      ->capture_default_str()
      ->check(Between<int64_t>(30, 600000));
  app_->add_option("--timeout-ms", timeout_ms_, "Deadline of every control-plane call and transfer")
      ->capture_default_str()
      ->check(Between<int64_t>(1, 600000));
  const std::string group = "Node pool (instead of a UCX region; docs/scale-out.md)";
  CLI::Option* node_pool =
      app_->add_option("--node-pool", node_pool_,
                       "Create and serve the node pool NAME (a shared-memory segment the processes "
                       "of this machine attach to) instead of a UCX region")
          ->excludes(region_mib)
          ->excludes(transports)
          ->excludes(net_devices)
          ->group(group);
  app_->add_option("--node-pool-dir", node_pool_dir_,
                   "Directory of the node pool's file: a tmpfs, or a hugetlbfs mount")
      ->capture_default_str()
      ->check(NonEmpty())
      ->needs(node_pool)
      ->group(group);
  app_->add_option("--layers", layers_, "Node pool: layers of the KV geometry")
      ->capture_default_str()
      ->check(Between<int32_t>(1, 4096))
      ->needs(node_pool)
      ->group(group);
  app_->add_option("--row-bytes", row_bytes_, "Node pool: bytes of a row (every layer)")
      ->capture_default_str()
      ->check(Between<int32_t>(1, 1 << 20))
      ->needs(node_pool)
      ->group(group);
  app_->add_option("--page-tokens", page_tokens_, "Node pool: tokens per host page")
      ->capture_default_str()
      ->check(Between<int32_t>(1, 1 << 20))
      ->needs(node_pool)
      ->group(group);
  app_->add_option("--capacity-tokens", capacity_tokens_, "Node pool: tokens the pool holds")
      ->capture_default_str()
      ->check(Between<int64_t>(1, INT32_MAX))
      ->needs(node_pool)
      ->group(group);
  app_->add_option("--max-context", max_context_, "Node pool: most tokens of one request")
      ->capture_default_str()
      ->check(Between<int32_t>(1, INT32_MAX))
      ->needs(node_pool)
      ->group(group);
  app_->add_option("--max-owners", max_owners_,
                   "Node pool: page-table rows (live requests and prompts of every process)")
      ->capture_default_str()
      ->check(Between<int32_t>(1, 1 << 20))
      ->needs(node_pool)
      ->group(group);
  app_->add_option("--max-processes", max_processes_, "Node pool: processes attached at once")
      ->capture_default_str()
      ->check(Between<int32_t>(1, 4096))
      ->needs(node_pool)
      ->group(group);
  app_->add_option("--config", config_path_,
                   "Node pool: its shape from FILE, CacheOptions in sparsekv's own JSON "
                   "(docs/config.md): geometry, host_page_tokens, host_capacity_tokens and "
                   "max_context (a flag for a key the file sets is refused); the file's other "
                   "keys are each process's manager's")
      ->option_text("FILE")
      ->check(NonEmpty())
      ->needs(node_pool)
      ->group(group);
  const std::string metrics_group = "Prometheus metrics (docs/metrics.md)";
  CLI::Option* metrics_port =
      app_->add_option("--metrics-port", metrics_port_,
                       "Serve Prometheus metrics at http://HOST:PORT/metrics (0: a free port, "
                       "printed)")
          ->check(Between<int32_t>(0, 65535))
          ->group(metrics_group);
  app_->add_option("--metrics-host", metrics_host_, "Address the metrics are served on")
      ->capture_default_str()
      ->check(NonEmpty())
      ->needs(metrics_port)
      ->group(metrics_group);
}

bool PoolCommand::selected() const { return app_->parsed(); }

int PoolCommand::Run(std::ostream& out, std::ostream& err) {
  ControlPlaneOptions plane_options;
  if (!ParseHostPort(control_plane_, &plane_options.host, &plane_options.port)) {
    err << "sparsekv pool: --control-plane must be HOST:PORT, got '" << control_plane_ << "'\n";
    return kExitUsage;
  }
  plane_options.key_prefix = key_prefix_;
  plane_options.connect_timeout = milliseconds(timeout_ms_);
  plane_options.command_timeout = milliseconds(timeout_ms_);
  const milliseconds lease(lease_ms_);
  const milliseconds heartbeat_period = lease / 3;
  auto fail = [&](const std::string& what, const Status& status) {
    err << "sparsekv pool: " << what << ": " << status.ToString() << "\n";
    return kExitFailure;
  };

  stop_requested = 0;
  StopSignals signals;
  // What this server serves as region 0: a UCX region of anonymous memory, or a node pool.
  std::unique_ptr<Mapping> memory;
  std::unique_ptr<Transport> transport;
  RegionHandle region{};
  std::shared_ptr<HostKVPool> pool;
  std::string descriptor;
  std::string serves;  // for the log line
  if (node_pool_.empty()) {
    const uint64_t bytes = static_cast<uint64_t>(region_mib_) << 20;
    // Registered (pinned) for UCX: it must fit in the host memory, checked before it is mapped.
    if (Status s = CheckHostMemory({.what = "region",
                                    .sizing = "--region-mib " + std::to_string(region_mib_),
                                    .bytes = static_cast<int64_t>(bytes),
                                    .remedy = "lower --region-mib"});
        !s.ok()) {
      err << "sparsekv pool: " << s.message() << "\n";
      return kExitFailure;
    }
    memory = std::make_unique<Mapping>(bytes);
    if (memory->base() == nullptr) {
      return fail("allocating the region", ResourceExhausted(std::to_string(bytes) + " bytes"));
    }
    UcxTransportOptions transport_options;
    transport_options.transports = transports_;
    transport_options.net_devices = net_devices_;
    transport_options.operation_timeout = milliseconds(timeout_ms_);
    auto created = CreateUcxTransport(transport_options);
    if (!created.ok()) return fail("creating the UCX transport", created.status());
    transport = std::move(created).value();
    signals.Unblock();
    auto registered = transport->RegisterRegion(memory->base(), bytes);
    if (!registered.ok()) return fail("registering the region", registered.status());
    region = *registered;
    auto exported = transport->ExportRegion(region);
    if (!exported.ok()) return fail("exporting the region", exported.status());
    descriptor = *exported;
    serves = "region 0 (" + std::to_string(bytes) + " bytes, transports '" + transports_ + "')";
  } else {
    signals.Unblock();
    // The node pool's shape; the hot-cache fields are the manager's (each process's own).
    CacheOptions o;
    o.geometry = KVGeometry::Uniform(layers_, row_bytes_);
    o.host_page_tokens = page_tokens_;
    o.host_capacity_tokens = capacity_tokens_;
    o.max_context = max_context_;
    o.top_k = o.hot_slots = o.max_requests = 1;
    if (!config_path_.empty()) {
      std::vector<FlagKey> given;
      for (const auto& [flag, key] : {std::pair{"--layers", "geometry"},
                                      {"--row-bytes", "geometry"},
                                      {"--page-tokens", "host_page_tokens"},
                                      {"--capacity-tokens", "host_capacity_tokens"},
                                      {"--max-context", "max_context"}}) {
        if (app_->get_option(flag)->count() > 0) given.push_back({flag, key});
      }
      // The hot-cache keys are each process's manager's: checked as the library's defaults are.
      CacheOptions base = o;
      base.top_k = CacheOptions{}.top_k;
      base.hot_slots = CacheOptions{}.hot_slots;
      const StatusOr<ConfigFile> file = ReadConfigFile(config_path_, given, base);
      if (!file.ok()) {
        err << "sparsekv pool: " << file.status().message() << "\n";
        return kExitUsage;
      }
      o.geometry = file->options.geometry;
      o.host_page_tokens = file->options.host_page_tokens;
      o.host_capacity_tokens = file->options.host_capacity_tokens;
      o.max_context = file->options.max_context;
      out << "pool: --config " << config_path_ << ": node pool of " << o.geometry.num_layers()
          << " layers, " << o.geometry.token_stride_bytes() << " B per token, host_page_tokens "
          << o.host_page_tokens << ", host_capacity_tokens " << o.host_capacity_tokens
          << ", max_context " << o.max_context << " (its other keys are each process's manager's)"
          << std::endl;
    }
    NodePoolOptions node;
    node.name = node_pool_;
    node.directory = node_pool_dir_;
    node.max_processes = max_processes_;
    // What the segment needs of --node-pool-dir and of the memory, in the flags' words, before
    // anything is made (the library checks it too, naming its own fields).
    if (const StatusOr<int64_t> bytes = NodePoolBytes(o, max_owners_, node); bytes.ok()) {
      const std::string rows =
          config_path_.empty()
              ? "--capacity-tokens " + std::to_string(capacity_tokens_) + " x --layers " +
                    std::to_string(layers_) + " x --row-bytes " + std::to_string(row_bytes_)
              : "host_capacity_tokens " + std::to_string(o.host_capacity_tokens) + " x " +
                    std::to_string(o.geometry.token_stride_bytes()) + " B per token of --config " +
                    config_path_;
      const std::string sizing = "(" + rows + ", and the bookkeeping of --max-owners " +
                                 std::to_string(max_owners_) + " and --max-processes " +
                                 std::to_string(max_processes_) + ")";
      if (Status s = CheckSharedMemory(
              {.what = "node pool '" + node_pool_ + "'",
               .sizing = sizing,
               .bytes = *bytes,
               .remedy = "lower --capacity-tokens (or --layers, --row-bytes), or use a larger "
                         "--node-pool-dir (a tmpfs grows with mount -o remount,size=...)"},
              node_pool_dir_);
          !s.ok()) {
        err << "sparsekv pool: " << s.message() << "\n";
        return kExitFailure;
      }
    }
    auto created = CreateNodePool(o, max_owners_, node, CreateCpuBackend());
    if (created.status().code() == StatusCode::kInvalidArgument) {
      // A shape the pool cannot have (e.g. --max-context above --capacity-tokens, a bad name).
      fail("--node-pool '" + node_pool_ + "'", created.status());
      return kExitUsage;
    }
    if (!created.ok()) return fail("creating node pool '" + node_pool_ + "'", created.status());
    pool = *created;
    descriptor = DescribeNodePool(*pool).Serialize();
    serves = "node pool " + pool->node_pool_path() + " as region 0 (" +
             std::to_string(pool->total_pages()) + " pages of " + std::to_string(page_tokens_) +
             " tokens, " + std::to_string(pool->bytes()) + " bytes of rows)";
  }
  std::unique_ptr<PoolServerMetrics> metrics;
  if (metrics_port_ >= 0) {
    auto started = PoolServerMetrics::Start(metrics_host_, metrics_port_, pool.get(),
                                            memory == nullptr ? 0 : region_mib_ << 20);
    if (!started.ok()) return fail("serving metrics", started.status());
    metrics = std::move(started).value();
    out << "pool: metrics at " << metrics->url() << std::endl;
  }
  // The node pool's occupancy, printed when it changes.
  std::string occupancy;
  auto report_pool = [&](int32_t reclaimed) {
    if (metrics != nullptr) metrics->CountReclaimed(reclaimed);
    if (pool == nullptr) return;
    const std::string now = "free pages " + std::to_string(pool->free_pages()) + " of " +
                            std::to_string(pool->total_pages()) + ", free owners " +
                            std::to_string(pool->free_owners()) + " of " +
                            std::to_string(pool->max_owners()) + ", live processes " +
                            std::to_string(pool->live_processes());
    if (reclaimed > 0) {
      out << "pool: reclaimed " << reclaimed << " dead process(es)" << std::endl;
    }
    if (now != occupancy || reclaimed > 0) out << "pool: " << now << std::endl;
    occupancy = now;
  };
  auto plane = ControlPlane::Connect(plane_options);
  if (!plane.ok()) return fail("connecting to the control plane", plane.status());

  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  const std::string address = std::string(host) + " pid " + std::to_string(getpid());
  uint64_t incarnation = 0;
  if (auto registered = (*plane)->RegisterNode(node_id_, address, lease); registered.ok()) {
    incarnation = *registered;
  } else {
    // A live id is refused (AlreadyExists): the message names the id and who holds it.
    return fail("joining the pool as node '" + node_id_ + "'", registered.status());
  }
  if (Status s = (*plane)->PublishRegion(node_id_, incarnation, 0, descriptor); !s.ok()) {
    return fail("publishing region 0", s);
  }
  out << "pool: node " << node_id_ << " incarnation " << incarnation << " serves " << serves
      << " via " << control_plane_ << std::endl;
  report_pool(0);

  // Exit code once serving ends: kExitOk on a stop signal, kExitFailure if the id was taken.
  int code = kExitOk;
  bool region_published = true;  // false from a rejoin until region 0 is published again
  Clock::time_point next_heartbeat = Clock::now() + heartbeat_period;
  while (stop_requested == 0) {
    const auto wait =
        std::clamp(std::chrono::duration_cast<milliseconds>(next_heartbeat - Clock::now()),
                   milliseconds(0), heartbeat_period);
    if (transport != nullptr) {
      if (Status s = transport->WaitForEvents(wait); !s.ok()) {
        return fail("progressing the transport", s);
      }
    } else {
      poll(nullptr, 0, static_cast<int>(wait.count()));  // a stop signal ends it early
    }
    if (Clock::now() < next_heartbeat) continue;
    if (pool != nullptr) report_pool(pool->ReclaimDeadProcesses());
    next_heartbeat = Clock::now() + heartbeat_period;
    Status beat = (*plane)->Heartbeat(node_id_, incarnation, lease);
    if (beat.code() == StatusCode::kNotFound) {
      // The lease lapsed (the control plane was unreachable for longer than it, or restarted
      // without its data). The memory is unchanged, so rejoin as the same incarnation: records
      // naming it stay valid. Refused if another process took the id meanwhile.
      err << "sparsekv pool: lost membership (" << beat.ToString() << "); rejoining\n";
      beat = (*plane)->Rejoin(node_id_, incarnation, address, lease);
      region_published = false;  // it went with the lapsed membership
      if (beat.ok()) {
        out << "pool: node " << node_id_ << " rejoined as incarnation " << incarnation << std::endl;
        if (metrics != nullptr) metrics->CountRejoin();
      }
    }
    if (beat.ok() && !region_published) {
      beat = (*plane)->PublishRegion(node_id_, incarnation, 0, descriptor);
      region_published = beat.ok();
    }
    if (beat.code() == StatusCode::kFailedPrecondition ||
        beat.code() == StatusCode::kAlreadyExists) {
      err << "sparsekv pool: node id '" << node_id_ << "' was taken over by another process ("
          << beat.ToString() << "); incarnation " << incarnation << " stops serving\n";
      code = kExitFailure;
      break;
    }
    if (!beat.ok()) {
      err << "sparsekv pool: heartbeat failed: " << beat.ToString() << "\n";
      if (metrics != nullptr) metrics->CountHeartbeatFailure();
    }
    if (metrics != nullptr) metrics->Publish();
  }
  // Deregistered once, and only by the live member (an id taken over belongs to another).
  if (code == kExitOk) {
    if (Status s = (*plane)->Deregister(node_id_, incarnation); !s.ok()) {
      err << "sparsekv pool: deregistering: " << s.ToString() << "\n";
    }
  }
  if (transport != nullptr) {
    if (Status s = transport->UnregisterRegion(region); !s.ok()) {
      return fail("unregistering the region", s);
    }
  }
  if (pool != nullptr) {
    report_pool(pool->ReclaimDeadProcesses());
    pool.reset();  // detaches; the last process to detach removes the segment's file
  }
  out << "pool: node " << node_id_ << " incarnation " << incarnation << " stopped" << std::endl;
  return code;
}

}  // namespace sparsekv::tools
