// The `bench` subcommand: its options, the choice of backend, the CPU scale-down, the report.
#pragma once

#include <optional>
#include <ostream>
#include <string>

#include "sparsekv/backend.h"
#include "tools/sparsekv/bench/bench.h"
#include "tools/sparsekv/common/config_file.h"

namespace CLI {
class App;
class Option;
}  // namespace CLI

namespace sparsekv::tools {

// Defaults a user did not override are reduced to these on the CPU reference backend, so that a
// plain `sparsekv bench` finishes in seconds there; the report is then labelled "scaled down".
struct CpuScaleDown {
  int32_t layers = 4;
  int32_t batch = 4;
  int32_t context = 8192;
  int32_t steps = 16;
  int32_t hot_slots = 4096;
  int32_t top_k = 2048;
};

class BenchCommand {
 public:
  // Adds the `bench` subcommand and its options to `parent`, which must outlive this object.
  explicit BenchCommand(CLI::App& parent);

  // True if the parsed command line selected `bench`.
  bool selected() const;

  // Picks the backend, applies the CPU scale-down, validates, runs (the manager-only decode loop
  // on the CPU, the end-to-end comparison on a GPU), prints the table on `out` and writes --json
  // (and --csv on a GPU). Options only the GPU run reads are refused on the CPU backend (a
  // usage error), output paths are checked before the run. `command` is recorded in the JSON.
  // Returns an exit code (cli.h). REQUIRES: the command line was parsed successfully and selected()
  // is true.
  int Run(const std::string& command, std::ostream& out, std::ostream& err, bool progress_bar);

 private:
  // The options only the end-to-end GPU benchmark reads (after the common ones, in --help too).
  void AddGpuOptions();
  // The GPU-only options given on the command line, comma-separated ("" if none).
  std::string GpuOnlyOptionsGiven() const;
  // Reads --config into file_: InvalidArgument (naming the file, and the key or the flag) for a
  // file that cannot be read or run, or a flag given for a field the file sets.
  Status ReadConfig();
  // The configuration for `kind`: flags, else the --config file's values, else defaults (scaled
  // down on the CPU).
  BenchConfig Resolve(BackendKind kind) const;
  int RunOnCpu(const BenchConfig& config, std::shared_ptr<Backend> backend,
               const std::string& command, std::ostream& out, std::ostream& err, bool progress_bar);
  int RunOnGpu(const BenchConfig& config, std::shared_ptr<Backend> backend,
               const std::string& command, std::ostream& out, std::ostream& err);

  CLI::App* app_;
  BenchConfig config_;  // filled by the parser; fields not given keep BenchConfig's defaults
  std::string precision_ = "fp8";
  std::string backend_ = "auto";
  std::string json_path_;
  std::string csv_path_;
  std::string trace_step_path_;  // --trace-step
  std::string config_path_;      // --config
  std::optional<ConfigFile> file_;
  bool sweep_ = false;
  bool no_proxy_ = false;
  CLI::Option* layers_;
  CLI::Option* batch_;
  CLI::Option* context_;
  CLI::Option* steps_;
  CLI::Option* hot_slots_;
  CLI::Option* top_k_;
};

}  // namespace sparsekv::tools
