// node_pool_step_bench: end-to-end decode steps (DeepSeek-V3.2 by default) whose requests' prompts
// live in another process's node pool, against the same steps over prompts in the process's own
// pinned pool, both captured as CUDA graphs and replayed in one run (docs/scale-out.md).
//
// A child process (this binary with --fill) creates a node pool, writes the prompt of every
// request (the end-to-end benchmark's synthetic content, gpu_kernels.h FillKVRows, generated on
// the GPU) into pages of its own, seals them and reports each (owner, seal). This process attaches
// to the pool with the CUDA backend, creates a manager over it and admits every request from the
// sealed pages (AdmitFromNodePool: nothing copied but the window), then tells the child to release
// its prompts and exit; the requests' own references keep the pages. A second manager of the same
// options has its own pool and ingests the same prompts. A step, as in `sparsekv bench`: per layer
// the new token's append, the resolve and miss copy (RunLayer), sparse MLA attention over the hot
// cache and the weight-streaming proxy; the top-k of every step comes from the synthetic generator
// in miss-rate mode, the same sequence for both managers. For every batch size, in --rounds
// rounds alternating local and node pool, the step is captured once per manager and replayed;
// step times are CUDA events around each replay (medians of the timed steps). The last step's
// attention output must be identical between the two managers (the same rows in the same slots).
//
// Output: a table on stdout; --json PATH writes every figure and a "summary" object with
// e2e_tpot_overhead_remote_vs_local_<context/1024>k_m<miss rate %> = the largest over the
// batches of median step time (node pool) / median step time (own pool) - 1.
#include <cuda_runtime.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cuda_common/cuda_check.h"
#include "cuda_common/device_buffer.h"
#include "sparsekv/attention.h"
#include "sparsekv/manager.h"
#include "sparsekv/model_proxy.h"
#include "sparsekv/node_pool.h"
#include "sparsekv/step_schedule.h"
#include "sparsekv/topk_generator.h"
#include "tools/sparsekv/bench/gpu_kernels.h"
#include "tools/sparsekv/bench/gpu_timing.h"
#include "tools/sparsekv/bench/topk_feed.h"
#include "tools/sparsekv/common/preset_layers.h"

extern char** environ;

namespace sparsekv::tools {
namespace {

using Clock = std::chrono::steady_clock;
using cuda_common::CudaStatus;
using cuda_common::DeviceBuffer;

struct Config {
  std::string preset = "deepseek-v3.2";
  int32_t layers = 0;  // 0: the preset's
  int32_t context = 32768;
  double miss_rate = 0.2;
  std::vector<int32_t> batches = {1, 16};
  int32_t hot_slots = 4096;
  int32_t window = 1;
  int32_t page_tokens = 64;
  int32_t heads = 128;
  double weights_gb = 84;  // 0: no proxy
  int32_t steps = 30;
  int32_t warmup = 10;
  int32_t rounds = 2;
  uint64_t seed = 1;
  int device = 0;
  std::string segment_dir = "/dev/shm";
  std::string json;
  // The child: create the pool NAME, fill and seal the prompts, wait for stdin to close.
  std::string fill;
  int32_t max_batch = 0;  // the child's requests
  int32_t max_new = 0;    // the child's pool: room for this many new tokens per request
};

[[noreturn]] void Die(const std::string& what, const Status& s) {
  std::fprintf(stderr, "node_pool_step_bench: %s: %s\n", what.c_str(), s.ToString().c_str());
  std::exit(1);
}
void Check(const Status& s, const std::string& what) {
  if (!s.ok()) Die(what, s);
}
template <typename T>
T Check(StatusOr<T> v, const std::string& what) {
  if (!v.ok()) Die(what, v.status());
  return std::move(v).value();
}

CacheOptions ManagerOptions(const Config& c, const ModelPreset& preset, int32_t layers,
                            int32_t max_batch, int32_t max_new) {
  CacheOptions o;
  o.geometry = KVGeometry::Uniform(layers, preset.row_bytes);
  o.top_k = preset.top_k;
  o.hot_slots = c.hot_slots;
  o.window = c.window;
  o.host_page_tokens = c.page_tokens;
  o.max_requests = max_batch;
  o.max_context = c.context + max_new;
  // Every request's prompt and new tokens, and a copy-on-write page each.
  o.host_capacity_tokens = int64_t{max_batch} * (o.max_context + 2 * c.page_tokens);
  return o;
}

// The child process: creates the node pool and writes every request's prompt, sealed.
int RunFill(const Config& c, const ModelPreset& preset, int32_t layers) {
  std::shared_ptr<Backend> cpu = CreateCpuBackend();
  const CacheOptions o = ManagerOptions(c, preset, layers, c.max_batch, c.max_new);
  NodePoolOptions node;
  node.name = c.fill;
  node.directory = c.segment_dir;
  std::shared_ptr<HostKVPool> pool =
      Check(CreateNodePool(o, 2 * c.max_batch, node, cpu), "create the node pool");
  Check(CudaStatus(cudaSetDevice(c.device), "cudaSetDevice"), "device");
  const size_t layer_bytes = size_t(c.context) * preset.row_bytes;
  DeviceBuffer rows = Check(DeviceBuffer::Allocate(layer_bytes, "prompt rows"), "allocate");
  std::vector<std::byte> host(layer_bytes);
  std::vector<int32_t> owners;
  for (int32_t b = 0; b < c.max_batch; ++b) {
    const int32_t owner = Check(pool->AcquireOwner(), "acquire an owner");
    Check(pool->Reserve(owner, c.context), "reserve");
    for (int32_t l = 0; l < layers; ++l) {
      Check(CudaStatus(gpu::FillKVRows(rows.get<std::byte>(), preset.row_bytes, 0, c.context,
                                       preset.row_bytes, b, l, 0, c.seed, nullptr),
                       "FillKVRows"),
            "fill");
      Check(CudaStatus(cudaMemcpy(host.data(), rows.get(), layer_bytes, cudaMemcpyDeviceToHost),
                       "cudaMemcpy"),
            "download");
      Check(WritePromptLayer(*pool, *cpu, owner, l, host.data(), c.context, nullptr), "write");
    }
    const uint64_t seal = Check(pool->Seal(owner, c.context), "seal");
    std::cout << "sealed " << b << " " << owner << " " << seal << std::endl;
    owners.push_back(owner);
  }
  std::cout << "ready " << pool->node_pool_path() << std::endl;
  std::string line;
  while (std::getline(std::cin, line)) {
  }
  for (int32_t owner : owners) {
    pool->Release(owner);
    pool->ReleaseOwner(owner);
  }
  return 0;
}

// What both managers' steps share: attention, proxy, queries, output, the new tokens' rows.
struct Shared {
  int32_t layers = 0;
  int32_t row_bytes = 0;
  int32_t top_k = 0;
  int32_t max_batch = 0;
  std::unique_ptr<SparseMLAAttention> attention;
  std::unique_ptr<WeightStreamProxy> proxy;  // null without weights
  DeviceBuffer q, out, new_rows;
  const std::byte* NewRows(int32_t layer) const {
    return new_rows.get<std::byte>() + int64_t{layer} * max_batch * row_bytes;
  }
};

// One manager and the requests it holds (ids 1..max_batch), with their lengths.
struct Variant {
  std::string name;
  std::unique_ptr<SparseKVCacheManager> manager;
  // The step's run phase, serial: the same calls for both variants, so that only the pool
  // differs (this benchmark compares pools, not schedules).
  std::unique_ptr<StepSchedule> schedule;
  std::vector<RequestId> ids;
  std::vector<int32_t> lens;
  DeviceBuffer slots;  // [max_batch, top_k]
};

Status RunPhase(Variant& v, const Shared& sh, const TopKFeed& feed, int32_t batch, cudaStream_t s) {
  // Attention over the whole batch (the serial schedule's one slice).
  const AttendFn attend = [&](int32_t layer, int32_t first, int32_t rows, StreamHandle stream) {
    if (first != 0 || rows != batch) return InvalidArgument("attention in slices");
    return sh.attention->Run(batch, sh.q.get(), v.manager->HotLayer(layer), sh.row_bytes,
                             v.slots.get<int32_t>(), sh.out.get(),
                             static_cast<cudaStream_t>(stream));
  };
  for (int32_t l = 0; l < sh.layers; ++l) {
    const LayerWork work{sh.NewRows(l), nullptr, feed.layer(l), 0, v.slots.get<int32_t>()};
    SPARSEKV_RETURN_IF_ERROR(v.schedule->RunLayer(l, work, attend, s));
    if (sh.proxy) SPARSEKV_RETURN_IF_ERROR(sh.proxy->Run(batch, l, s));
  }
  return v.schedule->FinishStep(s);
}

struct Run {
  std::string variant;
  int32_t batch = 0;
  int32_t round = 0;
  std::vector<double> step_ms;  // timed steps
  double median_ms = 0;
  double miss_rate = 0;  // measured over the timed steps
  std::vector<std::byte> last_out;
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n == 0 ? 0 : n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Warm-up and timed steps of `batch` requests of `v`: the top-k from a fresh feed of `g` (the
// same sequence for every variant), the run phase captured at the first step and replayed.
Run Steps(Variant& v, const Shared& sh, const Config& c, const TopKGeneratorOptions& g,
          int32_t batch, int32_t round, cudaStream_t s) {
  Run r;
  r.variant = v.name;
  r.batch = batch;
  r.round = round;
  auto feed = Check(TopKFeed::Create(g, IndexGroups::Uniform(sh.layers, 1, g.top_k), sh.max_batch),
                    "top-k feed");
  Graph graph;
  bool captured = false;
  cudaEvent_t start, stop;
  Check(CudaStatus(cudaEventCreate(&start), "event"), "event");
  Check(CudaStatus(cudaEventCreate(&stop), "event"), "event");
  for (int32_t step = 0; step < c.warmup + c.steps; ++step) {
    if (step == c.warmup) Check(v.manager->ResetStats(s), "reset stats");
    std::vector<int32_t> seq_lens(v.lens.begin(), v.lens.begin() + batch);
    for (int32_t& n : seq_lens) ++n;
    feed->Generate(seq_lens);
    Check(feed->Upload(batch, s), "upload top-k");
    Check(v.schedule->PlanStep(std::span(v.ids.data(), batch), s), "plan step");
    if (!captured) {
      Check(graph.Capture(s, [&] { return RunPhase(v, sh, *feed, batch, s); }), "capture");
      captured = true;
    }
    Check(CudaStatus(cudaEventRecord(start, s), "event"), "record");
    Check(graph.Launch(s), "replay");
    Check(CudaStatus(cudaEventRecord(stop, s), "event"), "record");
    Check(CudaStatus(cudaStreamSynchronize(s), "synchronize"), "step");
    // The first replay belongs to the step captured (its host side ran at capture).
    float ms = 0;
    Check(CudaStatus(cudaEventElapsedTime(&ms, start, stop), "elapsed"), "time");
    if (step > 0) Check(v.schedule->FinishReplayedStep(ms / 1e3), "finish replayed step");
    if (step >= c.warmup) r.step_ms.push_back(ms);
    for (int32_t b = 0; b < batch; ++b) ++v.lens[b];
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  const CacheStats stats = Check(v.manager->ReadStats(s), "stats");
  const double lookups = double(stats.total.hits + stats.total.window_hits + stats.total.misses);
  r.miss_rate = lookups > 0 ? double(stats.total.misses) / lookups : 0;
  r.median_ms = Median(r.step_ms);
  r.last_out.resize(size_t(batch) * c.heads * kMLAValueDim * 2);
  Check(CudaStatus(
            cudaMemcpy(r.last_out.data(), sh.out.get(), r.last_out.size(), cudaMemcpyDeviceToHost),
            "download"),
        "output");
  return r;
}

int RunBench(const Config& c, const ModelPreset& preset, int32_t layers, const std::string& self,
             const std::string& command) {
  const int32_t max_batch = *std::max_element(c.batches.begin(), c.batches.end());
  // Tokens each request gains over the whole run.
  const int32_t max_new =
      c.rounds * static_cast<int32_t>(c.batches.size()) * (c.warmup + c.steps) + c.page_tokens;
  std::shared_ptr<Backend> cuda = Check(CreateCudaBackend(c.device), "CUDA backend");
  cudaStream_t stream;
  Check(CudaStatus(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream"), "stream");

  // The node pool, written by another process.
  const auto t0 = Clock::now();
  const std::string name = "sparsekv-node-pool-step-bench-" + std::to_string(getpid());
  std::vector<std::string> args = {self,
                                   "--fill",
                                   name,
                                   "--preset",
                                   c.preset,
                                   "--layers",
                                   std::to_string(layers),
                                   "--context",
                                   std::to_string(c.context),
                                   "--page-tokens",
                                   std::to_string(c.page_tokens),
                                   "--segment-dir",
                                   c.segment_dir,
                                   "--seed",
                                   std::to_string(c.seed),
                                   "--device",
                                   std::to_string(c.device),
                                   "--fill-batch",
                                   std::to_string(max_batch),
                                   "--fill-max-new",
                                   std::to_string(max_new)};
  int in[2], out[2];
  if (pipe(in) != 0 || pipe(out) != 0) Die("pipe", Internal("pipe"));
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, in[0], 0);
  posix_spawn_file_actions_adddup2(&actions, out[1], 1);
  posix_spawn_file_actions_addclose(&actions, in[1]);
  posix_spawn_file_actions_addclose(&actions, out[0]);
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t child = -1;
  if (posix_spawn(&child, self.c_str(), &actions, nullptr, argv.data(), environ) != 0) {
    Die("start the filling process", Internal(self));
  }
  posix_spawn_file_actions_destroy(&actions);
  close(in[0]);
  close(out[1]);
  FILE* from_child = fdopen(out[0], "r");
  std::vector<NodePoolPrompt> prompts(max_batch);
  std::string path;
  for (char line[4096]; path.empty() && fgets(line, sizeof(line), from_child) != nullptr;) {
    int b = 0;
    int owner = 0;
    unsigned long long seal = 0;
    if (std::sscanf(line, "sealed %d %d %llu", &b, &owner, &seal) == 3 && b < max_batch) {
      prompts[b] = {owner, seal};
    } else if (std::strncmp(line, "ready ", 6) == 0) {
      path = std::string(line + 6);
      path.erase(path.find_last_not_of('\n') + 1);
    }
  }
  if (path.empty()) Die("the filling process", Internal("it did not report its node pool"));
  std::shared_ptr<HostKVPool> pool =
      Check(OpenNodePool(path, NodePoolOptions(), cuda), "open the node pool");
  std::printf("node pool %s: %.1f GB, written by pid %d and registered here in %.1f s\n",
              path.c_str(), pool->bytes() / 1e9, int(child),
              std::chrono::duration<double>(Clock::now() - t0).count());

  std::vector<Variant> variants(2);
  const CacheOptions local_options = ManagerOptions(c, preset, layers, max_batch, max_new);
  CacheOptions node_options = local_options;
  UseNodePoolShape(*pool, node_options);
  variants[0].name = "local";
  variants[0].manager = Check(SparseKVCacheManager::Create(local_options, cuda), "local manager");
  variants[1].name = "node_pool";
  variants[1].manager =
      Check(SparseKVCacheManager::Create(node_options, cuda, pool), "node pool manager");
  for (Variant& v : variants) {
    for (int32_t b = 0; b < max_batch; ++b) v.ids.push_back(RequestId(b + 1));
    v.lens.assign(max_batch, c.context);
    v.slots = Check(DeviceBuffer::Allocate(size_t(max_batch) * preset.top_k * 4, "slots"), "slots");
    ScheduleOptions serial;
    serial.fixed = StepChoice{};
    v.schedule = Check(StepSchedule::Create(*v.manager, serial), "step schedule");
  }
  // The node pool's requests: admitted from the sealed pages, then the writer lets go.
  const auto t1 = Clock::now();
  for (int32_t b = 0; b < max_batch; ++b) {
    Check(AdmitFromNodePool(*variants[1].manager, variants[1].ids[b], prompts[b], max_new, stream),
          "admit from the node pool");
  }
  Check(CudaStatus(cudaStreamSynchronize(stream), "admission"), "admission");
  std::printf("admitted %d requests from the node pool in %.3f s\n", max_batch,
              std::chrono::duration<double>(Clock::now() - t1).count());
  close(in[1]);
  int child_status = 0;
  waitpid(child, &child_status, 0);
  fclose(from_child);
  if (!WIFEXITED(child_status) || WEXITSTATUS(child_status) != 0) {
    Die("the filling process", Internal("exited with status " + std::to_string(child_status)));
  }
  // The local requests: ingested from the same content.
  const auto t2 = Clock::now();
  {
    DeviceBuffer rows = Check(
        DeviceBuffer::Allocate(size_t(c.context) * preset.row_bytes, "prompt rows"), "allocate");
    SparseKVCacheManager& m = *variants[0].manager;
    for (int32_t b = 0; b < max_batch; ++b) {
      Check(m.Admit(variants[0].ids[b], c.context, max_new, stream), "admit");
      for (int32_t l = 0; l < layers; ++l) {
        Check(CudaStatus(gpu::FillKVRows(rows.get<std::byte>(), preset.row_bytes, 0, c.context,
                                         preset.row_bytes, b, l, 0, c.seed, stream),
                         "FillKVRows"),
              "fill");
        Check(m.IngestPrompt(variants[0].ids[b], l, rows.get(), stream), "ingest");
      }
    }
    Check(CudaStatus(cudaStreamSynchronize(stream), "ingest"), "ingest");
  }
  std::printf("ingested %d local requests in %.1f s\n", max_batch,
              std::chrono::duration<double>(Clock::now() - t2).count());

  Shared sh;
  sh.layers = layers;
  sh.row_bytes = preset.row_bytes;
  sh.top_k = preset.top_k;
  sh.max_batch = max_batch;
  SparseMLAOptions ao;
  ao.max_batch = max_batch;
  ao.heads = c.heads;
  ao.top_k = preset.top_k;
  ao.format = preset.row_bytes == 656 ? KVRowFormat::kFp8Row656 : KVRowFormat::kBf16Row1152;
  sh.attention = Check(SparseMLAAttention::Create(ao), "attention");
  if (c.weights_gb > 0) {
    const int64_t per_layer = static_cast<int64_t>(c.weights_gb * 1e9 / preset.num_layers);
    sh.proxy = Check(WeightStreamProxy::Create(max_batch, per_layer, 2, c.device), "proxy");
  }
  sh.q = Check(DeviceBuffer::Allocate(size_t(max_batch) * c.heads * kMLAQKDim * 2, "q"), "q");
  sh.out =
      Check(DeviceBuffer::Allocate(size_t(max_batch) * c.heads * kMLAValueDim * 2, "out"), "out");
  sh.new_rows = Check(
      DeviceBuffer::Allocate(size_t(layers) * max_batch * preset.row_bytes, "new rows"), "rows");
  Check(CudaStatus(
            gpu::FillBf16(sh.q.get(), int64_t{max_batch} * c.heads * kMLAQKDim, c.seed, stream),
            "FillBf16"),
        "q");
  for (int32_t l = 0; l < layers; ++l) {
    for (int32_t b = 0; b < max_batch; ++b) {
      Check(CudaStatus(gpu::FillKVRows(sh.new_rows.get<std::byte>(), preset.row_bytes,
                                       int64_t{l} * max_batch + b, 1, preset.row_bytes, b, l, -1,
                                       c.seed + 1, stream),
                       "FillKVRows"),
            "new rows");
    }
  }

  TopKGeneratorOptions g;
  g.top_k = preset.top_k;
  g.seed = c.seed;
  g.miss_rate = c.miss_rate;
  g.fresh_range = c.context;
  std::vector<Run> runs;
  // The two managers read the same rows into the same slots: their outputs must agree (the
  // kernels are deterministic, so they are identical in practice; the bound allows nothing more
  // than bf16 rounding).
  double max_error = 0;
  for (int32_t round = 0; round < c.rounds; ++round) {
    for (int32_t batch : c.batches) {
      // Alternate which goes first, so that neither always runs on a warmer machine.
      const int first = round % 2;
      Run a = Steps(variants[first], sh, c, g, batch, round, stream);
      Run b = Steps(variants[1 - first], sh, c, g, batch, round, stream);
      max_error = std::max(
          max_error, MaxRelativeError(a.last_out, b.last_out, int64_t{c.heads} * kMLAValueDim));
      for (Run* r : {&a, &b}) {
        std::printf("round %d batch %3d %-9s median %.3f ms per step, miss rate %.3f\n", round,
                    batch, r->variant.c_str(), r->median_ms, r->miss_rate);
        r->last_out.clear();
        runs.push_back(std::move(*r));
      }
    }
  }

  nlohmann::json per_batch = nlohmann::json::array();
  double worst = -1e9;
  for (int32_t batch : c.batches) {
    std::vector<double> local, node;
    for (const Run& r : runs) {
      if (r.batch != batch) continue;
      auto& into = r.variant == "local" ? local : node;
      into.insert(into.end(), r.step_ms.begin(), r.step_ms.end());
    }
    const double overhead = Median(node) / Median(local) - 1;
    worst = std::max(worst, overhead);
    std::printf("batch %3d: local %.3f ms, node pool %.3f ms per step: overhead %+.4f\n", batch,
                Median(local), Median(node), overhead);
    per_batch.push_back({{"batch", batch},
                         {"local_median_ms", Median(local)},
                         {"node_pool_median_ms", Median(node)},
                         {"overhead", overhead}});
  }
  const std::string key = "e2e_tpot_overhead_remote_vs_local_" + std::to_string(c.context / 1024) +
                          "k_m" + std::to_string(static_cast<int>(std::lround(c.miss_rate * 100)));
  const bool agree = max_error <= 1e-3;
  std::printf("%s = %.4f (target <= 0.02); attention outputs: max relative error %.3g (%s)\n",
              key.c_str(), worst, max_error, agree ? "agree" : "DIFFER");
  if (!c.json.empty()) {
    nlohmann::json all = nlohmann::json::array();
    for (const Run& r : runs) {
      all.push_back({{"variant", r.variant},
                     {"batch", r.batch},
                     {"round", r.round},
                     {"median_ms", r.median_ms},
                     {"miss_rate", r.miss_rate},
                     {"step_ms", r.step_ms}});
    }
    cudaDeviceProp prop{};
    cudaGetDeviceProperties(&prop, c.device);
    const nlohmann::json doc = {{"command", command},
                                {"device", prop.name},
                                {"preset", c.preset},
                                {"layers", layers},
                                {"context", c.context},
                                {"miss_rate", c.miss_rate},
                                {"hot_slots", c.hot_slots},
                                {"heads", c.heads},
                                {"proxy_weights_gb", c.weights_gb},
                                {"segment", path},
                                {"outputs_max_relative_error", max_error},
                                {"batches", per_batch},
                                {"runs", all},
                                {"summary", {{key, worst}}}};
    std::ofstream(c.json) << doc.dump(2) << "\n";
  }
  cudaStreamDestroy(stream);
  return agree ? 0 : 1;
}

}  // namespace
}  // namespace sparsekv::tools

int main(int argc, char** argv) {
  using namespace sparsekv;
  using namespace sparsekv::tools;
  Config c;
  CLI::App app("node_pool_step_bench: decode steps over another process's node pool vs own pool");
  app.add_option("--preset", c.preset, "Model preset")->capture_default_str();
  app.add_option("--layers", c.layers, "Layers (0: the preset's)")->capture_default_str();
  app.add_option("--context", c.context, "Prompt tokens per request")->capture_default_str();
  app.add_option("--miss-rate", c.miss_rate, "Top-k miss rate (miss-rate mode)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1.0));
  app.add_option("--batches", c.batches, "Batch sizes")->delimiter(',')->capture_default_str();
  app.add_option("--hot-slots", c.hot_slots, "Hot slots per request")->capture_default_str();
  app.add_option("--window", c.window, "Window")->capture_default_str();
  app.add_option("--page-tokens", c.page_tokens, "Host page tokens")->capture_default_str();
  app.add_option("--heads", c.heads, "Attention heads")->capture_default_str();
  app.add_option("--weights-gb", c.weights_gb, "Proxy weights per step (0: none)")
      ->capture_default_str();
  app.add_option("--steps", c.steps, "Timed steps per run")->capture_default_str();
  app.add_option("--warmup", c.warmup, "Untimed steps per run")->capture_default_str();
  app.add_option("--rounds", c.rounds, "Rounds over the batches")->capture_default_str();
  app.add_option("--seed", c.seed, "Seed")->capture_default_str();
  app.add_option("--device", c.device, "CUDA device")->capture_default_str();
  app.add_option("--segment-dir", c.segment_dir, "Directory of the node pool's file")
      ->capture_default_str();
  app.add_option("--json", c.json, "Write the results here");
  app.add_option("--fill", c.fill, "(internal) the filling process: create this node pool");
  app.add_option("--fill-batch", c.max_batch, "(internal) requests the filling process writes");
  app.add_option("--fill-max-new", c.max_new, "(internal) new tokens per request of its pool");
  CLI11_PARSE(app, argc, argv);
  const StatusOr<ModelPreset> preset = FindPreset(c.preset, KVRowFormat::kFp8Row656);
  if (!preset.ok()) Die("--preset", preset.status());
  // Its manager holds the preset's rows as uniform layers: only the presets it serves.
  Check(CheckToolsDriveLayers(preset->geometry(), preset->raw_window, ToolLayers::kOffloadedOnly),
        "--preset");
  const int32_t layers = c.layers > 0 ? c.layers : preset->num_layers;
  if (c.batches.empty() || c.steps < 1 || c.warmup < 1 || c.rounds < 1 ||
      c.context < preset->top_k) {
    std::fprintf(stderr,
                 "node_pool_step_bench: need batches, steps >= 1, warmup >= 1, rounds "
                 ">= 1 and context >= top_k\n");
    return 2;
  }
  if (!c.fill.empty()) return RunFill(c, *preset, layers);
  std::string command;
  for (int i = 0; i < argc; ++i) command += (i ? " " : "") + std::string(argv[i]);
  return RunBench(c, *preset, layers, "/proc/self/exe", command);
}
