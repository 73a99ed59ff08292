#include "tools/sparsekv/bench_command.h"

#include <CLI/CLI.hpp>
#include <chrono>
#include <fstream>

#include "tools/sparsekv/cli.h"

namespace sparsekv::tools {
namespace {

// A one-line progress bar redrawn in place on a terminal. It appears only once a run has lasted
// half a second, redraws at most ten times a second, and erases itself when destroyed.
class ProgressBar {
 public:
  ProgressBar(std::ostream& err, bool enabled)
      : err_(err), enabled_(enabled), start_(Clock::now()), last_(start_) {}
  ~ProgressBar() {
    if (drawn_) err_ << "\r\033[K" << std::flush;
  }
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

  void Update(std::string_view phase, int64_t done, int64_t total) {
    if (!enabled_ || total <= 0) return;
    const Clock::time_point now = Clock::now();
    if (now - start_ < std::chrono::milliseconds(500)) return;
    if (drawn_ && done < total && now - last_ < std::chrono::milliseconds(100)) return;
    constexpr int kWidth = 30;
    const int filled = static_cast<int>(kWidth * done / total);
    err_ << "\r\033[K[" << std::string(filled, '#') << std::string(kWidth - filled, '.') << "] "
         << phase << " " << done << "/" << total << std::flush;
    drawn_ = true;
    last_ = now;
  }

 private:
  using Clock = std::chrono::steady_clock;
  std::ostream& err_;
  bool enabled_;
  bool drawn_ = false;
  Clock::time_point start_;
  Clock::time_point last_;
};

int UsageError(std::ostream& err, const std::string& message) {
  err << "sparsekv bench: " << message << "\nRun with --help for more information.\n";
  return kExitUsage;
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
      ->check(CLI::IsMember({"deepseek-v3.2", "glm-5"}))
      ->capture_default_str();
  app_->add_option("--precision", precision_, "KV row format: fp8 (656 B) or bf16 (1152 B)")
      ->check(CLI::IsMember({"fp8", "bf16"}))
      ->capture_default_str();
  layers_ =
      app_->add_option(
              "--layers", config_.layers,
              "attention layers [default: the preset's; CPU: " + std::to_string(cpu.layers) + "]")
          ->check(CLI::Range(1, 1000));
  app_->add_option("--backend", backend_, "auto: cuda if a GPU is usable, else cpu")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}))
      ->capture_default_str();
  batch_ = app_->add_option("--batch", config_.batch,
                            "requests decoding together" + both(d.batch, cpu.batch))
               ->check(CLI::PositiveNumber);
  context_ = app_->add_option("--context", config_.context,
                              "prompt tokens per request" + both(d.context, cpu.context))
                 ->check(CLI::PositiveNumber);
  steps_ = app_->add_option("--steps", config_.steps,
                            "decode steps, warm-up included" + both(d.steps, cpu.steps))
               ->check(CLI::PositiveNumber);
  app_->add_option("--warmup", config_.warmup_steps, "first steps excluded from timing and stats")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  top_k_ = app_->add_option("--top-k", config_.top_k,
                            "positions selected per request and layer" + both(d.top_k, cpu.top_k))
               ->check(CLI::PositiveNumber);
  hot_slots_ =
      app_->add_option("--hot-slots", config_.hot_slots,
                       "LRU slots per request and layer in HBM" + both(d.hot_slots, cpu.hot_slots))
          ->check(CLI::PositiveNumber);
  app_->add_option("--window", config_.window, "newest tokens always resident")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app_->add_option("--page-tokens", config_.page_tokens, "host pool page size in tokens")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app_->add_option("--reuse", config_.reuse,
                   "fraction of each layer's top-k reused from the previous step (the first two "
                   "layers reuse almost nothing)")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  app_->add_option("--recency", config_.recency,
                   "fraction of the top-k drawn from the newest 10% of positions")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  app_->add_option("--sinks", config_.sinks, "the first N positions are always selected")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app_->add_option("--seed", config_.seed, "random seed")->capture_default_str();
  app_->add_flag("--assemble", config_.assemble,
                 "also gather the selected rows into a dense [batch, top-k, row] buffer");
  app_->add_option("--json", json_path_, "also write the results as JSON to PATH")
      ->option_text("PATH");
}

bool BenchCommand::selected() const { return app_->parsed(); }

BenchConfig BenchCommand::Resolve(BackendKind kind) const {
  BenchConfig c = config_;
  c.precision = precision_ == "bf16" ? KVPrecision::kBf16 : KVPrecision::kFp8;
  if (kind != BackendKind::kCpu) return c;
  const CpuScaleDown cpu;
  auto scale = [&](const CLI::Option* given, int32_t& field, int32_t value) {
    if (given->count() == 0 && field != value) {
      field = value;
      c.scaled_down = true;
    }
  };
  scale(layers_, c.layers, cpu.layers);
  scale(batch_, c.batch, cpu.batch);
  scale(context_, c.context, cpu.context);
  scale(steps_, c.steps, cpu.steps);
  scale(hot_slots_, c.hot_slots, cpu.hot_slots);
  scale(top_k_, c.top_k, cpu.top_k);
  return c;
}

int BenchCommand::Run(const std::string& command, std::ostream& out, std::ostream& err,
                      bool progress_bar) {
  // Usage errors first, so that they do not wait for a GPU to come up. The CPU shape is the
  // smaller one; the backend's own shape is validated again below.
  if (Status s = ValidateBenchConfig(Resolve(BackendKind::kCuda)); !s.ok()) {
    return UsageError(err, s.message());
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
  const BenchConfig config = Resolve(backend->kind());
  if (Status s = ValidateBenchConfig(config); !s.ok()) {
    return UsageError(
        err, s.message() + (config.scaled_down ? " (after the CPU scale-down of defaults not "
                                                 "given; set them explicitly)"
                                               : ""));
  }

  StatusOr<BenchResult> result = [&] {
    ProgressBar bar(err, progress_bar);
    return RunBench(config, backend, [&](std::string_view phase, int64_t done, int64_t total) {
      bar.Update(phase, done, total);
    });
  }();
  if (!result.ok()) {
    err << "sparsekv bench: " << result.status().ToString() << "\n";
    return kExitFailure;
  }
  out << FormatBenchTable(*result) << std::flush;
  if (!json_path_.empty()) {
    std::ofstream file(json_path_);
    file << FormatBenchJson(*result, command);
    file.close();
    if (!file) {
      err << "sparsekv bench: cannot write JSON to '" << json_path_ << "'\n";
      return kExitFailure;
    }
  }
  return kExitOk;
}

}  // namespace sparsekv::tools
