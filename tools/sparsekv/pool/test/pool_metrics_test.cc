// `sparsekv pool --node-pool --metrics-port 0`, scraped over HTTP (a plain GET): every metric
// docs/metrics.md documents for a pool server and a node pool is there, typed as documented, and
// the occupancy follows what another process holds in the pool, published at each heartbeat.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "sparsekv/node_pool.h"
#include "testing/prometheus_scrape.h"
#include "tools/sparsekv/pool/test/processes_fixture.h"

namespace sparsekv {
namespace {

using testing::Count;
using testing::Exposition;
using testing::Subprocess;
using testing::WaitUntil;

class PoolMetricsTest : public testing::ProcessesTest {
 protected:
  PoolMetricsTest() : ProcessesTest("pool-metrics") {}

  void SetUp() override {
    ProcessesTest::SetUp();
    segment_ = "sparsekv-metrics-test-" + std::to_string(getpid());
  }
  void TearDown() override {
    ProcessesTest::TearDown();
    std::error_code ignored;
    std::filesystem::remove("/dev/shm/" + segment_, ignored);
  }

  // The port of the log's "pool: metrics at http://127.0.0.1:PORT/metrics" line (0 if none).
  int MetricsPort() {
    const std::string log = Log("pool");
    const std::string prefix = "pool: metrics at http://127.0.0.1:";
    const size_t at = log.find(prefix);
    return at == std::string::npos ? 0 : std::stoi(log.substr(at + prefix.size()));
  }

  // `sparsekv pool` serving node pool `segment` (1024 tokens of 2 layers) as `node_id`, metrics
  // at 127.0.0.1:`port` (0: a free one), with `extra` flags.
  std::vector<std::string> NodePoolServer(const std::string& node_id, const std::string& segment,
                                          const std::string& port,
                                          std::vector<std::string> extra = {}) {
    std::vector<std::string> args = {SPARSEKV_TOOL,       "pool",
                                     "--node-id",         node_id,
                                     "--control-plane",   ControlPlaneAddress(),
                                     "--key-prefix",      key_prefix_,
                                     "--node-pool",       segment,
                                     "--capacity-tokens", "1024",
                                     "--max-context",     "256",
                                     "--layers",          "2",
                                     "--metrics-port",    port,
                                     "--metrics-host",    "127.0.0.1"};
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  }

  std::string segment_;
};

TEST_F(PoolMetricsTest, ServesThePoolServersAndTheNodePoolsMetrics) {
  Subprocess* pool = Start("pool", NodePoolServer("metrics-node", segment_, "0",
                                                  {"--lease-ms", "300", "--row-bytes", "64",
                                                   "--page-tokens", "16", "--max-owners", "8"}));
  ASSERT_NE(pool, nullptr);
  ASSERT_TRUE(WaitForLog("pool", "serves node pool"));
  const int port = MetricsPort();
  ASSERT_GT(port, 0) << Log("pool");

  auto scrape = [&] {
    auto body = testing::HttpGet(port, "/metrics");
    EXPECT_TRUE(body.ok()) << body.status().ToString();
    auto parsed = testing::ParseExposition(body.ok() ? *body : "");
    EXPECT_TRUE(parsed.ok()) << parsed.status().ToString();
    return parsed.ok() ? *parsed : Exposition{};
  };
  const Exposition e = scrape();
  const auto documented = testing::ReadDocumentedMetrics(SPARSEKV_SOURCE_DIR "/docs/metrics.md");
  int checked = 0;
  for (const testing::DocumentedMetric& m : documented) {
    if (m.source != "pool server" && m.source != "node pool" && m.source != "pool") continue;
    ASSERT_TRUE(e.types.contains(m.name)) << m.name << " not scraped";
    EXPECT_EQ(e.types.at(m.name), m.type) << m.name;
    ++checked;
  }
  EXPECT_GE(checked, 9);
  EXPECT_EQ(e.samples.at("sparsekv_host_pool_capacity_pages"), 64);
  EXPECT_EQ(e.samples.at("sparsekv_host_pool_used_pages"), 0);
  EXPECT_EQ(e.samples.at("sparsekv_host_pool_capacity_bytes"), 1024 * 2 * 64);
  EXPECT_EQ(e.samples.at("sparsekv_host_pool_capacity_owners"), 8);
  EXPECT_EQ(e.samples.at("sparsekv_node_pool_live_processes"), 1);
  EXPECT_EQ(e.samples.at("sparsekv_pool_server_region_bytes"), 0);
  EXPECT_EQ(e.samples.at("sparsekv_pool_server_heartbeat_failures_total"), 0);
  EXPECT_GT(e.samples.at("sparsekv_pool_server_start_time_seconds"), 1.7e9);
  // A pool server has no manager: none of a manager's metrics.
  EXPECT_FALSE(e.types.contains("sparsekv_topk_lookups_total"));

  // This process attaches and holds pages of 3 x 16 tokens: the next heartbeat publishes them.
  auto attached = OpenNodePool("/dev/shm/" + segment_, {}, CreateCpuBackend());
  ASSERT_TRUE(attached.ok()) << attached.status().ToString();
  auto owner = (*attached)->AcquireOwner();
  ASSERT_TRUE(owner.ok());
  ASSERT_TRUE((*attached)->Reserve(*owner, 40).ok());
  ASSERT_TRUE(WaitUntil(
      [&] {
        const Exposition now = scrape();
        return now.samples.contains("sparsekv_host_pool_used_pages") &&
               now.samples.at("sparsekv_host_pool_used_pages") == 3 &&
               now.samples.at("sparsekv_host_pool_used_owners") == 1 &&
               now.samples.at("sparsekv_node_pool_live_processes") == 2;
      },
      kDeadline, std::chrono::milliseconds(50)));
  (*attached)->Release(*owner);
  (*attached)->ReleaseOwner(*owner);
  attached->reset();

  EXPECT_EQ(Terminate(pool), 0);
}

// The control plane goes away and comes back empty: the failed heartbeats and the rejoin are
// counted.
TEST_F(PoolMetricsTest, CountsHeartbeatFailuresAndTheRejoin) {
  Subprocess* pool = Start("pool", NodePoolServer("metrics-hb", segment_, "0",
                                                  {"--lease-ms", "300", "--timeout-ms", "200"}));
  ASSERT_NE(pool, nullptr);
  ASSERT_TRUE(WaitForLog("pool", "serves node pool"));
  const int port = MetricsPort();
  ASSERT_GT(port, 0);
  auto counter = [&](const std::string& name) {
    auto body = testing::HttpGet(port, "/metrics");
    if (!body.ok()) return -1.0;
    auto e = testing::ParseExposition(*body);
    return e.ok() && e->samples.contains(name) ? e->samples.at(name) : -1.0;
  };
  EXPECT_EQ(counter("sparsekv_pool_server_heartbeat_failures_total"), 0);
  redis_->Stop();
  ASSERT_TRUE(
      WaitUntil([&] { return counter("sparsekv_pool_server_heartbeat_failures_total") >= 1; },
                kDeadline, std::chrono::milliseconds(50)))
      << Log("pool");
  ASSERT_TRUE(redis_->Restart().ok());
  ASSERT_TRUE(WaitUntil([&] { return counter("sparsekv_pool_server_rejoins_total") == 1; },
                        kDeadline, std::chrono::milliseconds(50)))
      << Log("pool");
  EXPECT_EQ(Terminate(pool), 0);
}

// A UCX region server shows its region's size and no pool.
TEST_F(PoolMetricsTest, AUcxRegionServerShowsItsRegion) {
  Subprocess* pool =
      Start("pool", {SPARSEKV_TOOL, "pool", "--node-id", "metrics-ucx", "--control-plane",
                     ControlPlaneAddress(), "--key-prefix", key_prefix_, "--region-mib", "4",
                     "--transports", "tcp", "--net-devices", "lo", "--metrics-port", "0",
                     "--metrics-host", "127.0.0.1"});
  ASSERT_NE(pool, nullptr);
  ASSERT_TRUE(WaitUntil(
      [&] { return Count(Log("pool"), "serves region 0") > 0 || !pool->Running(); }, kDeadline));
  if (Count(Log("pool"), "built without") > 0) GTEST_SKIP() << Log("pool");
  ASSERT_EQ(Count(Log("pool"), "serves region 0"), 1) << Log("pool");
  auto body = testing::HttpGet(MetricsPort(), "/metrics");
  ASSERT_TRUE(body.ok()) << body.status().ToString();
  auto e = testing::ParseExposition(*body);
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->samples.at("sparsekv_pool_server_region_bytes"), 4 << 20);
  EXPECT_FALSE(e->types.contains("sparsekv_host_pool_capacity_pages"));
  EXPECT_EQ(Terminate(pool), 0);
}

TEST_F(PoolMetricsTest, APortInUseIsRefusedAtOnce) {
  Subprocess* first = Start("pool", NodePoolServer("metrics-a", segment_, "0"));
  ASSERT_NE(first, nullptr);
  ASSERT_TRUE(WaitForLog("pool", "serves node pool"));
  const int port = MetricsPort();
  ASSERT_GT(port, 0);
  Subprocess* second =
      Start("second", NodePoolServer("metrics-b", segment_ + "-b", std::to_string(port)));
  ASSERT_NE(second, nullptr);
  auto code = second->WaitFor(kDeadline);
  ASSERT_TRUE(code.ok());
  EXPECT_NE(*code, 0);
  EXPECT_NE(Log("second").find("serving metrics"), std::string::npos) << Log("second");
  EXPECT_EQ(Terminate(first), 0);
  std::error_code ignored;
  std::filesystem::remove("/dev/shm/" + segment_ + "-b", ignored);
}

TEST_F(PoolMetricsTest, BadMetricsFlagsAreUsageErrors) {
  struct Case {
    std::vector<std::string> flags;
    std::string message;
  };
  for (const Case& c : std::vector<Case>{
           {{"--metrics-host", "127.0.0.1"}, "--metrics-host requires --metrics-port"},
           {{"--metrics-port", "65536"}, "--metrics-port"},
           {{"--metrics-port", "-1"}, "--metrics-port"},
           {{"--metrics-port", "0", "--metrics-host", ""}, "--metrics-host"}}) {
    std::vector<std::string> argv = {SPARSEKV_TOOL, "pool", "--node-id", "metrics-usage"};
    argv.insert(argv.end(), c.flags.begin(), c.flags.end());
    const std::string name = "usage-" + std::to_string(logs_.size());
    Subprocess* process = Start(name, argv);
    ASSERT_NE(process, nullptr);
    auto code = process->WaitFor(kDeadline);
    ASSERT_TRUE(code.ok());
    EXPECT_EQ(*code, 2) << Log(name);
    EXPECT_NE(Log(name).find(c.message), std::string::npos) << Log(name);
  }
}

}  // namespace
}  // namespace sparsekv
