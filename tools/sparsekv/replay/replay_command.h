// The `replay` subcommand: a trace file or the synthetic generator through the hot-cache policies
// (replay.h); prints the locality statistics, the generator parameters fitted to the trace and
// the policy comparison, and writes them as JSON (docs/planning.md).
#pragma once

#include <ostream>
#include <string>
#include <vector>

#include "tools/sparsekv/replay/preset_replay.h"
#include "tools/sparsekv/replay/replay.h"

namespace CLI {
class App;
class Option;
}  // namespace CLI

namespace sparsekv::tools {

class ReplayCommand {
 public:
  // Adds the `replay` subcommand and its options to `parent`, which must outlive this object.
  explicit ReplayCommand(CLI::App& parent);
  bool selected() const;
  // REQUIRES: the command line was parsed successfully and selected() is true.
  int Run(const std::string& command, std::ostream& out, std::ostream& err, bool progress_bar);

 private:
  // InvalidArgument naming the given flags that the run would not read: the generator's with
  // --trace, a mode's own flags outside it, a policy's parameter without the policy, the shape
  // flags a --preset sets.
  Status CheckFlagsApply() const;
  // --preset's refusals that need the preset: the context outside what it replays, and the
  // replays of the manager's own paths where the manager does not serve its layers.
  Status CheckPresetApplies(const PresetReplayShape& shape) const;

  CLI::App* app_;
  std::string trace_path_;
  TopKGeneratorOptions generator_;
  int32_t layers_ = 8;
  int32_t steps_ = 256;
  int32_t context_ = 32768;
  std::vector<int32_t> hot_slots_;
  std::vector<std::string> policies_ = {"lru", "clock", "lfu-decay", "slru", "aging"};
  int32_t window_split_ = -1;  // -1: top_k / 8
  ReplayOptions options_;
  bool synthetic_like_ = false;
  std::vector<std::string> prefetch_;      // predictors; empty: no prefetch replay
  std::vector<int32_t> prefetch_budgets_;  // empty: 1, 2, top_k / 16, / 8, / 4, / 2
  bool crosslayer_prefetch_ = false;
  std::string locality_;  // --synthetic-locality: a preset name, "calibrated", "miss-rate",
                          // "uncorrelated"
  std::string preset_;    // --preset: a model preset's offloaded layers (preset_replay.h)
  double cross_layer_overlap_ = -1;  // -1: the preset's (0 outside locality mode)
  bool layer_overlap_ = false;
  bool fit_locality_ = false;
  std::vector<std::string> fit_target_;  // SLOTS:MISS pairs; empty: the replayed lru curve
  int32_t fit_context_ = 0;              // 0: --context (synthetic) or the trace's first seq_len
  std::string write_trace_path_;
  std::string json_path_;
};

}  // namespace sparsekv::tools
