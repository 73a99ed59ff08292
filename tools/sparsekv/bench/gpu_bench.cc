// The driver of the end-to-end benchmark: ceilings, plans, variants, correctness checks, the
// captured step and its timing. See gpu_bench.h and docs/benchmark.md.
#include "tools/sparsekv/bench/gpu_bench.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <optional>
#include <thread>

#include "sparsekv/attention.h"
#include "sparsekv/index_groups.h"
#include "sparsekv/model_proxy.h"
#include "sparsekv/options.h"
#include "sparsekv/topk_generator.h"
#include "tools/sparsekv/bench/arena_backend.h"
#include "tools/sparsekv/bench/entry_layers.h"
#include "tools/sparsekv/bench/gpu_kernels.h"
#include "tools/sparsekv/bench/gpu_timing.h"
#include "tools/sparsekv/bench/gpu_trace.h"
#include "tools/sparsekv/bench/gpu_variants.h"
#include "tools/sparsekv/bench/topk_feed.h"

namespace sparsekv::tools {
namespace {

using Clock = std::chrono::steady_clock;

// The correctness check: these many eager steps at this batch (or every variant's max batch if
// smaller), with miss-rate-mode top-k at this rate, so that sparsekv serves hits, misses and the
// window in them.
constexpr int32_t kCheckSteps = 2;
constexpr int32_t kCheckBatch = 4;
constexpr double kCheckMissRate = 0.2;
constexpr int kAttentionReps = 5;  // replays of the attention-only and proxy-only graphs
constexpr size_t kCeilingBytes = size_t{1} << 30;

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

// What every variant of one preset shares: attention, proxy, queries, output, new-token rows.
struct Shared {
  RequestShape shape;  // tokens unset
  int32_t max_batch = 0;
  int32_t heads = 0;
  std::unique_ptr<SparseMLAAttention> attention;  // null for DeepSeek-V4
  // DeepSeek-V4: its attention over the variants' two scopes (StepVariant::Scopes); else null.
  std::unique_ptr<SparseEntryAttention> entry_attention;
  int32_t q_dims = kMLAQKDim;                // 576; 512 for DeepSeek-V4's entries
  std::unique_ptr<WeightStreamProxy> proxy;  // null with --no-proxy
  DeviceBuffer q;                            // [max_batch, heads, q_dims] bf16
  DeviceBuffer out;                          // [max_batch, heads, 512] bf16
  DeviceBuffer new_rows;                     // [layers, max_batch, row]
  std::map<int32_t, double> proxy_us;        // per layer, by batch
  int32_t queries = 1;  // query tokens per request (--mtp): attention and proxy rows

  size_t OutBytes(int32_t batch) const {
    return size_t(batch) * queries * heads * kMLAValueDim * 2;
  }
  // Attention of `layer` over batch rows [first, first + n) of `v`, into out's rows.
  Status Attend(const StepVariant& v, int32_t layer, int32_t first, int32_t n, int32_t batch,
                cudaStream_t stream) const {
    const size_t q_offset = size_t(first) * heads * q_dims * 2;
    const size_t out_offset = size_t(first) * heads * kMLAValueDim * 2;
    if (entry_attention != nullptr) {
      SPARSEKV_ASSIGN_OR_RETURN(const EntryScopes s, v.Scopes(layer, first));
      return entry_attention->Run(n * queries, q.get<std::byte>() + q_offset, s.selected, s.window,
                                  /*sink=*/nullptr, out.get<std::byte>() + out_offset, stream);
    }
    if (first == 0 && n == batch) {
      return attention->Run(n * queries, q.get(), v.Rows(layer), shape.row_bytes, v.Indices(),
                            out.get(), stream);
    }
    return attention->Run(n * queries, q.get<std::byte>() + q_offset, v.Rows(layer),
                          shape.row_bytes, v.Indices() + int64_t{first} * shape.top_k,
                          out.get<std::byte>() + out_offset, stream);
  }
  const std::byte* NewRows(int32_t layer) const {
    return new_rows.get<std::byte>() + int64_t{layer} * max_batch * shape.row_bytes;
  }
};

// One decode step of `batch` requests over every layer. With check_out, each layer's attention
// output is also copied to check_out + layer * OutBytes(batch) (eager check runs only).
Status StepBody(StepVariant& v, const Shared& sh, const TopKFeed& feed, int32_t batch,
                cudaStream_t s, std::byte* check_out) {
  const int32_t rows = batch * sh.queries;  // attention and proxy rows
  // Attention over requests [first, first + n) (all of them, or a slice the schedule hands it).
  const AttendFn attend = [&](int32_t l, int32_t first, int32_t n, StreamHandle stream) {
    return sh.Attend(v, l, first, n, batch, static_cast<cudaStream_t>(stream));
  };
  for (int32_t l = 0; l < sh.shape.layers; ++l) {
    SPARSEKV_RETURN_IF_ERROR(
        v.RunLayerAndAttend(l, batch, feed.layer(l), sh.NewRows(l), attend, s));
    if (check_out != nullptr) {
      SPARSEKV_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(check_out + l * sh.OutBytes(batch),
                                                    sh.out.get(), sh.OutBytes(batch),
                                                    cudaMemcpyDeviceToDevice, s));
    }
    if (sh.proxy) SPARSEKV_RETURN_IF_ERROR(sh.proxy->Run(rows, l, s));
  }
  return v.FinishStep(s);
}

// Per-request token counts of a variant's run; a step appends one token to requests [0, batch).
struct Requests {
  std::vector<int32_t> lens;  // tokens with KV
  std::vector<int32_t> seq_lens, positions;

  // The next step's inputs for requests [0, batch): positions = lens, seq_lens = lens + 1.
  void Prepare(int32_t batch) {
    positions.assign(lens.begin(), lens.begin() + batch);
    seq_lens = positions;
    for (int32_t& s : seq_lens) ++s;
  }
  void Advance(int32_t batch) {
    for (int32_t b = 0; b < batch; ++b) ++lens[b];
  }
};

// The eager check steps; returns every layer's attention output of every step.
StatusOr<std::vector<std::byte>> RunCheck(StepVariant& v, const Shared& sh, TopKFeed& feed,
                                          Requests& req, int32_t batch, cudaStream_t s) {
  const size_t step_bytes = sh.OutBytes(batch) * sh.shape.layers;
  SPARSEKV_ASSIGN_OR_RETURN(DeviceBuffer out,
                            DeviceBuffer::Allocate(step_bytes * kCheckSteps, kBenchMemory));
  SPARSEKV_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(out.get(), 0xFF, out.bytes(), s));  // poison
  for (int32_t step = 0; step < kCheckSteps; ++step) {
    req.Prepare(batch);
    feed.Generate(req.seq_lens);
    SPARSEKV_RETURN_IF_ERROR(feed.Upload(batch, s));
    SPARSEKV_RETURN_IF_ERROR(v.Plan(req.positions, s));
    SPARSEKV_RETURN_IF_ERROR(
        StepBody(v, sh, feed, batch, s, out.get<std::byte>() + step * step_bytes));
    SPARSEKV_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(s));
    req.Advance(batch);
  }
  std::vector<std::byte> host(out.bytes());
  SPARSEKV_CUDA_RETURN_IF_ERROR(
      cudaMemcpy(host.data(), out.get(), out.bytes(), cudaMemcpyDeviceToHost));
  return host;
}

struct PointTiming {
  std::vector<double> tpot_ms, topk_host_ms, topk_upload_ms;
  VariantStats stats;
  double attention_us_per_layer = 0;
  double proxy_us_per_layer = 0;
  std::optional<TraceCapture> trace;  // --trace-step
};

// --trace-step: one more step after the timed ones (and their statistics), its replay traced, so
// that the trace's cost stays out of the timed steps. Only the graph's work is in the trace.
StatusOr<TraceCapture> TracedReplay(StepVariant& v, TopKFeed& feed, Requests& req, int32_t batch,
                                    const std::map<std::string, Graph>& graphs, StepTracer& tracer,
                                    cudaStream_t s) {
  req.Prepare(batch);
  feed.Generate(req.seq_lens);
  SPARSEKV_RETURN_IF_ERROR(feed.Upload(batch, s));
  SPARSEKV_RETURN_IF_ERROR(v.Plan(req.positions, s));
  const auto graph = graphs.find(v.GraphKey());
  if (graph == graphs.end()) {
    return FailedPrecondition("--trace-step: the traced step's schedule " + v.GraphKey() +
                              " was never captured in the timed steps");
  }
  SPARSEKV_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(s));
  SPARSEKV_RETURN_IF_ERROR(tracer.Start());
  SPARSEKV_RETURN_IF_ERROR(graph->second.Launch(s));
  SPARSEKV_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(s));
  SPARSEKV_ASSIGN_OR_RETURN(TraceCapture capture, tracer.Stop());
  SPARSEKV_RETURN_IF_ERROR(v.AfterReplay(-1));
  req.Advance(batch);
  return capture;
}

// `steps` steps of `batch` requests: the first of each schedule (GraphKey) is captured as a graph
// and launched, the others replay it; steps before `warmup` are untimed (with --schedule auto
// they are where the schedule measures its candidates). Then, with a tracer, one traced step
// (TracedReplay). Then the attention and the proxy alone, as graphs of all layers.
StatusOr<PointTiming> RunPoint(StepVariant& v, Shared& sh, TopKFeed& feed, Requests& req,
                               int32_t batch, int32_t steps, int32_t warmup, cudaStream_t s,
                               StepTracer* tracer) {
  PointTiming t;
  std::map<std::string, Graph> graphs;  // by GraphKey
  EventPair step_ev, upload_ev;
  // Step s + 1's rows are generated on the host while the GPU runs step s (they depend only on
  // the sequence lengths), on every core but the one that drives the GPU.
  req.Prepare(batch);
  const Clock::time_point first_start = Clock::now();
  feed.Generate(req.seq_lens);
  double host_ms = 1e3 * Seconds(first_start);
  double next_host_ms = 0;
  std::jthread next_rows;  // joined before next_host_ms goes out of scope
  for (int32_t step = 0; step < steps; ++step) {
    if (step == warmup) SPARSEKV_RETURN_IF_ERROR(v.ResetStats(s));
    req.Prepare(batch);
    SPARSEKV_RETURN_IF_ERROR(upload_ev.Start(s));
    SPARSEKV_RETURN_IF_ERROR(feed.Upload(batch, s));
    SPARSEKV_RETURN_IF_ERROR(upload_ev.Stop(s));
    SPARSEKV_RETURN_IF_ERROR(v.Plan(req.positions, s));
    const bool capture = !graphs.contains(v.GraphKey());
    Graph& step_graph = graphs[v.GraphKey()];
    if (capture) {
      // Capturing enqueues nothing: the launch runs the step, and the captured calls have
      // already closed it on the host.
      SPARSEKV_RETURN_IF_ERROR(LabelledCapture(tracer, s, [&] {
        return step_graph.Capture(
            s, [&] { return StepBody(v, sh, feed, batch, s, /*check_out=*/nullptr); });
      }));
    }
    SPARSEKV_RETURN_IF_ERROR(step_ev.Start(s));
    SPARSEKV_RETURN_IF_ERROR(step_graph.Launch(s));
    SPARSEKV_RETURN_IF_ERROR(step_ev.Stop(s));
    if (step + 1 < steps) {
      std::vector<int32_t> next = req.seq_lens;
      for (int32_t& n : next) ++n;
      next_rows = std::jthread([&feed, &next_host_ms, next = std::move(next)] {
        const Clock::time_point start = Clock::now();
        feed.Generate(next, /*spare_cores=*/1);
        next_host_ms = 1e3 * Seconds(start);
      });
    }
    SPARSEKV_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(s));
    if (!capture) {
      SPARSEKV_ASSIGN_OR_RETURN(const double replay_ms, step_ev.Ms());
      SPARSEKV_RETURN_IF_ERROR(v.AfterReplay(1e-3 * replay_ms));
    }
    if (next_rows.joinable()) next_rows.join();
    const double step_host_ms = host_ms;  // this step's rows, generated during the last one
    host_ms = next_host_ms;
    req.Advance(batch);
    if (step < warmup) continue;
    SPARSEKV_ASSIGN_OR_RETURN(const double step_ms, step_ev.Ms());
    SPARSEKV_ASSIGN_OR_RETURN(const double upload_ms, upload_ev.Ms());
    t.tpot_ms.push_back(step_ms);
    t.topk_host_ms.push_back(step_host_ms);
    t.topk_upload_ms.push_back(upload_ms);
  }
  SPARSEKV_ASSIGN_OR_RETURN(t.stats, v.ReadStats(s));
  if (tracer != nullptr) {
    SPARSEKV_ASSIGN_OR_RETURN(t.trace, TracedReplay(v, feed, req, batch, graphs, *tracer, s));
  }

  const int32_t layers = sh.shape.layers;
  Graph attention;
  SPARSEKV_RETURN_IF_ERROR(attention.Capture(s, [&]() -> Status {
    for (int32_t l = 0; l < layers; ++l) {
      SPARSEKV_RETURN_IF_ERROR(sh.Attend(v, l, 0, batch, batch, s));
    }
    return Status::Ok();
  }));
  SPARSEKV_ASSIGN_OR_RETURN(const double attention_ms, TimeGraph(attention, s, kAttentionReps));
  t.attention_us_per_layer = 1e3 * attention_ms / layers;

  if (sh.proxy && !sh.proxy_us.contains(batch)) {
    Graph proxy;
    SPARSEKV_RETURN_IF_ERROR(proxy.Capture(s, [&]() -> Status {
      for (int32_t l = 0; l < layers; ++l) {
        SPARSEKV_RETURN_IF_ERROR(sh.proxy->Run(batch * sh.queries, l, s));
      }
      return Status::Ok();
    }));
    SPARSEKV_ASSIGN_OR_RETURN(const double proxy_ms, TimeGraph(proxy, s, kAttentionReps));
    sh.proxy_us[batch] = 1e3 * proxy_ms / layers;
  }
  t.proxy_us_per_layer = sh.proxy ? sh.proxy_us[batch] : 0;
  return t;
}

std::string Pct(double rate) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "%.0f%%", 100 * rate);
  return buf;
}

// Everything about one context before anything runs: each variant's plan.
struct ContextPlan {
  int32_t context = 0;
  std::vector<std::pair<KVVariant, VariantPlan>> variants;
  int32_t check_batch = 0;    // 0: no check (full-hbm not run, or a variant admits no batch)
  BudgetedHotCache budgeted;  // sparsekv with --hybrid: its hot cache and batch
};

class E2ERun {
 public:
  E2ERun(const BenchConfig& c, std::shared_ptr<Backend> cuda, std::ostream& log)
      : c_(c), cuda_(std::move(cuda)), log_(log), start_(Clock::now()) {}

  StatusOr<E2EReport> Run();

 private:
  Status Plan(const ModelPreset& preset);
  Status Setup(const ModelPreset& preset);
  Status RunContext(const ContextPlan& plan);
  Status RunVariant(const ContextPlan& plan, KVVariant kind, const VariantPlan& vp);
  // StepVariant::SetLiveBatch, and the lengths of the requests it admits anew.
  Status SetLiveBatch(StepVariant& v, const VariantSetup& setup, int32_t batch, Requests& req,
                      int32_t& live);
  void Log(const std::string& line) {
    char stamp[32];
    std::snprintf(stamp, sizeof(stamp), "[%6.1fs] ", Seconds(start_));
    log_ << stamp << line << "\n" << std::flush;
  }
  TopKGeneratorOptions GeneratorOptions(int32_t context, bool miss_rate_mode, double rate) const;
  bool TimeIsUp() const { return c_.time_limit_s > 0 && Seconds(start_) > c_.time_limit_s; }

  const BenchConfig& c_;
  std::shared_ptr<Backend> cuda_;
  std::ostream& log_;
  Clock::time_point start_;
  cudaStream_t stream_ = nullptr;
  E2EReport report_;
  Shared shared_;
  std::vector<ContextPlan> plans_;
  std::shared_ptr<ArenaBackend> arena_;
  int64_t skipped_points_ = 0;
  std::vector<std::byte> reference_;    // full-hbm's check output at the current context
  std::unique_ptr<StepTracer> tracer_;  // --trace-step
  KVGeometry geometry_;                 // the manager's layers (BenchGeometry)
  // DeepSeek-V4: the raw window, and the tokens per entry of the CSA layers (what the top-k rows
  // name); 0 and 1 for the other presets.
  int32_t raw_window_ = 0;
  int32_t entry_tokens_ = 1;
  std::optional<IndexGroups> groups_;  // set by Plan: the groups the feed generates a top-k for
};

TopKGeneratorOptions E2ERun::GeneratorOptions(int32_t context, bool miss_rate_mode,
                                              double rate) const {
  TopKGeneratorOptions g;
  g.top_k = c_.top_k;
  g.reuse = c_.reuse;
  g.recency = c_.recency;
  g.sinks = c_.sinks;
  g.seed = c_.seed;
  if (!c_.locality.empty() && !miss_rate_mode) {  // --locality: a fitted preset
    g = *LocalityPreset(c_.locality == "calibrated" ? "glm5-published" : c_.locality);
    g.top_k = c_.top_k;
    g.seed = c_.seed;
  }
  if (miss_rate_mode) {
    g.miss_rate = rate;
    g.fresh_range = context / entry_tokens_;  // the rows name entries
  }
  if (c_.cross_layer_overlap >= 0) g.cross_layer_overlap = c_.cross_layer_overlap;
  if (c_.locality.empty() && c_.cross_layer_overlap < 0) g.cross_layer_overlap = 0;
  return g;
}

Status E2ERun::Plan(const ModelPreset& preset) {
  // The index groups every variant reads a top-k by (one per group, from the feed), and the
  // layers the manager takes: the budget and the hybrid sizing count the groups' replacement
  // states and the keyed layers' keys, as the manager does.
  RequestShape shape = E2ERequestShape(c_, preset);
  geometry_ = BenchGeometry(c_, preset);
  groups_.emplace(BenchIndexGroups(c_, preset));
  if (HasDenseLayers(preset)) {
    raw_window_ = preset.raw_window;
    for (const LayerShape& l : geometry_.layers) {
      if (l.kind == LayerKind::kOffloaded) entry_tokens_ = l.entry_tokens;
    }
  }
  shared_.shape = shape;
  const int64_t hbm = static_cast<int64_t>(c_.hbm_budget_gb * 1e9);
  const int64_t host = static_cast<int64_t>(c_.host_pool_gb * 1e9);
  const int32_t rates = std::max<int32_t>(1, static_cast<int32_t>(c_.miss_rates.size()));
  const int32_t batch = c_.batch_given ? c_.batch : 0;
  const int32_t steps = c_.steps + (c_.trace_step ? 1 : 0);  // per point: the traced one too
  std::vector<int32_t> contexts = c_.contexts.empty() ? std::vector{c_.context} : c_.contexts;
  for (int32_t context : contexts) {
    ContextPlan cp;
    cp.context = context;
    shape.tokens = context;
    bool full = false;
    cp.check_batch = kCheckBatch;
    // sparsekv is also measured at full-hbm's largest batch, so that the two compare at every
    // batch full-hbm holds.
    int32_t full_max = 0;
    if (std::find(c_.variants.begin(), c_.variants.end(), "full-hbm") != c_.variants.end()) {
      full_max = PlanVariant(KVVariant::kFullHbm, shape, hbm, host,
                             BatchCap(c_, KVVariant::kFullHbm), rates, steps, kCheckSteps, batch)
                     .max_batch;
    }
    for (const std::string& name : c_.variants) {
      SPARSEKV_ASSIGN_OR_RETURN(const KVVariant kind, ParseVariant(name));
      const bool budgeted = c_.hybrid && kind == KVVariant::kSparseKV;
      const int32_t also = kind == KVVariant::kSparseKV ? full_max : 0;
      BudgetedHotCache hot;
      VariantPlan vp = budgeted ? PlanBudgetedVariant(shape, hbm, host, BatchCap(c_, kind), rates,
                                                      steps, kCheckSteps, batch, &hot, also)
                                : PlanVariant(kind, shape, hbm, host, BatchCap(c_, kind), rates,
                                              steps, kCheckSteps, batch, also);
      if (kind == KVVariant::kFullHbm && batch > 0 && vp.batches.empty() && vp.max_batch >= 1) {
        // full-hbm is the reference: at a --batch it cannot hold, its own sweep (its peak for
        // the ratios, its attention for the check).
        report_.notes.push_back("full-hbm @" + std::to_string(context / 1024) + "K: --batch " +
                                std::to_string(batch) + " exceeds the " +
                                std::to_string(vp.max_batch) +
                                " it holds: its sweep instead, the reference of the ratios");
        vp = PlanVariant(kind, shape, hbm, host, BatchCap(c_, kind), rates, steps, kCheckSteps, 0,
                         0);
      }
      if (budgeted) {
        cp.budgeted = hot;
        char note[200];
        std::snprintf(note, sizeof(note),
                      "sparsekv @%dK: hybrid residency, hot cache %.1f GB for batch %d -> %d "
                      "slots per request and layer (chosen)",
                      context / 1024, hot.hot_cache_bytes / 1e9, hot.max_batch, hot.hot_slots);
        report_.notes.push_back(note);
      }
      full = full || kind == KVVariant::kFullHbm;
      cp.check_batch = std::min(cp.check_batch, vp.max_batch);
      shared_.max_batch = std::max(shared_.max_batch, vp.max_batch);
      if (kind == KVVariant::kFullHbm) {
        cp.variants.insert(cp.variants.begin(),
                           std::make_pair(kind, vp));  // first: the check's reference
      } else {
        cp.variants.push_back(std::make_pair(kind, vp));
      }
    }
    if (!full) cp.check_batch = 0;
    plans_.push_back(cp);
  }
  return Status::Ok();
}

Status E2ERun::Setup(const ModelPreset& preset) {
  const RequestShape& shape = shared_.shape;
  // One pinned arena for the largest host pool of the run (plus the pools' per-layer rounding).
  int64_t host_bytes = 0;
  for (const ContextPlan& cp : plans_) {
    for (const auto& [kind, vp] : cp.variants) {
      host_bytes = std::max(host_bytes, vp.footprint.host_bytes * vp.max_batch);
    }
  }
  host_bytes += int64_t{shape.layers} * (2 << 20);
  host_bytes = std::max<int64_t>(host_bytes, kCeilingBytes);
  Log("pinning a " + std::to_string(host_bytes / 1000000000.0).substr(0, 5) + " GB host arena");
  // A progress line every 5 s while the arena is populated and registered, in chunks.
  HostMemoryOptions pinning;
  double next_line_s = 5;
  pinning.progress = [&](const HostMemoryProgress& p) {
    if (p.elapsed_seconds < next_line_s) return;
    next_line_s = p.elapsed_seconds + 5;
    char line[160];
    std::snprintf(line, sizeof(line),
                  "host arena: %.1f of %.1f GB populated, %.1f GB ready (%d of %d chunks)",
                  p.populated_bytes / 1e9, p.total_bytes / 1e9, p.registered_bytes / 1e9,
                  p.registered_chunks, p.chunks);
    Log(line);
  };
  SPARSEKV_ASSIGN_OR_RETURN(arena_,
                            ArenaBackend::Create(cuda_, static_cast<size_t>(host_bytes), pinning));
  {
    const HostRegistration& r = arena_->arena_registration();
    const HostMemoryPlacement& at = r.placement();
    const std::string where =
        at.numa_node < 0   ? "no NUMA node known"
        : at.bound_to_node ? "NUMA node " + std::to_string(at.numa_node)
                           : "NUMA node " + std::to_string(at.numa_node) + " unbound (no libnuma)";
    char line[200];
    std::snprintf(line, sizeof(line),
                  "host arena ready: %.2f GB in %.1f s (%.2f GB/s; %zu chunks, %d threads, %s)",
                  r.bytes() / 1e9, r.ready_seconds(),
                  r.bytes() / 1e9 / std::max(r.ready_seconds(), 1e-9), r.chunks().size(),
                  at.threads, where.c_str());
    Log(line);
    report_.host_pool_ready_s = r.ready_seconds();
    report_.host_pool_ready_gb_per_s = r.bytes() / 1e9 / std::max(r.ready_seconds(), 1e-9);
  }
  report_.host_pool_pinned_gb = arena_->arena_bytes() / 1e9;
  SPARSEKV_ASSIGN_OR_RETURN(report_.ceilings,
                            MeasureCeilings(arena_->arena(), kCeilingBytes, stream_));
  Log("ceilings: H2D " + std::to_string(report_.ceilings.pcie_h2d_gbps) + " GB/s, D2H " +
      std::to_string(report_.ceilings.pcie_d2h_gbps) + " GB/s, device copy " +
      std::to_string(report_.ceilings.hbm_gbps) + " GB/s");

  const int32_t max_batch = std::max(shared_.max_batch, 1);
  const int32_t query_rows = max_batch * c_.mtp;  // attention and proxy rows (--mtp)
  shared_.queries = c_.mtp;
  if (raw_window_ > 0) {  // DeepSeek-V4: two scopes over its entries
    SparseEntryAttentionOptions eo;
    eo.max_batch = query_rows;
    eo.heads = c_.heads;
    SPARSEKV_ASSIGN_OR_RETURN(shared_.entry_attention, SparseEntryAttention::Create(eo));
    shared_.q_dims = FormatShape(c_.row_format).key_dims;
  } else {
    SparseMLAOptions ao;
    ao.max_batch = query_rows;
    ao.heads = c_.heads;
    ao.top_k = c_.top_k;
    ao.format = c_.row_format;
    SPARSEKV_ASSIGN_OR_RETURN(shared_.attention, SparseMLAAttention::Create(ao));
  }
  if (c_.proxy) {
    // Per-layer bytes from the preset's full layer count, so that --layers does not change them.
    const int64_t per_layer = static_cast<int64_t>(c_.weights_gb * 1e9 / preset.num_layers);
    SPARSEKV_ASSIGN_OR_RETURN(shared_.proxy, WeightStreamProxy::Create(query_rows, per_layer));
    report_.proxy_bytes_per_layer = shared_.proxy->bytes_per_layer();
  }
  shared_.heads = c_.heads;
  SPARSEKV_ASSIGN_OR_RETURN(
      shared_.q,
      DeviceBuffer::Allocate(size_t(query_rows) * c_.heads * shared_.q_dims * 2, kBenchMemory));
  SPARSEKV_ASSIGN_OR_RETURN(
      shared_.out,
      DeviceBuffer::Allocate(size_t(query_rows) * c_.heads * kMLAValueDim * 2, kBenchMemory));
  SPARSEKV_ASSIGN_OR_RETURN(
      shared_.new_rows,
      DeviceBuffer::Allocate(size_t(shape.layers) * max_batch * shape.row_bytes, kBenchMemory));
  SPARSEKV_CUDA_RETURN_IF_ERROR(gpu::FillBf16(
      shared_.q.get(), int64_t{query_rows} * c_.heads * shared_.q_dims, c_.seed, stream_));
  // The new tokens' rows (the same at every step): the content of an out-of-prompt position.
  for (int32_t l = 0; l < shape.layers; ++l) {
    for (int32_t b = 0; b < max_batch; ++b) {
      SPARSEKV_CUDA_RETURN_IF_ERROR(gpu::FillKVRows(
          shared_.new_rows.get<std::byte>(), shape.row_bytes, int64_t{l} * max_batch + b, 1,
          shape.row_bytes, b, l, -1, c_.seed + 1, stream_));
    }
  }
  return CudaStatus(cudaStreamSynchronize(stream_), "set-up");
}

Status E2ERun::RunVariant(const ContextPlan& plan, KVVariant kind, const VariantPlan& vp) {
  const std::string label =
      std::string(VariantName(kind)) + " @" + std::to_string(plan.context / 1024) + "K";
  if (vp.max_batch < 1 || vp.batches.empty()) {
    report_.notes.push_back(label + ": no batch fits the budgets (or --batch exceeds the max " +
                            std::to_string(vp.max_batch) + ")");
    return Status::Ok();
  }
  if (TimeIsUp()) {  // filling a variant takes seconds: not for points that would be skipped
    skipped_points_ += static_cast<int64_t>(vp.batches.size()) *
                       (DependsOnMissRate(kind) ? std::max<size_t>(1, c_.miss_rates.size()) : 1);
    return Status::Ok();
  }
  VariantSetup setup;
  setup.shape = shared_.shape;
  setup.shape.tokens = plan.context + vp.headroom;
  setup.context = plan.context;
  setup.max_batch = vp.max_batch;
  setup.seed = c_.seed;
  setup.cache_base = c_.cache_base;
  setup.geometry = geometry_;
  setup.layers_per_index = c_.layers_per_index;
  setup.sort_misses = c_.sort_misses;
  setup.sort_misses_min_batch = c_.sort_misses_min_batch;
  setup.copy_blocks = c_.copy_blocks;
  setup.fused_copy_min_batch = c_.fused_copy_min_batch;
  setup.prefetch_copy_blocks = c_.prefetch_copy_blocks;
  setup.copy_chunk_rows = c_.copy_chunk_rows;
  setup.copy_strategy = c_.copy_strategy == "lattice-wide" ? CopyStrategy::kLatticeWide
                        : c_.copy_strategy == "warp-rows"  ? CopyStrategy::kWarpRows
                        : c_.copy_strategy == "bulk"       ? CopyStrategy::kBulk
                                                           : CopyStrategy::kLattice;
  setup.crosslayer_prefetch = c_.crosslayer_prefetch;
  setup.planned_copy = c_.planned_copy;
  setup.auto_schedule = c_.schedule == "auto";
  setup.queries = c_.mtp;
  setup.raw_window = raw_window_;
  setup.format = c_.row_format;
  // DeepSeek-V4: every variant's HCA scopes as wide as the most positions any of them holds.
  for (const auto& [other, other_plan] : plan.variants) {
    setup.scope_tokens = std::max<int64_t>(setup.scope_tokens, plan.context + other_plan.headroom);
  }
  if (kind == KVVariant::kSparseKV) setup.peer_device = c_.peer_device;
  if (c_.hybrid && kind == KVVariant::kSparseKV) {
    setup.hybrid = true;
    setup.device_budget_bytes = plan.budgeted.hot_cache_bytes;
    setup.shape.hot_slots = plan.budgeted.hot_slots;  // what the manager chooses, for Traffic()
  }
  // Only sparsekv has copies to leave SMs to.
  const int32_t sms = kind == KVVariant::kSparseKV ? c_.compute_sms : 0;
  SPARSEKV_RETURN_IF_ERROR(shared_.attention->SetSmCountTarget(sms));
  if (shared_.proxy) SPARSEKV_RETURN_IF_ERROR(shared_.proxy->SetSmCountTarget(sms));
  Log(label + ": filling " + std::to_string(vp.max_batch) + " requests");
  SPARSEKV_ASSIGN_OR_RETURN(std::unique_ptr<StepVariant> v,
                            CreateVariant(kind, setup, arena_, stream_));
  Requests req;
  req.lens.assign(vp.max_batch, plan.context);
  int32_t live = setup.hybrid ? 0 : vp.max_batch;  // hybrid: requests [0, live) are admitted

  if (plan.check_batch > 0) {
    SPARSEKV_ASSIGN_OR_RETURN(
        auto feed, TopKFeed::Create(GeneratorOptions(plan.context, true, kCheckMissRate), *groups_,
                                    plan.check_batch, c_.mtp, entry_tokens_));
    SPARSEKV_RETURN_IF_ERROR(SetLiveBatch(*v, setup, plan.check_batch, req, live));
    SPARSEKV_ASSIGN_OR_RETURN(std::vector<std::byte> out,
                              RunCheck(*v, shared_, *feed, req, plan.check_batch, stream_));
    if (kind == KVVariant::kFullHbm) {
      reference_ = std::move(out);
    } else {
      E2ECheck check;
      check.preset = report_.preset;
      check.variant = kind;
      check.context = plan.context;
      check.batch = plan.check_batch;
      check.steps = kCheckSteps;
      check.bytes_compared = static_cast<int64_t>(std::min(out.size(), reference_.size()));
      for (int64_t i = 0; i < check.bytes_compared; ++i) {
        check.bytes_different += out[i] != reference_[i];
      }
      if (out.size() != reference_.size()) check.bytes_different += 1;
      check.output_nonzero = std::any_of(reference_.begin(), reference_.end(),
                                         [](std::byte b) { return b != std::byte{0}; });
      Log(label + ": check vs full-hbm " + (check.passed() ? "PASS" : "FAIL"));
      report_.checks.push_back(check);
    }
  }

  // --locality replaces the miss-rate sweep: one point per batch, the miss rate an outcome.
  const bool miss_rate_mode = !c_.miss_rates.empty() && c_.locality.empty();
  const double first_rate = miss_rate_mode ? c_.miss_rates.front() : 0;
  SPARSEKV_ASSIGN_OR_RETURN(
      auto feed, TopKFeed::Create(GeneratorOptions(plan.context, miss_rate_mode, first_rate),
                                  *groups_, vp.max_batch, c_.mtp, entry_tokens_));
  // Only sparsekv and page-offload depend on the miss rate: the others run once, labelled with no
  // target.
  std::vector<double> rates = {first_rate};
  if (DependsOnMissRate(kind) && miss_rate_mode) rates = c_.miss_rates;
  const int32_t warmup = std::max(1, c_.warmup_steps);  // the capture step is never timed
  for (double rate : rates) {
    if (miss_rate_mode) feed->SetMissRate(rate);
    for (int32_t batch : vp.batches) {
      if (TimeIsUp()) {
        ++skipped_points_;
        continue;
      }
      SPARSEKV_RETURN_IF_ERROR(SetLiveBatch(*v, setup, batch, req, live));
      SPARSEKV_ASSIGN_OR_RETURN(
          const PointTiming t,
          RunPoint(*v, shared_, *feed, req, batch, c_.steps, warmup, stream_, tracer_.get()));
      E2EPoint p;
      p.preset = report_.preset;
      p.variant = kind;
      p.context = plan.context;
      if (DependsOnMissRate(kind) && miss_rate_mode) p.miss_rate_target = rate;
      p.batch = batch;
      p.max_batch = vp.max_batch;
      p.hot_slots = setup.shape.hot_slots;
      p.resident_requests = t.stats.resident_requests;
      p.schedule = t.stats.schedule;
      p.schedule_reason = t.stats.schedule_reason;
      p.timed_steps = static_cast<int32_t>(t.tpot_ms.size());
      p.tpot_ms = Median(t.tpot_ms);
      p.tpot_min_ms = *std::min_element(t.tpot_ms.begin(), t.tpot_ms.end());
      p.tpot_max_ms = *std::max_element(t.tpot_ms.begin(), t.tpot_ms.end());
      p.tokens_per_s = batch * 1e3 / p.tpot_ms;
      p.hbm_bytes_per_request = vp.footprint.hbm_bytes;
      p.host_bytes_per_request = vp.footprint.host_bytes;
      p.hit_rate = t.stats.lookups > 0 ? 1 - t.stats.misses / t.stats.lookups : 0;
      p.miss_rate = 1 - p.hit_rate;
      p.misses_per_step = t.stats.misses / std::max(1, p.timed_steps);
      // DeepSeek-V4: per layer kind (the entries' scopes at the run's positions).
      const StepTraffic traffic =
          setup.shape.classes.empty()
              ? Traffic(kind, setup.shape, batch, p.misses_per_step)
              : EntryTraffic(
                    kind,
                    EntryLayerScopesOf(geometry_, c_.top_k, raw_window_, plan.context + c_.steps),
                    setup.shape.hot_slots, batch, p.misses_per_step);
      p.prefetch_rows_per_step = t.stats.prefetched / std::max(1, p.timed_steps);
      p.pcie_bytes_per_step = traffic.pcie_bytes + p.prefetch_rows_per_step * setup.shape.row_bytes;
      p.pcie_gbps = traffic.pcie_bytes / (p.tpot_ms * 1e6);
      p.pcie_to_ceiling = p.pcie_gbps / report_.ceilings.pcie_h2d_gbps;
      p.attention_us_per_layer = t.attention_us_per_layer;
      p.proxy_us_per_layer = t.proxy_us_per_layer;
      p.topk_host_ms = Median(t.topk_host_ms);
      p.topk_upload_ms = Median(t.topk_upload_ms);
      const int32_t layers = shared_.shape.layers;
      p.floor_ms = StepFloorMs(traffic, report_.ceilings, p.attention_us_per_layer * layers / 1e3,
                               p.proxy_us_per_layer * layers / 1e3);
      p.ideal_ms = StepIdealMs(traffic, report_.ceilings, p.attention_us_per_layer * layers / 1e3,
                               p.proxy_us_per_layer * layers / 1e3);
      p.step_to_floor = p.tpot_ms / p.floor_ms;
      char line[256];
      std::snprintf(line, sizeof(line),
                    "%s miss %s batch %d: TPOT %.2f ms, %.0f tok/s, hit %.1f%%, floor x%.2f",
                    label.c_str(), p.miss_rate_target ? Pct(rate).c_str() : "-", batch, p.tpot_ms,
                    p.tokens_per_s, 100 * p.hit_rate, p.step_to_floor);
      Log(line);
      report_.points.push_back(p);
      if (t.trace) {
        Log(label + " miss " + (p.miss_rate_target ? Pct(rate) : "-") + " batch " +
            std::to_string(batch) + ": traced step: " + FormatStepTraceLine(*t.trace));
        report_.step_traces.push_back({std::string(VariantName(kind)), plan.context, batch,
                                       p.miss_rate_target, p.tpot_ms, *t.trace});
      }
    }
  }
  return Status::Ok();
}

Status E2ERun::SetLiveBatch(StepVariant& v, const VariantSetup& setup, int32_t batch, Requests& req,
                            int32_t& live) {
  // With hybrid residency the variant releases the requests past the batch and admits new ones
  // as it grows: those start again at the context length.
  if (setup.hybrid) {
    for (int32_t b = std::min(live, batch); b < batch; ++b) req.lens[b] = setup.context;
    live = batch;
  }
  return v.SetLiveBatch(batch, stream_);
}

Status E2ERun::RunContext(const ContextPlan& plan) {
  reference_.clear();
  if (plan.check_batch == 0) {
    report_.notes.push_back("no correctness check at " + std::to_string(plan.context) +
                            " (needs full-hbm and a batch for every variant)");
  }
  // The miss-rate mode is exact once the fresh range exceeds hot slots + fresh positions.
  double max_rate = 0;
  for (double m : c_.miss_rates) max_rate = std::max(max_rate, m);
  if (!c_.miss_rates.empty() && plan.context < c_.hot_slots + max_rate * c_.top_k) {
    report_.notes.push_back("context " + std::to_string(plan.context) +
                            " < hot slots + fresh positions: the measured miss rate may fall "
                            "below its target");
  }
  for (const auto& [kind, vp] : plan.variants) {
    SPARSEKV_RETURN_IF_ERROR(RunVariant(plan, kind, vp));
  }
  return Status::Ok();
}

StatusOr<E2EReport> E2ERun::Run() {
  SPARSEKV_ASSIGN_OR_RETURN(const ModelPreset preset, FindPreset(c_.preset, c_.row_format));
  SPARSEKV_RETURN_IF_ERROR(CheckE2ELayers(c_, preset));
  SPARSEKV_RETURN_IF_ERROR(Plan(preset));
  report_.device = cuda_->name();
  if (c_.peer_device >= 0) {
    int device = 0;
    SPARSEKV_RETURN_IF_ERROR(CudaStatus(cudaGetDevice(&device), "cudaGetDevice"));
    report_.notes.push_back(
        "sparsekv reads misses on prompt rows from a peer region on CUDA device " +
        std::to_string(c_.peer_device) +
        (c_.peer_device == device ? " (the decode GPU itself: a same-GPU stand-in, not a peer link)"
                                  : ""));
  }
  report_.preset = c_.preset;
  report_.precision = PrecisionName(c_.row_format);
  report_.layers = shared_.shape.layers;
  report_.row_bytes = shared_.shape.row_bytes;
  report_.top_k = c_.top_k;
  report_.hot_slots = c_.hot_slots;
  report_.window = c_.window;
  report_.page_tokens = c_.page_tokens;
  report_.offload_page_tokens = c_.offload_page_tokens;
  report_.heads = c_.heads;
  report_.proxy = c_.proxy;
  report_.proxy_weights_gb = c_.proxy ? c_.weights_gb : 0;
  report_.hbm_budget_gb = c_.hbm_budget_gb;
  report_.host_pool_gb = c_.host_pool_gb;
  report_.steps = c_.steps;
  if (c_.mtp > 1) {
    report_.notes.push_back(std::to_string(c_.mtp) +
                            " query tokens per request and step (--mtp): tpot_ms is the step's "
                            "time, attention and the proxy run batch * " +
                            std::to_string(c_.mtp) +
                            " rows, and top_k is per query (a request's row holds " +
                            std::to_string(c_.mtp) + " * top_k entries)");
  }
  if (groups_->named()) {
    report_.notes.push_back(
        std::to_string(groups_->count()) + " index groups over " +
        std::to_string(groups_->layers()) + " layers, named by --preset " + c_.preset +
        ": one top-k per group, read by every layer of it in every variant; indexer keys on " +
        std::to_string(shared_.shape.keyed_layers) + " layers (the groups' first)");
  } else if (c_.layers_per_index > 1) {
    report_.notes.push_back("layers share a top-k in groups of " +
                            std::to_string(c_.layers_per_index) +
                            " (--layers-per-index); every variant reads the same top-k");
  }
  if (raw_window_ > 0) {
    report_.notes.push_back(
        "DeepSeek-V4's layer kinds: CSA layers offloaded (top-k over entries of " +
        std::to_string(entry_tokens_) +
        " tokens), HCA layers resident, window-only layers, a raw "
        "window of " +
        std::to_string(raw_window_) +
        " in each; attention through SparseEntryAttention in both variants; sparsekv copies its "
        "resident entries and raw windows into staging before each layer's attention (a copy "
        "full-hbm does not make), so its figures are a lower bound");
  }
  report_.warmup_steps = std::max(1, c_.warmup_steps);
  if (c_.trace_step) {
    SPARSEKV_ASSIGN_OR_RETURN(tracer_, StepTracer::Create());
    report_.notes.push_back(
        "--trace-step: each point ran one more step after its timed ones, traced with CUPTI; "
        "the timed steps of later points ran with CUPTI attached but recording nothing");
  }

  SPARSEKV_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  Status s = Setup(preset);
  for (size_t i = 0; s.ok() && i < plans_.size(); ++i) s = RunContext(plans_[i]);
  cudaStreamDestroy(stream_);
  SPARSEKV_RETURN_IF_ERROR(s);
  if (skipped_points_ > 0) {
    report_.notes.push_back(std::to_string(skipped_points_) + " points not run: --time-limit of " +
                            std::to_string(c_.time_limit_s) + " s reached");
  }
  return std::move(report_);
}

}  // namespace

StatusOr<E2EReport> RunE2EBench(const BenchConfig& config, std::shared_ptr<Backend> cuda,
                                std::ostream& log) {
  if (cuda == nullptr || cuda->kind() != BackendKind::kCuda) {
    return InvalidArgument("RunE2EBench: needs a CUDA backend");
  }
  E2ERun run(config, std::move(cuda), log);
  return run.Run();
}

}  // namespace sparsekv::tools
