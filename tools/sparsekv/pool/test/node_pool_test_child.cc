// node_pool_test_child: the prefill and decode processes of the node-pool test (node_pool_test.cc).
// Real processes of one machine over a real control plane, sharing one node pool
// (sparsekv/node_pool.h); no transport is involved.
//
//   prefill  attaches to the node pool (with --serve NAME it creates it and serves it itself: it
//            registers as node --node-id and publishes the pool's descriptor as its region 0;
//            with --pool-node NODE it opens the pool that node, e.g. `sparsekv pool --node-pool`,
//            publishes), writes the prompt KV of its requests (rows from a seeded generator) into
//            pages of owners of its own, seals them and publishes each request's location (owner,
//            seal). Then, once a reader called Done, it releases the record and its pages. It
//            exits 0 once every request is released; records the control plane lost are reported
//            and given up (exit 3). With --hold-ms it stays attached that long after.
//   decode   binds each request, opens the node pool its location names (the first one found),
//            creates a SparseKVCacheManager over it (--backend cpu or cuda) and admits the
//            request from its sealed pages (AdmitFromNodePool: nothing copied but the window),
//            then calls Done at once: the hand-off is complete, its own references keep the
//            pages. A request whose seal ended or whose Done failed is reported failed (and
//            released). Each step (PlanStep, AppendToken and RunLayer per layer, FinishStep)
//            appends a new random token per request and selects --topk positions: a run of
//            adjacent prompt positions, some generated ones and random ones. Every delivered
//            entry (assembled row and hot-cache row) is checked byte for byte against the CPU
//            oracle (testing::DenseModel). Every third of the lease it reclaims dead processes.
//            On SIGTERM it releases every request, prints its counters and exits 0, or 1 if any
//            entry was wrong.
//
// Output (stdout, one line each, flushed): "published KEY generation G owner O seal S",
// "released KEY", "lost KEY: STATUS", "bound KEY generation G", "admitted KEY tokens T",
// "request KEY failed: STATUS", "finished KEY", "step S requests N", "reclaimed N", "WRONG ...",
// "stats bytes_ingested B copy_on_write_pages C misses M",
// "pool free_pages F total_pages T shared_pages S live_processes L".
#include <signal.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <csignal>
#include <cstring>
#include <iostream>
#include <map>
#include <random>
#include <thread>

#include "sparsekv/backend.h"
#include "sparsekv/control_plane.h"
#include "sparsekv/manager.h"
#include "sparsekv/node_pool.h"
#include "testing/harness.h"
#include "tools/sparsekv/pool/test/test_child.h"

namespace sparsekv::tools {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

using test_child::Check;
using test_child::OnStop;
using test_child::Request;
using test_child::StepBuffers;
using test_child::stop_requested;

struct Common {
  std::string host = "127.0.0.1";
  int port = 6379;
  std::string key_prefix = "sparsekv";
  int64_t lease_ms = 2000;
  int32_t layers = 4;
  int32_t tokens = 1000;
  int32_t row_bytes = 656;
  int32_t max_new_tokens = 512;       // generated tokens per request (the pool's max_context)
  std::vector<std::string> requests;  // "KEY:SEED"
};

std::vector<testing::Bytes> PromptLayers(const Common& c, uint64_t seed) {
  return test_child::PromptLayers(c.layers, c.tokens, c.row_bytes, seed);
}

std::unique_ptr<ControlPlane> ConnectOrDie(const Common& c) {
  ControlPlaneOptions o;
  o.host = c.host;
  o.port = c.port;
  o.key_prefix = c.key_prefix;
  return test_child::ConnectOrDie(o);
}

int RunPrefill(const Common& c, const std::string& node_id, const std::string& serve,
               const std::string& pool_node, int64_t hold_ms) {
  const std::vector<Request> requests = test_child::ParseRequests(c.requests);
  auto plane = ConnectOrDie(c);
  std::shared_ptr<Backend> backend = CreateCpuBackend();
  const milliseconds lease(c.lease_ms);
  std::shared_ptr<HostKVPool> pool;
  RequestLocation location;
  uint64_t own_incarnation = 0;
  if (!serve.empty()) {
    // This process creates the node pool and is the member that serves it.
    CacheOptions o;
    o.geometry = KVGeometry::Uniform(c.layers, c.row_bytes);
    o.top_k = o.hot_slots = o.max_requests = 1;  // unused: only the pool's shape counts
    o.host_page_tokens = 16;
    o.max_context = c.tokens + c.max_new_tokens;
    // Each request's prompt and a reader's generated tokens, twice over.
    o.host_capacity_tokens =
        int64_t{2} * (static_cast<int64_t>(requests.size()) + 2) * o.max_context;
    NodePoolOptions node;
    node.name = serve;
    auto created = CreateNodePool(o, 32, node, backend);
    Check(created.status(), "create node pool");
    pool = *created;
    auto incarnation = plane->RegisterNode(node_id, "prefill", lease);
    Check(incarnation.status(), "register node");
    own_incarnation = *incarnation;
    Check(plane->PublishRegion(node_id, own_incarnation, 0, DescribeNodePool(*pool).Serialize()),
          "publish region");
    location.node_id = node_id;
    location.node_incarnation = own_incarnation;
  } else {
    uint64_t incarnation = 0;
    auto descriptor = plane->GetRegion(pool_node, 0, &incarnation);
    Check(descriptor.status(), "node pool descriptor of " + pool_node);
    auto parsed = NodePoolDescriptor::Parse(*descriptor);
    Check(parsed.status(), "node pool descriptor");
    auto opened = OpenNodePool(parsed->path, NodePoolOptions(), backend);
    Check(opened.status(), "open node pool");
    pool = *opened;
    Check(pool->node_pool_id() == parsed->id ? Status::Ok()
                                             : Unavailable("the node pool was created again"),
          "open node pool");
    location.node_id = pool_node;
    location.node_incarnation = incarnation;
  }
  location.region_id = 0;
  location.row_bytes = c.row_bytes;
  location.layers = c.layers;
  location.tokens = c.tokens;

  struct Published {
    uint64_t generation;
    int32_t owner;
  };
  std::map<std::string, Published> published;  // until released
  for (const Request& r : requests) {
    auto owner = pool->AcquireOwner();
    Check(owner.status(), "acquire owner");
    Check(pool->Reserve(*owner, c.tokens), "reserve");
    const std::vector<testing::Bytes> rows = PromptLayers(c, r.seed);
    for (int32_t l = 0; l < c.layers; ++l) {
      Check(WritePromptLayer(*pool, *backend, *owner, l, rows[l].data(), c.tokens, nullptr),
            "write");
    }
    auto seal = pool->Seal(*owner, c.tokens);
    Check(seal.status(), "seal");
    location.node_pool_owner = *owner;
    location.node_pool_seal = *seal;
    auto generation = plane->Publish(r.key, location);
    Check(generation.status(), "publish " + r.key);
    published[r.key] = {*generation, *owner};
    std::cout << "published " << r.key << " generation " << *generation << " owner " << *owner
              << " seal " << *seal << std::endl;
  }

  int lost = 0;
  const auto period = lease / 4;
  while (!published.empty() && stop_requested == 0) {
    std::this_thread::sleep_for(std::min<milliseconds>(period, milliseconds(20)));
    if (own_incarnation != 0) {
      const Status beat = plane->Heartbeat(node_id, own_incarnation, lease);
      if (beat.code() == StatusCode::kFailedPrecondition) Check(beat, "heartbeat");
    }
    for (auto it = published.begin(); it != published.end();) {
      int64_t done = 0;
      const auto record = plane->Lookup(it->first, nullptr, &done);
      if (record.ok() && done > 0 && plane->Release(it->first, it->second.generation).ok()) {
        // No reader is bound any more: the pages are the readers' (by their references) or free.
        pool->Release(it->second.owner);
        pool->ReleaseOwner(it->second.owner);
        std::cout << "released " << it->first << std::endl;
        it = published.erase(it);
      } else if (record.status().code() == StatusCode::kNotFound) {
        std::cout << "lost " << it->first << ": " << record.status().ToString() << std::endl;
        ++lost;
        it = published.erase(it);
      } else {
        ++it;
      }
    }
  }
  const auto hold_until = Clock::now() + milliseconds(hold_ms);
  while (stop_requested == 0 && Clock::now() < hold_until) {
    std::this_thread::sleep_for(milliseconds(20));
    if (own_incarnation != 0) plane->Heartbeat(node_id, own_incarnation, lease).IgnoreError();
  }
  if (own_incarnation != 0) plane->Deregister(node_id, own_incarnation).IgnoreError();
  if (!published.empty()) return 1;
  return lost > 0 ? 3 : 0;
}

// Device (or host) memory -> a host vector, synchronously.
template <typename T>
std::vector<T> Download(Backend& backend, const void* src, size_t count) {
  std::vector<T> out(count);
  Check(backend.CopyAsync(out.data(), src, count * sizeof(T), nullptr), "download");
  Check(backend.Synchronize(nullptr), "download");
  return out;
}

struct Decoding {
  Request request;
  RequestId id = 0;
  bool admitted = false;
};

int RunDecode(const Common& c, const std::string& reader, const std::string& backend_name,
              int32_t top_k, int64_t step_ms) {
  const int32_t max_new_tokens = c.max_new_tokens;
  const std::vector<Request> requests = test_child::ParseRequests(c.requests);
  auto plane = ConnectOrDie(c);
  std::shared_ptr<Backend> backend;
  if (backend_name == "cuda") {
    auto cuda = CreateCudaBackend();
    Check(cuda.status(), "cuda backend");
    backend = *cuda;
  } else {
    backend = CreateCpuBackend();
  }
  const milliseconds lease(c.lease_ms);
  std::shared_ptr<HostKVPool> pool;
  std::unique_ptr<SparseKVCacheManager> manager;
  CacheOptions o;
  o.top_k = top_k;
  o.hot_slots = 2 * top_k;
  o.window = 16;
  o.max_requests = static_cast<int32_t>(requests.size());
  // The step schedule may then prefetch the next layer's rows and copy one request at a time.
  o.copy_chunk_rows = 1;
  o.max_prefetch = top_k;
  std::unique_ptr<testing::DenseModel> oracle;

  std::vector<Decoding> decoding;
  for (size_t r = 0; r < requests.size(); ++r) {
    Decoding& d = decoding.emplace_back();
    d.request = requests[r];
    d.id = r + 1;
    auto fail = [&](const Status& s) {
      std::cout << "request " << d.request.key << " failed: " << s.ToString() << std::endl;
    };
    auto binding = plane->Bind(d.request.key, reader, lease);
    if (!binding.ok()) {
      fail(binding.status());
      continue;
    }
    const RequestLocation& l = binding->location;
    std::cout << "bound " << d.request.key << " generation " << binding->generation << std::endl;
    Status admitted = Status::Ok();
    uint64_t incarnation = 0;
    auto descriptor = plane->GetRegion(l.node_id, l.region_id, &incarnation);
    if (descriptor.ok() && incarnation != l.node_incarnation) {
      descriptor = Unavailable("node " + l.node_id + " restarted since the request was published");
    }
    StatusOr<NodePoolDescriptor> parsed =
        descriptor.ok() ? NodePoolDescriptor::Parse(*descriptor) : descriptor.status();
    if (!parsed.ok()) {
      admitted = parsed.status();
    } else if (pool == nullptr) {
      auto opened = OpenNodePool(parsed->path, NodePoolOptions(), backend);
      Check(opened.status(), "open node pool " + parsed->path);
      pool = *opened;
      UseNodePoolShape(*pool, o);
      auto created = SparseKVCacheManager::Create(o, backend, pool);
      Check(created.status(), "manager");
      manager = std::move(created).value();
      oracle = std::make_unique<testing::DenseModel>(o.geometry);
    }
    if (admitted.ok() && parsed->id != pool->node_pool_id()) {
      admitted = FailedPrecondition("the request is in another node pool");
    }
    if (admitted.ok()) {
      admitted = AdmitFromNodePool(*manager, d.id, {l.node_pool_owner, l.node_pool_seal},
                                   max_new_tokens, nullptr);
    }
    // The hand-off ends here: from now on the request's own page references keep its rows. Done
    // OK proves the record was live and of this generation while they were taken.
    const Status done = plane->Done(d.request.key, reader, binding->generation);
    if (admitted.ok() && !done.ok()) {
      Check(manager->Release(d.id), "release");
      admitted = done;
    }
    if (!admitted.ok()) {
      fail(admitted);
      continue;
    }
    d.admitted = true;
    oracle->Add(d.id, PromptLayers(c, d.request.seed), l.tokens);
    std::cout << "admitted " << d.request.key << " tokens " << l.tokens << std::endl;
  }

  bool wrong = false;
  if (manager != nullptr) {
    const int32_t max_batch = o.effective_max_batch();
    StepBuffers buffers(*backend, c.layers, max_batch, top_k, c.row_bytes);
    const std::unique_ptr<StepSchedule> schedule = test_child::MakeSchedule(*manager);
    const size_t stride = buffers.stride, entries = buffers.entries;
    std::mt19937_64 rng(42);
    auto next_reclaim = Clock::now() + lease / 3;
    for (int64_t step = 1; stop_requested == 0; ++step) {
      const auto step_end = Clock::now() + milliseconds(step_ms);
      std::vector<Decoding*> batch;
      std::vector<RequestId> ids;
      for (Decoding& d : decoding) {
        if (d.admitted && *manager->SequenceLength(d.id) == c.tokens + max_new_tokens) {
          std::cout << "finished " << d.request.key << std::endl;
          Check(manager->Release(d.id), "release");
          oracle->Remove(d.id);
          d.admitted = false;
        }
        if (!d.admitted) continue;
        batch.push_back(&d);
        ids.push_back(d.id);
      }
      if (!batch.empty()) {
        const std::vector<std::vector<int32_t>> picks = test_child::RunStep(
            *manager, *schedule, *backend, *oracle, ids, c.tokens, rng, buffers);
        for (int32_t l = 0; l < c.layers; ++l) {
          const auto got_slots = Download<int32_t>(*backend, buffers.slots[l]->get(), entries);
          const auto got_rows =
              Download<std::byte>(*backend, buffers.assembled[l]->get(), entries * stride);
          const auto hot =
              Download<std::byte>(*backend, manager->HotLayer(l), manager->HotLayerRows() * stride);
          for (size_t b = 0; b < batch.size(); ++b) {
            int bad = 0;
            for (int32_t k = 0; k < top_k; ++k) {
              const size_t i = b * top_k + k;
              const int32_t p = picks[l][i];
              const std::byte* row = got_rows.data() + i * stride;
              if (p < 0) {
                bad += got_slots[i] != -1 || std::any_of(row, row + stride, [](std::byte x) {
                         return x != std::byte{0};
                       });
                continue;
              }
              const std::byte* want = oracle->Row(ids[b], l, p);
              bad += got_slots[i] < 0 || std::memcmp(row, want, stride) != 0 ||
                     std::memcmp(hot.data() + static_cast<size_t>(got_slots[i]) * stride, want,
                                 stride) != 0;
            }
            if (bad > 0) {
              wrong = true;
              std::cout << "WRONG request " << batch[b]->request.key << " step " << step
                        << " layer " << l << ": " << bad << " entries" << std::endl;
            }
          }
        }
      }
      if (Clock::now() >= next_reclaim) {
        next_reclaim = Clock::now() + lease / 3;
        if (const int32_t n = pool->ReclaimDeadProcesses(); n > 0) {
          std::cout << "reclaimed " << n << std::endl;
        }
      }
      std::cout << "step " << step << " requests " << batch.size() << std::endl;
      std::this_thread::sleep_until(step_end);
    }
    auto stats = manager->ReadStats(nullptr);
    Check(stats.status(), "stats");
    for (Decoding& d : decoding) {
      if (d.admitted) Check(manager->Release(d.id), "release");
    }
    std::cout << "stats bytes_ingested " << stats->bytes_ingested << " copy_on_write_pages "
              << stats->copy_on_write_pages << " misses " << stats->total.misses << std::endl;
    manager.reset();
    std::cout << "pool free_pages " << pool->free_pages() << " total_pages " << pool->total_pages()
              << " shared_pages " << pool->shared_pages() << " live_processes "
              << pool->live_processes() << std::endl;
  } else {
    while (stop_requested == 0) std::this_thread::sleep_for(milliseconds(step_ms));
  }
  return wrong ? 1 : 0;
}

}  // namespace
}  // namespace sparsekv::tools

int main(int argc, char** argv) {
  using namespace sparsekv::tools;
  CLI::App app("node_pool_test_child: prefill and decode processes of the node-pool test");
  app.require_subcommand(1);
  Common c;
  std::string control_plane = "127.0.0.1:6379";
  auto add_common = [&](CLI::App* sub) {
    sub->add_option("--control-plane", control_plane)->required();
    sub->add_option("--key-prefix", c.key_prefix);
    sub->add_option("--lease-ms", c.lease_ms);
    sub->add_option("--layers", c.layers);
    sub->add_option("--tokens", c.tokens);
    sub->add_option("--row-bytes", c.row_bytes);
    sub->add_option("--max-new-tokens", c.max_new_tokens);
    sub->add_option("--request", c.requests, "KEY:SEED")->required();
  };
  CLI::App* prefill = app.add_subcommand("prefill");
  add_common(prefill);
  std::string node_id = "prefill", serve, pool_node;
  int64_t hold_ms = 0;
  prefill->add_option("--node-id", node_id);
  prefill->add_option("--serve", serve, "create the node pool NAME and serve it as --node-id");
  prefill->add_option("--pool-node", pool_node, "open the node pool this node serves");
  prefill->add_option("--hold-ms", hold_ms, "stay attached this long once every request is done");
  CLI::App* decode = app.add_subcommand("decode");
  add_common(decode);
  std::string reader = "decode", backend = "cpu";
  int32_t top_k = 64;
  int64_t step_ms = 20;
  decode->add_option("--reader", reader);
  decode->add_option("--backend", backend)->check(CLI::IsMember({"cpu", "cuda"}));
  decode->add_option("--topk", top_k);
  decode->add_option("--step-ms", step_ms);
  CLI11_PARSE(app, argc, argv);

  const size_t colon = control_plane.rfind(':');
  c.host = control_plane.substr(0, colon);
  c.port = std::stoi(control_plane.substr(colon + 1));
  signal(SIGTERM, OnStop);
  if (prefill->parsed()) {
    if (serve.empty() == pool_node.empty()) {
      std::cerr << "prefill: give one of --serve and --pool-node" << std::endl;
      return 2;
    }
    return RunPrefill(c, node_id, serve, pool_node, hold_ms);
  }
  return RunDecode(c, reader, backend, top_k, step_ms);
}
