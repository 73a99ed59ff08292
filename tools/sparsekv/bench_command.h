// The `bench` subcommand: its options, the choice of backend, the CPU scale-down, the report.
#pragma once

#include <ostream>
#include <string>

#include "sparsekv/backend.h"
#include "tools/sparsekv/bench.h"

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

  // Picks the backend, applies the CPU scale-down, validates, runs, prints the table on `out`
  // and writes --json. `command` is recorded in the JSON. Returns an exit code (cli.h).
  // REQUIRES: the command line was parsed successfully and selected() is true.
  int Run(const std::string& command, std::ostream& out, std::ostream& err, bool progress_bar);

 private:
  // The configuration for `kind`: user values, else defaults (scaled down on the CPU).
  BenchConfig Resolve(BackendKind kind) const;

  CLI::App* app_;
  BenchConfig config_;  // filled by the parser; fields not given keep BenchConfig's defaults
  std::string precision_ = "fp8";
  std::string backend_ = "auto";
  std::string json_path_;
  CLI::Option* layers_;
  CLI::Option* batch_;
  CLI::Option* context_;
  CLI::Option* steps_;
  CLI::Option* hot_slots_;
  CLI::Option* top_k_;
};

}  // namespace sparsekv::tools
