#include "tools/sparsekv/bench/bench_command.h"

#include <CLI/CLI.hpp>
#include <chrono>
#include <tuple>
#include <utility>

#include "sparsekv/config.h"
#include "tools/sparsekv/bench/gpu_bench.h"
#include "tools/sparsekv/common/exit_codes.h"
#include "tools/sparsekv/common/output_file.h"
#include "tools/sparsekv/common/preset_flags.h"
#include "tools/sparsekv/common/progress.h"
#include "tools/sparsekv/common/validators.h"

namespace sparsekv::tools {
namespace {

std::string GpuOnlyMessage(const std::string& names) {
  return names +
         ": read only by the end-to-end GPU benchmark, and the CPU backend would ignore them; "
         "leave them out, or run on a GPU";
}

int UsageError(std::ostream& err, const std::string& message) {
  err << "sparsekv bench: " << message << "\nRun with --help for more information.\n";
  return kExitUsage;
}

std::string CopyStrategyFlag(CopyStrategy s) {
  switch (s) {
    case CopyStrategy::kLatticeWide:
      return "lattice-wide";
    case CopyStrategy::kWarpRows:
      return "warp-rows";
    case CopyStrategy::kBulk:
      return "bulk";
    case CopyStrategy::kLattice:
      break;
  }
  return "lattice";
}

// A flag of the bench, the CacheOptions key it sets, and how a --config file's value of that key
// becomes the bench's (null: another flag of the same key applies it).
struct FlagField {
  const char* flag;
  const char* key;
  void (*apply)(const CacheOptions& file, BenchConfig& c);
};
const FlagField kFlagFields[] = {
    {"--preset", "geometry", nullptr},
    {"--precision", "geometry", nullptr},
    {"--layers", "geometry",
     [](const CacheOptions& f, BenchConfig& c) {
       c.layers = f.geometry.num_layers();
       c.row_format = f.geometry.layers[0].row_bytes == 1152 ? KVRowFormat::kBf16Row1152
                                                             : KVRowFormat::kFp8Row656;
     }},
    {"--top-k", "top_k", [](const CacheOptions& f, BenchConfig& c) { c.top_k = f.top_k; }},
    {"--hot-slots", "hot_slots",
     [](const CacheOptions& f, BenchConfig& c) { c.hot_slots = f.hot_slots; }},
    {"--window", "window", [](const CacheOptions& f, BenchConfig& c) { c.window = f.window; }},
    {"--page-tokens", "host_page_tokens",
     [](const CacheOptions& f, BenchConfig& c) { c.page_tokens = f.host_page_tokens; }},
    {"--layers-per-index", "layers_per_index",
     [](const CacheOptions& f, BenchConfig& c) { c.layers_per_index = f.layers_per_index; }},
    {"--sort-misses", "sort_misses",
     [](const CacheOptions& f, BenchConfig& c) { c.sort_misses = f.sort_misses; }},
    {"--sort-misses-min-batch", "sort_misses_min_batch",
     [](const CacheOptions& f, BenchConfig& c) {
       c.sort_misses_min_batch = f.sort_misses_min_batch;
     }},
    {"--copy-blocks", "copy_blocks",
     [](const CacheOptions& f, BenchConfig& c) { c.copy_blocks = f.copy_blocks; }},
    {"--prefetch-copy-blocks", "prefetch_copy_blocks",
     [](const CacheOptions& f, BenchConfig& c) {
       c.prefetch_copy_blocks = f.prefetch_copy_blocks;
     }},
    {"--fused-copy-min-batch", "fused_copy_min_batch",
     [](const CacheOptions& f, BenchConfig& c) {
       c.fused_copy_min_batch = f.fused_copy_min_batch;
     }},
    {"--copy-chunk-rows", "copy_chunk_rows",
     [](const CacheOptions& f, BenchConfig& c) { c.copy_chunk_rows = f.copy_chunk_rows; }},
    {"--copy-strategy", "copy_strategy",
     [](const CacheOptions& f, BenchConfig& c) {
       c.copy_strategy = CopyStrategyFlag(f.copy_strategy);
     }},
    {"--hybrid", "hybrid_residency",
     [](const CacheOptions& f, BenchConfig& c) { c.hybrid = f.hybrid_residency; }},
};

// The bench runs the presets' row formats (the GPU's attention reads them): every layer alike,
// 656 B (fp8) or 1152 B (bf16), packed.
Status CheckBenchGeometry(const ConfigFile& file) {
  const KVGeometry& g = file.options.geometry;
  bool runs = true;
  for (const LayerShape& l : g.layers) {
    runs = runs && l.row_bytes == g.layers[0].row_bytes && l.row_stride == l.row_bytes &&
           (l.row_bytes == 656 || l.row_bytes == 1152);
  }
  if (runs) return Status::Ok();
  return InvalidArgument("--config " + file.path +
                         ": geometry: the bench runs the presets' rows, every layer alike and "
                         "packed: row_bytes 656 (fp8) or 1152 (bf16) and row_stride = row_bytes; "
                         "the file has row_bytes " +
                         std::to_string(g.layers[0].row_bytes) + ", row_stride " +
                         std::to_string(g.layers[0].row_stride) + " in layer 0");
}

}  // namespace

BenchCommand::BenchCommand(CLI::App& parent) {
  const BenchConfig d;
  const CpuScaleDown cpu;
  app_ = parent.add_subcommand(
      "bench",
      "End-to-end decode benchmark on the real cache manager with synthetic top-k selections. "
      "On the CPU reference backend, defaults not given are scaled down so that it finishes in "
      "seconds.");
  auto both = [](int64_t gpu, int64_t cpu) {
    return " [default: " + std::to_string(gpu) +
           (gpu == cpu ? "" : "; CPU: " + std::to_string(cpu)) + "]";
  };
  app_->add_option("--preset", config_.preset, "model shape")
      ->check(ManagerPreset())
      ->capture_default_str();
  app_->add_option("--precision", precision_, "KV row format: fp8 (656 B) or bf16 (1152 B)")
      ->check(CLI::IsMember({"fp8", "bf16"}))
      ->capture_default_str();
  layers_ =
      app_->add_option(
              "--layers", config_.layers,
              "attention layers [default: the preset's; CPU: " + std::to_string(cpu.layers) + "]")
          ->check(Between<int64_t>(1, 1000));
  app_->add_option("--backend", backend_, "auto: cuda if a GPU is usable, else cpu")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}))
      ->capture_default_str();
  batch_ = app_->add_option("--batch", config_.batch,
                            "requests decoding together" + both(d.batch, cpu.batch))
               ->check(AtLeast<int32_t>(1));
  context_ = app_->add_option("--context", config_.context,
                              "prompt tokens per request" + both(d.context, cpu.context))
                 ->check(AtLeast<int32_t>(1));
  steps_ = app_->add_option("--steps", config_.steps,
                            "decode steps, warm-up included" + both(d.steps, cpu.steps))
               ->check(AtLeast<int32_t>(1));
  app_->add_option("--warmup", config_.warmup_steps, "first steps excluded from timing and stats")
      ->check(AtLeast<int32_t>(0))
      ->capture_default_str();
  top_k_ = app_->add_option("--top-k", config_.top_k,
                            "positions selected per request and layer" + both(d.top_k, cpu.top_k))
               ->check(AtLeast<int32_t>(1));
  hot_slots_ =
      app_->add_option("--hot-slots", config_.hot_slots,
                       "LRU slots per request and layer in HBM" + both(d.hot_slots, cpu.hot_slots))
          ->check(AtLeast<int32_t>(1));
  app_->add_option("--window", config_.window, "newest tokens always resident")
      ->check(AtLeast<int32_t>(1))
      ->capture_default_str();
  app_->add_option("--page-tokens", config_.page_tokens, "host pool page size in tokens")
      ->check(AtLeast<int32_t>(1))
      ->capture_default_str();
  app_->add_option("--reuse", config_.reuse,
                   "fraction of each layer's top-k reused from the previous step (the first two "
                   "layers reuse almost nothing)")
      ->check(Fraction())
      ->capture_default_str();
  app_->add_option("--recency", config_.recency,
                   "fraction of the top-k drawn from the newest 10% of positions")
      ->check(Fraction())
      ->capture_default_str();
  app_->add_option("--sinks", config_.sinks, "the first N positions are always selected")
      ->check(AtLeast<int32_t>(0))
      ->capture_default_str();
  app_->add_option("--seed", config_.seed, "random seed")->check(Unsigned())->capture_default_str();
  app_->add_flag("--assemble", config_.assemble,
                 "also gather the selected rows into a dense [batch, top-k, row] buffer");
  app_->add_option("--json", json_path_, "also write the results as JSON to PATH")
      ->option_text("PATH")
      ->check(NonEmpty());
  app_->add_option("--config", config_path_,
                   "CacheOptions from FILE, sparsekv's own JSON (docs/config.md): it sets the "
                   "fields it names, flags only those it leaves out (a flag for a field it "
                   "names is refused); the bench sizes the host pool and request limits for "
                   "its own batch and context")
      ->option_text("FILE")
      ->check(NonEmpty());
  AddGpuOptions();
}

// End to end (GPU; docs/benchmark.md). Every option that only the GPU run reads says "GPU:"
// first in its description: GpuOnlyOptionsGiven() refuses those on the CPU backend by it.
void BenchCommand::AddGpuOptions() {
  app_->add_option("--miss-rate", config_.miss_rates,
                   "target miss rates, comma-separated: the generator keeps each request's "
                   "previous top-k and replaces round(rate * top-k) of it with positions outside "
                   "the hot cache (one value on the CPU) [default: locality parameters decide]")
      ->delimiter(',')
      ->check(Fraction());
  app_->add_option("--locality", config_.locality,
                   "GPU: draw the timed steps' top-k from this locality-mode preset instead of "
                   "the --miss-rate sweep (docs/workload.md): one point per batch, the miss rate "
                   "then measured (calibrated = glm5-published) [default: off]")
      ->check(CLI::IsMember({"calibrated", "glm5-published", "smollm2"}));
  app_->add_option("--cross-layer-overlap", config_.cross_layer_overlap,
                   "GPU: share of top-k positions adjacent layers share (0: uncorrelated, the "
                   "worst case) [default: the --locality preset's calibrated value, else 0]")
      ->check(Fraction());
  app_->add_option("--contexts", config_.contexts,
                   "GPU: contexts to run, comma-separated [default: --context]")
      ->delimiter(',')
      ->check(AtLeast<int32_t>(1));
  app_->add_option("--variants", config_.variants, "GPU: KV variants to compare, comma-separated")
      ->delimiter(',')
      ->check(CLI::IsMember({"full-hbm", "sparsekv", "no-cache", "page-offload"}))
      ->capture_default_str();
  app_->add_option("--offload-page-tokens", config_.offload_page_tokens,
                   "GPU: page-offload's page in tokens (what it fetches and caches; independent "
                   "of --page-tokens)")
      ->check(Between<int64_t>(1, 4096))
      ->capture_default_str();
  app_->add_option("--offload-max-batch", config_.offload_max_batch,
                   "GPU: cap on page-offload's batch (0: no cap); its page copies saturate PCIe "
                   "at small batches")
      ->check(AtLeast<int32_t>(0))
      ->capture_default_str();
  app_->add_option("--hbm-budget-gb", config_.hbm_budget_gb,
                   "GPU: HBM for everything KV-related, per variant; sets each max batch "
                   "(default: 141 - weights - 8, the preset's weights per GPU if it has them)")
      ->check(PositiveReal())
      ->capture_default_str();
  app_->add_option("--host-pool-gb", config_.host_pool_gb,
                   "GPU: pinned host pool; also caps the offloading variants' batch")
      ->check(PositiveReal())
      ->capture_default_str();
  app_->add_option("--max-batch", config_.max_batch, "GPU: cap on every batch (0: no cap)")
      ->check(AtLeast<int32_t>(0))
      ->capture_default_str();
  app_->add_option("--heads", config_.heads, "GPU: attention query heads per request")
      ->check(Between<int64_t>(1, 1024))
      ->capture_default_str();
  app_->add_option("--layers-per-index", config_.layers_per_index,
                   "GPU: consecutive layers sharing one top-k (a shared indexer); sparsekv "
                   "resolves once per group")
      ->check(Between<int64_t>(1, 128))
      ->capture_default_str();
  app_->add_option("--sort-misses", config_.sort_misses,
                   "GPU: sparsekv's Resolve sorts each request's misses by host row ...")
      ->capture_default_str();
  app_->add_option("--sort-misses-min-batch", config_.sort_misses_min_batch,
                   "GPU: ... in steps of at least this many requests")
      ->check(AtLeast<int32_t>(0))
      ->capture_default_str();
  app_->add_option("--copy-blocks", config_.copy_blocks,
                   "GPU: sparsekv's miss and prefetch copies use at most this many blocks of 256 "
                   "threads (0: as many as the GPU holds)")
      ->check(AtLeast<int32_t>(0))
      ->capture_default_str();
  app_->add_option("--fused-copy-min-batch", config_.fused_copy_min_batch,
                   "GPU: in steps of at least this many requests, sparsekv copies each request's "
                   "misses inside its resolve (0: never)")
      ->check(AtLeast<int32_t>(0))
      ->capture_default_str();
  app_->add_option("--prefetch-copy-blocks", config_.prefetch_copy_blocks,
                   "GPU: sparsekv's prefetch copies use at most this many blocks of 256 threads "
                   "(0: as --copy-blocks)")
      ->check(AtLeast<int32_t>(0))
      ->capture_default_str();
  app_->add_option("--copy-chunk-rows", config_.copy_chunk_rows,
                   "GPU: a pipelined layer: sparsekv copies each chunk of this many batch rows on "
                   "its own, and attention starts on a chunk as soon as it is in (0: off)")
      ->check(AtLeast<int32_t>(0))
      ->capture_default_str();
  app_->add_option("--copy-strategy", config_.copy_strategy,
                   "GPU: how sparsekv's miss copies move their rows")
      ->check(CLI::IsMember({"lattice", "lattice-wide", "warp-rows", "bulk"}))
      ->capture_default_str();
  app_->add_option("--compute-sms", config_.compute_sms,
                   "GPU: sparsekv's attention and proxy GEMMs are planned for this many SMs, the "
                   "rest left to copies beside them (0: all; full-hbm always uses all)")
      ->check(AtLeast<int32_t>(0))
      ->capture_default_str();
  app_->add_option("--peer-device", config_.peer_device,
                   "GPU: the peer tier: sparsekv reads misses on prompt rows from a region on "
                   "this CUDA device (the decode device: a same-GPU stand-in; -1: off)")
      ->check(AtLeast<int32_t>(-1))
      ->capture_default_str();
  app_->add_flag("--hybrid", config_.hybrid,
                 "GPU: sparsekv keeps requests resident in HBM while they fit and sizes its hot "
                 "cache by the HBM budget at the batch the host pool allows (the library chooses "
                 "the slots; --hot-slots is unused)");
  app_->add_flag("--crosslayer-prefetch", config_.crosslayer_prefetch,
                 "GPU: sparsekv prefetches each layer's top-k into the next layer's hot cache "
                 "on a side stream as soon as it is resolved, ahead of that layer's own resolve");
  app_->add_option("--planned-copy", config_.planned_copy,
                   "GPU: sparsekv copies every layer of an index group on a side stream right "
                   "after the group's resolve, each layer's attention waiting for its own copy "
                   "(needs index groups of several layers: --layers-per-index > 1 or glm-5.3), on "
                   "BLOCKS thread blocks (0: the --copy-blocks grid; -1: off)")
      ->check(AtLeast<int32_t>(-1))
      ->capture_default_str();
  app_->add_option("--schedule", config_.schedule,
                   "GPU: sparsekv's step schedule: manual (as --crosslayer-prefetch, "
                   "--planned-copy and --copy-chunk-rows say) or auto (the library measures and "
                   "chooses per step)")
      ->check(CLI::IsMember({"manual", "auto"}))
      ->capture_default_str();
  app_->add_option("--mtp", config_.mtp,
                   "GPU: query tokens per request and step (multi-token prediction), each with "
                   "its own top-k; sparsekv resolves them as one row (full-hbm and sparsekv only)")
      ->check(Between<int64_t>(1, 8))
      ->capture_default_str();
  app_->add_flag("--no-proxy", no_proxy_, "GPU: leave out the weight-streaming proxy");
  app_->add_option("--weights-gb", config_.weights_gb,
                   "GPU: weight bytes the proxy streams per step (per GPU; default: the "
                   "preset's, 84 without)")
      ->check(PositiveReal())
      ->capture_default_str();
  app_->add_flag("--sweep", sweep_,
                 "GPU: the standard sweep: contexts 32K,16K,64K,128K, miss rates 20,5,40 %, "
                 "all variants and batch sizes (--contexts, --miss-rate, --variants and "
                 "--batch, if given, are kept)");
  app_->add_option("--time-limit", config_.time_limit_s,
                   "GPU: seconds after which no new point starts (0: none)")
      ->check(AtLeast(0.0))
      ->capture_default_str();
  app_->add_option("--csv", csv_path_, "GPU: also write one CSV line per point to PATH")
      ->option_text("PATH")
      ->check(NonEmpty());
  app_->add_option("--trace-step", trace_step_path_,
                   "GPU: after each point's timed steps, trace one more replay of its step "
                   "(CUPTI: every kernel's start, end and stream) and write the timelines and "
                   "their summaries as JSON to PATH (scripts/step_profile.py reads it)")
      ->option_text("PATH")
      ->check(NonEmpty());
}

bool BenchCommand::selected() const { return app_->parsed(); }

std::string BenchCommand::GpuOnlyOptionsGiven() const {
  std::string names;
  for (const CLI::Option* o : app_->get_options()) {
    if (o->count() > 0 && o->get_description().rfind("GPU:", 0) == 0) {
      names += (names.empty() ? "" : ", ") + o->get_name();
    }
  }
  return names;
}

Status BenchCommand::ReadConfig() {
  file_.reset();
  if (config_path_.empty()) return Status::Ok();
  std::vector<FlagKey> given;
  for (const FlagField& f : kFlagFields) {
    if (app_->get_option(f.flag)->count() > 0) given.push_back({f.flag, f.key});
  }
  // The fields the file leaves out are the bench's own, as the CPU would run them.
  SPARSEKV_ASSIGN_OR_RETURN(const CacheOptions base, BenchCacheOptions(Resolve(BackendKind::kCpu)));
  SPARSEKV_ASSIGN_OR_RETURN(ConfigFile file, ReadConfigFile(config_path_, given, base));
  SPARSEKV_RETURN_IF_ERROR(CheckBenchGeometry(file));
  file_ = std::move(file);
  return Status::Ok();
}

BenchConfig BenchCommand::Resolve(BackendKind kind) const {
  auto given = [&](const char* name) { return app_->get_option(name)->count() > 0; };
  BenchConfig c = sweep_ ? WithStandardSweep(config_, {.contexts = given("--contexts"),
                                                       .miss_rates = given("--miss-rate"),
                                                       .variants = given("--variants")})
                         : config_;
  c.row_format = precision_ == "bf16" ? KVRowFormat::kBf16Row1152 : KVRowFormat::kFp8Row656;
  // fp8 is the preset's fp8 format: DeepSeek-V4's 584-B entries.
  if (const StatusOr<ModelPreset> p = FindPreset(c.preset);
      precision_ != "bf16" && p.ok() && p->layers[0].format.has_value()) {
    c.row_format = *p->layers[0].format;
  }
  c.proxy = !no_proxy_;
  c.batch_given = batch_->count() > 0;
  c.trace_step = !trace_step_path_.empty();
  // The file's fields, where no flag sets them (ReadConfig refused those that would).
  const auto in_file = [&](const char* key) { return file_.has_value() && file_->Has(key); };
  if (file_.has_value()) {
    c.config_path = file_->path;
    c.config_keys = file_->keys;
    c.cache_base = file_->options;
    for (const FlagField& f : kFlagFields) {
      if (f.apply != nullptr && in_file(f.key)) f.apply(file_->options, c);
    }
  }
  if (kind != BackendKind::kCpu) {
    ApplyPresetScenario(c, given("--weights-gb"), given("--hbm-budget-gb"));
    return c;
  }
  const CpuScaleDown cpu;
  auto scale = [&](const CLI::Option* given, const char* key, int32_t& field, int32_t value) {
    if (given->count() == 0 && !in_file(key) && field != value) {
      field = value;
      c.scaled_down = true;
    }
  };
  scale(layers_, "geometry", c.layers, cpu.layers);
  scale(batch_, "", c.batch, cpu.batch);
  scale(context_, "", c.context, cpu.context);
  scale(steps_, "", c.steps, cpu.steps);
  scale(hot_slots_, "hot_slots", c.hot_slots, cpu.hot_slots);
  scale(top_k_, "top_k", c.top_k, cpu.top_k);
  return c;
}

int BenchCommand::Run(const std::string& command, std::ostream& out, std::ostream& err,
                      bool progress_bar) {
  // Usage errors first, so that they do not wait for a GPU to come up or for the run to end.
  // The CPU shape is the smaller one; the backend's own shape is validated again below.
  for (const auto& [option, path] : {std::pair{"--json", &json_path_},
                                     {"--csv", &csv_path_},
                                     {"--trace-step", &trace_step_path_}}) {
    if (Status s = CheckOutputPath(option, *path); !s.ok()) return UsageError(err, s.message());
  }
  if (Status s = ReadConfig(); !s.ok()) return UsageError(err, s.message());
  if (backend_ == "cpu") {
    if (const std::string gpu_only = GpuOnlyOptionsGiven(); !gpu_only.empty()) {
      return UsageError(err, GpuOnlyMessage(gpu_only));
    }
  }
  // Checked against the GPU's shape unless the run is surely on the CPU, whose shape (scaled
  // down, GPU-only flags refused) is checked below: a refusal must quote the shape that runs.
  const bool surely_cpu = backend_ == "cpu" || (backend_ == "auto" && !CudaBackendCompiled());
  if (!surely_cpu) {
    if (Status s = ValidateBenchConfig(Resolve(BackendKind::kCuda)); !s.ok()) {
      // Without a usable GPU, --backend auto runs on the CPU: say what the CPU refuses.
      if (backend_ == "cuda" || CreateCudaBackend(0).ok()) return UsageError(err, s.message());
    }
  }
  std::shared_ptr<Backend> backend;
  if (backend_ != "cpu") {
    StatusOr<std::shared_ptr<Backend>> cuda = CreateCudaBackend(0);
    if (cuda.ok()) {
      backend = *cuda;
    } else if (backend_ == "cuda") {
      err << "sparsekv bench: " << cuda.status().ToString() << "\n";
      return kExitFailure;
    }
  }
  if (backend == nullptr) backend = CreateCpuBackend();
  // The CPU runs one point of the manager-only loop; what only the GPU run reads is refused
  // rather than dropped (here too for --backend auto without a usable GPU), before the shape is
  // checked: a GPU-only flag is the reason, whatever else it would make invalid.
  if (backend->kind() == BackendKind::kCpu) {
    if (const std::string gpu_only = GpuOnlyOptionsGiven(); !gpu_only.empty()) {
      return UsageError(err, GpuOnlyMessage(gpu_only));
    }
  }
  const BenchConfig config = Resolve(backend->kind());
  if (Status s = ValidateBenchConfig(config); !s.ok()) {
    return UsageError(
        err, s.message() + (config.scaled_down ? " (after the CPU scale-down of defaults not "
                                                 "given; set them explicitly)"
                                               : ""));
  }

  if (backend->kind() == BackendKind::kCuda) return RunOnGpu(config, backend, command, out, err);
  if (config.miss_rates.size() > 1) {
    return UsageError(err, "--miss-rate takes one value on the CPU backend");
  }
  return RunOnCpu(config, backend, command, out, err, progress_bar);
}

int BenchCommand::RunOnCpu(const BenchConfig& config, std::shared_ptr<Backend> backend,
                           const std::string& command, std::ostream& out, std::ostream& err,
                           bool progress_bar) {
  StatusOr<BenchResult> result = [&] {
    ProgressBar bar(err, progress_bar, "sparsekv bench");
    return RunBench(config, backend, [&](std::string_view phase, int64_t done, int64_t total) {
      bar.Update(phase, done, total);
    });
  }();
  if (result.status().code() == StatusCode::kInvalidArgument) {
    return UsageError(err, result.status().message());  // a shape the flags cannot have
  }
  if (!result.ok()) {
    err << "sparsekv bench: " << result.status().ToString() << "\n";
    return kExitFailure;
  }
  out << FormatBenchTable(*result) << std::flush;
  if (!json_path_.empty()) {
    if (Status s = WriteOutputFile(json_path_, FormatBenchJson(*result, command), "JSON");
        !s.ok()) {
      err << "sparsekv bench: " << s.message() << "\n";
      return kExitFailure;
    }
  }
  return kExitOk;
}

int BenchCommand::RunOnGpu(const BenchConfig& config, std::shared_ptr<Backend> backend,
                           const std::string& command, std::ostream& out, std::ostream& err) {
  StatusOr<E2EReport> report = RunE2EBench(config, std::move(backend), err);
  if (!report.ok()) {
    err << "sparsekv bench: " << report.status().ToString() << "\n";
    return kExitFailure;
  }
  report->command = command;
  if (!config.config_path.empty()) {
    report->config = config.config_path;
    report->config_summary = ConfigSummary(config);
    report->config_options = CacheOptionsToJson(config.cache_base);
  }
  for (const auto& [path, text, what] :
       {std::tuple{&json_path_, FormatE2EJson(*report), "JSON"},
        std::tuple{&csv_path_, FormatE2ECsv(*report), "CSV"},
        std::tuple{&trace_step_path_, FormatStepTraceJson(*report), "step trace JSON"}}) {
    if (path->empty()) continue;
    if (Status s = WriteOutputFile(*path, text, what); !s.ok()) {
      err << "sparsekv bench: " << s.message() << "\n";
      return kExitFailure;
    }
  }
  out << FormatE2ETable(*report) << std::flush;
  for (const E2ECheck& c : report->checks) {
    if (!c.passed()) return kExitFailure;  // a wrong result is a failed run, after the report
  }
  return kExitOk;
}

}  // namespace sparsekv::tools
