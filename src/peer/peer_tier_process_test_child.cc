// peer_tier_process_test_child: the lending process of the peer tier's two-process test
// (peer_tier_process_test).
//
// It creates a PeerRegion of --rows rows per layer on CUDA device --device, writes --tokens rows
// of every layer from a seeded generator (testing::RandomRows with --seed, layer after layer,
// rows of --row-bytes bytes) at rows [0, --tokens), and prints "descriptor <N> <text>" (N counts
// the regions it created, from 1). With --redis-port it also registers as node --node-id and
// publishes the descriptor as its region 0 (ControlPlane::PublishRegion). On SIGUSR1 it destroys
// the region and lends a new one (a new generation) with the same rows; on SIGTERM it exits 0.
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>

#include "sparsekv/backend.h"
#include "sparsekv/control_plane.h"
#include "sparsekv/peer_tier.h"
#include "testing/harness.h"

namespace {

std::atomic<bool> stop{false};
std::atomic<bool> renew{false};

void Die(const std::string& what, const sparsekv::Status& s) {
  std::fprintf(stderr, "peer_tier_process_test_child: %s: %s\n", what.c_str(),
               s.ToString().c_str());
  std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  using namespace sparsekv;
  int device = 0, rows = 0, layers = 0, row_bytes = 0, tokens = 0, redis_port = 0;
  uint64_t seed = 1;
  std::string node_id = "lender", key_prefix = "sparsekv";
  // "--name value" pairs; the test is its only caller.
  const std::map<std::string, std::function<void(const std::string&)>> flags = {
      {"--device", [&](const std::string& v) { device = std::stoi(v); }},
      {"--rows", [&](const std::string& v) { rows = std::stoi(v); }},
      {"--layers", [&](const std::string& v) { layers = std::stoi(v); }},
      {"--row-bytes", [&](const std::string& v) { row_bytes = std::stoi(v); }},
      {"--tokens", [&](const std::string& v) { tokens = std::stoi(v); }},
      {"--seed", [&](const std::string& v) { seed = std::stoull(v); }},
      {"--redis-port", [&](const std::string& v) { redis_port = std::stoi(v); }},
      {"--node-id", [&](const std::string& v) { node_id = v; }},
      {"--key-prefix", [&](const std::string& v) { key_prefix = v; }},
  };
  for (int i = 1; i + 1 < argc; i += 2) {
    auto flag = flags.find(argv[i]);
    if (flag == flags.end()) {
      Die(std::string("unknown option ") + argv[i],
          InvalidArgument("see peer_tier_process_test_child.cc"));
    }
    flag->second(argv[i + 1]);
  }
  if (rows < 1 || layers < 1 || row_bytes < 1 || tokens < 1 || tokens > rows) {
    Die("options", InvalidArgument("--rows, --layers, --row-bytes and --tokens <= rows needed"));
  }
  signal(SIGTERM, [](int) { stop = true; });
  signal(SIGUSR1, [](int) { renew = true; });

  StatusOr<std::shared_ptr<Backend>> backend = CreateCudaBackend(device);
  if (!backend.ok()) Die("CreateCudaBackend", backend.status());
  const KVGeometry geometry = KVGeometry::Uniform(layers, row_bytes);
  std::vector<sparsekv::testing::Bytes> prompt;
  std::mt19937_64 rng(seed);
  for (int l = 0; l < layers; ++l)
    prompt.push_back(sparsekv::testing::RandomRows(rng, tokens, row_bytes));

  std::unique_ptr<ControlPlane> plane;
  uint64_t incarnation = 0;
  if (redis_port > 0) {
    ControlPlaneOptions o;
    o.port = redis_port;
    o.key_prefix = key_prefix;
    auto connected = ControlPlane::Connect(o);
    if (!connected.ok()) Die("ControlPlane::Connect", connected.status());
    plane = std::move(*connected);
    auto registered = plane->RegisterNode(node_id, "peer_lender", std::chrono::seconds(120));
    if (!registered.ok()) Die("RegisterNode", registered.status());
    incarnation = *registered;
  }

  std::unique_ptr<PeerRegion> region;
  for (int n = 1; !stop; ++n) {
    region.reset();  // the old region's header is cleared before a new one exists
    auto created = PeerRegion::Create(geometry, rows, *backend);
    if (!created.ok()) Die("PeerRegion::Create", created.status());
    region = std::move(*created);
    for (int l = 0; l < layers; ++l) {
      if (Status s = region->WriteRows(l, 0, prompt[l].data(), tokens, nullptr); !s.ok()) {
        Die("WriteRows", s);
      }
    }
    if (Status s = (*backend)->Synchronize(nullptr); !s.ok()) Die("Synchronize", s);
    const std::string text = region->descriptor().Serialize();
    if (plane != nullptr) {
      if (Status s = plane->PublishRegion(node_id, incarnation, 0, text); !s.ok()) {
        Die("PublishRegion", s);
      }
    }
    std::printf("descriptor %d %s\n", n, text.c_str());
    std::fflush(stdout);
    while (!stop && !renew) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    renew = false;
  }
  return 0;
}
