// scale_out_test_child: the prefill and decode processes of the multi-process scale-out test
// (scale_out_test.cc). Real processes over a real control plane and UCX:
//
//   prefill  writes the prompt KV of its requests (rows from a seeded generator, layer-major:
//            row (l, p) at base + l * tokens * row_bytes + p * row_bytes) into its own registered
//            region (it is then a member itself) or, with --pool, into a pool server's region by
//            one-sided writes; publishes each request's location; then progresses its transport
//            until every request is released: once a reader called Done, it retries Release
//            until no reader is bound. A record the control plane lost (a restart without its
//            data) is reported and given up.
//   decode   decodes through SparseKVCacheManager (CPU backend) with a RemoteTier: per request,
//            Bind (control plane) -> RemoteTier::ImportRegion(node, descriptor) -> AdmitRemote,
//            so its prompt stays where prefill wrote it. Each step (PlanStep, AppendToken and
//            RunLayer per layer, FinishStep) appends a new random token per request (written
//            locally) and selects --topk positions: a run of adjacent prompt positions, a few
//            generated ones and random ones, so misses read remote prompt rows (merged) and local
//            rows. Every delivered entry (assembled row and hot-cache row) is checked byte for
//            byte against the CPU oracle (testing::DenseModel). A request whose remote reads fail
//            fails through RemoteStatus; it stays in the batch for one more step, in which every
//            entry must be skipped (-1, zero row), and is then released; the others go on. On
//            SIGTERM it releases every request from the manager, calls Done, prints the remote
//            tier's counters and exits 0, or 1 if any entry was wrong.
//
// Output (stdout, one line each, flushed): "published KEY generation G", "released KEY",
// "lost KEY: STATUS" (the control plane lost the record; prefill then exits 3),
// "renewal of KEY failed, retrying: STATUS",
// "bound KEY generation G node N", "admitted KEY tokens T", "step S healthy H failed F",
// "request KEY failed: STATUS", "request KEY skipped in step S", "finished KEY",
// "done KEY: STATUS", "WRONG request KEY step S layer L: ...",
// "remote rows_fetched N rows_staged N reads N transfers N failed_requests N".
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
#include "sparsekv/remote_tier.h"
#include "sparsekv/transport.h"
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
  std::string transports = "tcp";
  int64_t lease_ms = 2000;
  int64_t timeout_ms = 1000;
  int32_t layers = 4;
  int32_t tokens = 1024;
  int32_t row_bytes = 656;
  std::vector<std::string> requests;  // "KEY:SEED"
};

std::vector<testing::Bytes> PromptLayers(const Common& c, uint64_t seed) {
  return test_child::PromptLayers(c.layers, c.tokens, c.row_bytes, seed);
}

uint64_t RequestBytes(const Common& c) {
  return static_cast<uint64_t>(c.layers) * c.tokens * c.row_bytes;
}

std::unique_ptr<ControlPlane> ConnectOrDie(const Common& c) {
  ControlPlaneOptions o;
  o.host = c.host;
  o.port = c.port;
  o.key_prefix = c.key_prefix;
  o.connect_timeout = o.command_timeout = milliseconds(c.timeout_ms);
  return test_child::ConnectOrDie(o);
}

std::unique_ptr<Transport> TransportOrDie(const Common& c) {
  UcxTransportOptions o;
  o.transports = c.transports;
  if (c.transports == "tcp") o.net_devices = "lo";
  o.operation_timeout = milliseconds(c.timeout_ms);
  auto transport = CreateUcxTransport(o);
  Check(transport.status(), "transport");
  return std::move(transport).value();
}

int RunPrefill(const Common& c, const std::string& node_id, const std::string& pool,
               uint64_t pool_offset, int64_t release_deadline_ms) {
  const std::vector<Request> requests = test_child::ParseRequests(c.requests);
  auto plane = ConnectOrDie(c);
  auto transport = TransportOrDie(c);
  const uint64_t request_bytes = RequestBytes(c);
  std::vector<std::byte> memory(request_bytes * requests.size());
  for (size_t r = 0; r < requests.size(); ++r) {
    const auto layers = PromptLayers(c, requests[r].seed);
    for (int32_t l = 0; l < c.layers; ++l) {
      std::copy(layers[l].begin(), layers[l].end(),
                memory.begin() + r * request_bytes + l * layers[l].size());
    }
  }
  auto region = transport->RegisterRegion(memory.data(), memory.size());
  Check(region.status(), "register");
  const milliseconds lease(c.lease_ms);

  RequestLocation location;
  location.region_id = 0;
  location.layer_stride = static_cast<uint64_t>(c.tokens) * c.row_bytes;
  location.row_stride = c.row_bytes;
  location.row_bytes = c.row_bytes;
  location.layers = c.layers;
  location.tokens = c.tokens;
  uint64_t own_incarnation = 0;
  std::string own_descriptor;
  bool own_region_published = true;
  if (pool.empty()) {
    // The rows stay in this process: it is a member serving its own region.
    auto incarnation = plane->RegisterNode(node_id, "prefill", lease);
    Check(incarnation.status(), "register node");
    own_incarnation = *incarnation;
    auto descriptor = transport->ExportRegion(*region);
    Check(descriptor.status(), "export");
    own_descriptor = *descriptor;
    Check(plane->PublishRegion(node_id, own_incarnation, 0, own_descriptor), "publish region");
    location.node_id = node_id;
    location.node_incarnation = own_incarnation;
  } else {
    uint64_t incarnation = 0;
    auto descriptor = plane->GetRegion(pool, 0, &incarnation);
    Check(descriptor.status(), "pool region");
    auto remote = transport->ImportRegion(*descriptor);
    Check(remote.status(), "import");
    const CopyRange all{pool_offset, 0, memory.size()};
    auto write = transport->Write(*remote, *region, std::span(&all, 1));
    Check(write.status(), "write");
    Check(write->Wait(), "write");
    location.node_id = pool;
    location.node_incarnation = incarnation;
  }
  std::map<std::string, uint64_t> published;  // key -> generation, until released
  for (size_t r = 0; r < requests.size(); ++r) {
    location.base_offset = (pool.empty() ? 0 : pool_offset) + r * request_bytes;
    auto generation = plane->Publish(requests[r].key, location);
    Check(generation.status(), "publish " + requests[r].key);
    published[requests[r].key] = *generation;
    std::cout << "published " << requests[r].key << " generation " << *generation << std::endl;
  }

  // Serve (own region) and release each request once its reader is done.
  const auto deadline = Clock::now() + milliseconds(release_deadline_ms);
  const milliseconds period = lease / 4;
  int lost = 0;
  while (!published.empty() && stop_requested == 0 && Clock::now() < deadline) {
    Check(transport->WaitForEvents(period), "progress");
    if (pool.empty()) {
      // A lapsed lease (the control plane was away, or restarted) is rejoined as the same
      // incarnation, since the memory is unchanged; an unreachable control plane is retried.
      Status beat = plane->Heartbeat(node_id, own_incarnation, lease);
      if (beat.code() == StatusCode::kNotFound) {
        beat = plane->Rejoin(node_id, own_incarnation, "prefill", lease);
        if (beat.code() == StatusCode::kAlreadyExists ||
            beat.code() == StatusCode::kFailedPrecondition) {
          Check(beat, "rejoin");  // another process took the id
        }
        own_region_published = false;
      } else if (beat.code() != StatusCode::kUnavailable &&
                 beat.code() != StatusCode::kDeadlineExceeded) {
        Check(beat, "heartbeat");
      }
      if (beat.ok() && !own_region_published) {
        own_region_published =
            plane->PublishRegion(node_id, own_incarnation, 0, own_descriptor).ok();
      }
    }
    for (auto it = published.begin(); it != published.end();) {
      // The hand-off: keep the rows until the reader is done with them (Release also waits
      // for any reader still bound).
      int64_t done = 0;
      const auto record = plane->Lookup(it->first, nullptr, &done);
      if (record.ok() && done > 0 && plane->Release(it->first, it->second).ok()) {
        std::cout << "released " << it->first << std::endl;
        it = published.erase(it);
      } else if (record.status().code() == StatusCode::kNotFound ||
                 (record.ok() && record->generation != it->second)) {
        // The control plane lost the record (it restarted without its data): no release will
        // ever succeed. The rows may be reused once a binding lease has passed, since every
        // reader's next renewal fails.
        std::cout << "lost " << it->first << ": " << record.status().ToString() << std::endl;
        ++lost;
        it = published.erase(it);
      } else {
        ++it;
      }
    }
  }
  if (pool.empty()) plane->Deregister(node_id, own_incarnation).IgnoreError();
  if (!published.empty()) return 1;
  return lost > 0 ? 3 : 0;
}

// One request of the decode process.
struct Decoding {
  Request request;
  RequestId id = 0;
  Binding binding;
  bool bound = false;     // Bind succeeded: Done is owed
  bool admitted = false;  // live in the manager
  bool failed = false;
  // Until when the binding is surely live (steady clock): lease after the start of the last
  // renewal that succeeded. Reading stops there if no renewal succeeds before.
  Clock::time_point bound_until;
};

// How one request's entries of one layer came back.
struct LayerCheck {
  int exact = 0;    // slot >= 0, the row (assembled and in the hot cache) equals the oracle's
  int skipped = 0;  // slot -1 with a zero assembled row (the request failed)
  int wrong = 0;    // anything else: a wrong, stale or missing row
};

LayerCheck CheckEntries(const SparseKVCacheManager& manager, const testing::DenseModel& oracle,
                        RequestId id, int32_t layer, const int32_t* topk, const int32_t* slots,
                        const std::byte* assembled) {
  const LayerShape shape = manager.options().geometry.layers[layer];
  const std::vector<std::byte> zero(static_cast<size_t>(shape.row_bytes));
  LayerCheck check;
  for (int32_t k = 0; k < manager.options().top_k; ++k) {
    const std::byte* row = assembled + static_cast<size_t>(k) * shape.row_stride;
    if (slots[k] < 0) {
      const bool blank = std::memcmp(row, zero.data(), zero.size()) == 0;
      if (!blank) {
        ++check.wrong;
      } else if (topk[k] >= 0) {
        ++check.skipped;  // a selected position: only a failed request's may be skipped
      }
      continue;
    }
    if (topk[k] < 0) {
      ++check.wrong;  // a slot for padding
      continue;
    }
    // The CPU backend's device memory is host memory: the hot cache is readable here.
    const std::byte* want = oracle.Row(id, layer, topk[k]);
    const std::byte* hot =
        manager.HotLayer(layer) + static_cast<size_t>(slots[k]) * shape.row_stride;
    const bool exact = std::memcmp(row, want, shape.row_bytes) == 0 &&
                       std::memcmp(hot, want, shape.row_bytes) == 0;
    (exact ? check.exact : check.wrong) += 1;
  }
  return check;
}

int RunDecode(const Common& c, const std::string& reader, int32_t top_k, int32_t max_new_tokens,
              int64_t step_ms) {
  const std::vector<Request> requests = test_child::ParseRequests(c.requests);
  auto plane = ConnectOrDie(c);
  auto transport = TransportOrDie(c);
  auto created_tier = RemoteTier::Create(transport.get());
  Check(created_tier.status(), "remote tier");
  const std::unique_ptr<RemoteTier> tier = std::move(created_tier).value();
  const milliseconds lease(c.lease_ms);

  CacheOptions o;
  o.geometry = KVGeometry::Uniform(c.layers, c.row_bytes);
  o.top_k = top_k;
  o.hot_slots = 2 * top_k;
  o.window = 16;
  o.host_page_tokens = 16;
  o.max_requests = static_cast<int32_t>(requests.size());
  o.max_context = c.tokens + max_new_tokens;
  // The step schedule may then prefetch the next layer's rows and copy one request at a time.
  o.copy_chunk_rows = 1;
  o.max_prefetch = top_k;
  // Remote prompt pages take no host memory; this is room for every request's whole context.
  o.host_capacity_tokens = int64_t{o.max_requests + 1} * (o.max_context + o.host_page_tokens);
  std::shared_ptr<Backend> backend = CreateCpuBackend();
  auto created = SparseKVCacheManager::Create(o, backend);
  Check(created.status(), "manager");
  const std::unique_ptr<SparseKVCacheManager> manager = std::move(created).value();
  Check(AttachRemoteTier(*manager, tier.get()), "attach remote tier");
  testing::DenseModel oracle(o.geometry);

  std::vector<Decoding> decoding;
  auto fail = [&](Decoding& d, const Status& s) {
    d.failed = true;
    std::cout << "request " << d.request.key << " failed: " << s.ToString() << std::endl;
  };
  // Bind -> import the region -> AdmitRemote: the prompt stays where prefill wrote it.
  for (size_t r = 0; r < requests.size(); ++r) {
    Decoding& d = decoding.emplace_back();
    d.request = requests[r];
    d.id = r + 1;
    const auto bind_start = Clock::now();
    auto binding = plane->Bind(d.request.key, reader, lease);
    if (!binding.ok()) {
      fail(d, binding.status());
      continue;
    }
    d.bound = true;
    d.bound_until = bind_start + lease;
    d.binding = *binding;
    const RequestLocation& l = d.binding.location;
    std::cout << "bound " << d.request.key << " generation " << d.binding.generation << " node "
              << l.node_id << std::endl;
    uint64_t incarnation = 0;
    auto descriptor = plane->GetRegion(l.node_id, l.region_id, &incarnation);
    if (descriptor.ok() && incarnation != l.node_incarnation) {
      descriptor = Unavailable("node restarted since the request was published");
    }
    if (!descriptor.ok()) {
      fail(d, descriptor.status());
      continue;
    }
    auto region = tier->ImportRegion(l.node_id, *descriptor);
    if (!region.ok()) {
      fail(d, region.status());
      continue;
    }
    RemotePromptLayout layout;
    layout.base_offset = l.base_offset;
    layout.layer_stride = l.layer_stride;
    layout.row_stride = l.row_stride;
    layout.row_bytes = l.row_bytes;
    layout.layers = l.layers;
    layout.tokens = l.tokens;
    const Status admitted = AdmitRemote(*manager, d.id, *region, layout, max_new_tokens, nullptr);
    if (!admitted.ok()) {
      fail(d, admitted);
      continue;
    }
    d.admitted = true;
    oracle.Add(d.id, PromptLayers(c, d.request.seed), l.tokens);
    std::cout << "admitted " << d.request.key << " tokens " << l.tokens << std::endl;
  }

  // The run phase's fixed buffers, per layer.
  const int32_t max_batch = o.effective_max_batch();
  StepBuffers buffers(*backend, c.layers, max_batch, top_k, c.row_bytes);
  const std::unique_ptr<StepSchedule> schedule = test_child::MakeSchedule(*manager);
  const size_t stride = buffers.stride;
  std::mt19937_64 rng(42);
  signal(SIGTERM, OnStop);
  bool wrong = false;
  auto next_renewal = Clock::now() + lease / 3;
  for (int64_t step = 1; stop_requested == 0; ++step) {
    const auto step_end = Clock::now() + milliseconds(step_ms);
    std::vector<Decoding*> batch;
    std::vector<RequestId> ids;
    for (Decoding& d : decoding) {
      if (!d.admitted) continue;
      batch.push_back(&d);
      ids.push_back(d.id);
    }
    if (!batch.empty()) {
      // A request that failed in an earlier step stays for this one: every entry must be skipped.
      std::vector<bool> failed_before;
      for (Decoding* d : batch) failed_before.push_back(d->failed);
      const std::vector<std::vector<int32_t>> picks =
          test_child::RunStep(*manager, *schedule, *backend, oracle, ids, c.tokens, rng, buffers);

      for (size_t b = 0; b < batch.size(); ++b) {
        Decoding& d = *batch[b];
        const Status remote = RemoteStatus(*manager, d.id);
        // Exact rows until the layer a failure happened in, skipped entries from it on.
        bool skipping = failed_before[b];
        for (int32_t l = 0; l < c.layers; ++l) {
          const size_t first = b * static_cast<size_t>(top_k);
          const LayerCheck check = CheckEntries(*manager, oracle, d.id, l, picks[l].data() + first,
                                                buffers.slots[l]->get<int32_t>() + first,
                                                buffers.assembled[l]->get() + first * stride);
          if (check.skipped > 0 && check.exact == 0 && !remote.ok()) skipping = true;
          const bool as_expected =
              check.wrong == 0 && (skipping ? check.exact == 0 : check.skipped == 0);
          if (!as_expected) {
            wrong = true;
            std::cout << "WRONG request " << d.request.key << " step " << step << " layer " << l
                      << ": exact " << check.exact << " skipped " << check.skipped << " wrong "
                      << check.wrong << std::endl;
          }
        }
        if (failed_before[b]) {
          std::cout << "request " << d.request.key << " skipped in step " << step << std::endl;
          Check(manager->Release(d.id), "release");
          oracle.Remove(d.id);
          d.admitted = false;
        } else if (!remote.ok()) {
          fail(d, remote);
        } else if (*manager->SequenceLength(d.id) == c.tokens + max_new_tokens) {
          std::cout << "finished " << d.request.key << std::endl;
          Check(manager->Release(d.id), "release");
          d.admitted = false;
        }
      }
    }
    if (Clock::now() >= next_renewal) {
      next_renewal = Clock::now() + lease / 3;
      for (Decoding& d : decoding) {
        if (!d.bound || d.failed) continue;
        const auto renewal_start = Clock::now();
        const Status renewed =
            plane->RenewBinding(d.request.key, reader, d.binding.generation, lease);
        if (renewed.ok()) {
          d.bound_until = renewal_start + lease;
          continue;
        }
        if (renewed.code() == StatusCode::kUnavailable ||
            renewed.code() == StatusCode::kDeadlineExceeded) {
          // The control plane (or the node's membership) is away: the binding is still live
          // until bound_until, so decoding goes on and the renewal is retried soon.
          std::cout << "renewal of " << d.request.key << " failed, retrying: " << renewed.ToString()
                    << std::endl;
          next_renewal = Clock::now() + lease / 10;
          if (renewed.code() == StatusCode::kDeadlineExceeded) break;  // one wait per round
          continue;
        }
        // The binding is gone (e.g. the control plane lost its records): what it would read
        // from now on may be stale, so it stops reading.
        fail(d, renewed);
        if (d.admitted) Check(manager->Release(d.id), "release");
        d.admitted = false;
      }
    }
    for (Decoding& d : decoding) {
      // A renewal margin before the lease runs out on the server's clock: stop reading.
      if (!d.bound || d.failed || Clock::now() + lease / 10 < d.bound_until) continue;
      fail(d, DeadlineExceeded("binding of " + d.request.key + " could not be renewed within " +
                               std::to_string(c.lease_ms) + " ms"));
      if (d.admitted) Check(manager->Release(d.id), "release");
      d.admitted = false;
    }
    const auto failed =
        std::count_if(decoding.begin(), decoding.end(), [](const Decoding& d) { return d.failed; });
    std::cout << "step " << step << " healthy " << decoding.size() - failed << " failed " << failed
              << std::endl;
    // The step clock: the transport progresses while idle, and a wakeup (which may come at once,
    // e.g. while a dead shared-memory peer's operations are being cancelled) never makes the
    // loop spin.
    const auto idle = std::chrono::duration_cast<milliseconds>(step_end - Clock::now());
    if (idle.count() > 0) Check(transport->WaitForEvents(idle), "progress");
    std::this_thread::sleep_until(step_end);
  }
  // Ownership protocol: stop reading (Release from the manager), then Done.
  for (Decoding& d : decoding) {
    if (d.admitted) Check(manager->Release(d.id), "release");
    if (!d.bound) continue;
    std::cout << "done " << d.request.key << ": "
              << plane->Done(d.request.key, reader, d.binding.generation).ToString() << std::endl;
  }
  const RemoteTierStats stats = tier->stats();
  std::cout << "remote rows_fetched " << stats.rows_fetched << " rows_staged " << stats.rows_staged
            << " reads " << stats.reads << " transfers " << stats.transfers << " failed_requests "
            << stats.failed_requests << std::endl;
  return wrong ? 1 : 0;
}

}  // namespace
}  // namespace sparsekv::tools

int main(int argc, char** argv) {
  using namespace sparsekv::tools;
  CLI::App app("scale_out_test_child: prefill and decode processes of the scale-out test");
  app.require_subcommand(1);
  Common c;
  std::string control_plane = "127.0.0.1:6379";
  auto add_common = [&](CLI::App* sub) {
    sub->add_option("--control-plane", control_plane)->required();
    sub->add_option("--key-prefix", c.key_prefix);
    sub->add_option("--transports", c.transports);
    sub->add_option("--lease-ms", c.lease_ms);
    sub->add_option("--timeout-ms", c.timeout_ms);
    sub->add_option("--layers", c.layers);
    sub->add_option("--tokens", c.tokens);
    sub->add_option("--row-bytes", c.row_bytes);
    sub->add_option("--request", c.requests, "KEY:SEED")->required();
  };
  CLI::App* prefill = app.add_subcommand("prefill");
  add_common(prefill);
  std::string node_id = "prefill", pool;
  uint64_t pool_offset = 0;
  int64_t release_deadline_ms = 60000;
  prefill->add_option("--node-id", node_id);
  prefill->add_option("--pool", pool, "write into this pool server's region 0");
  prefill->add_option("--pool-offset", pool_offset);
  prefill->add_option("--release-deadline-ms", release_deadline_ms);
  CLI::App* decode = app.add_subcommand("decode");
  add_common(decode);
  std::string reader = "decode";
  int32_t top_k = 64;
  int32_t max_new_tokens = 4096;
  int64_t step_ms = 20;
  decode->add_option("--reader", reader);
  decode->add_option("--topk", top_k);
  decode->add_option("--max-new-tokens", max_new_tokens);
  decode->add_option("--step-ms", step_ms);
  CLI11_PARSE(app, argc, argv);

  const size_t colon = control_plane.rfind(':');
  c.host = control_plane.substr(0, colon);
  c.port = std::stoi(control_plane.substr(colon + 1));
  signal(SIGTERM, OnStop);
  if (prefill->parsed()) return RunPrefill(c, node_id, pool, pool_offset, release_deadline_ms);
  return RunDecode(c, reader, top_k, max_new_tokens, step_ms);
}
