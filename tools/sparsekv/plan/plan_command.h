// The `plan` subcommand: the planner's flags, the sweep over tiers, contexts and miss rates, the
// optional calibration check, and the table and JSON it prints (docs/planning.md).
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <ostream>
#include <string>
#include <vector>

#include "sparsekv/options.h"
#include "sparsekv/planner.h"

namespace CLI {
class App;
}  // namespace CLI

namespace sparsekv::tools {

// The calibration as the Markdown table of docs/planning.md ("| parameter | value |" and one row
// per parameter); plan_test checks that the docs show CalibrationTable(Calibration{}), the
// values plain `sparsekv plan` uses.
std::string CalibrationTable(const Calibration& calibration);

// One modelled configuration of the plan (plan_command.cc).
struct PlanCase;

// "name:capacity_gb:gbps" -> MemoryTier; InvalidArgument for anything else.
StatusOr<MemoryTier> ParseTier(const std::string& text);

class PlanCommand {
 public:
  // Adds the `plan` subcommand and its options to `parent`, which must outlive this object.
  explicit PlanCommand(CLI::App& parent);
  bool selected() const;
  // Runs the model, prints the tables on `out`, writes --json. Returns an exit code (cli.h).
  // REQUIRES: the command line was parsed successfully and selected() is true.
  int Run(const std::string& command, std::ostream& out, std::ostream& err);

 private:
  // Run for a preset whose layers differ in kind, cadence, keys or groups (DeepSeek-V4, GLM-5.3):
  // the capacity per layer kind, then the step per layer kind (PredictKindStep).
  int RunLayerKinds(const std::string& command, const ModelPreset& preset,
                    const std::vector<MemoryTier>& tiers, std::ostream& out, std::ostream& err);

  // Every context's full-HBM point, then each tier's sparsekv point at each miss rate.
  std::vector<PlanCase> Cases(const Calibration& cal, const ModelShape& model,
                              const std::vector<MemoryTier>& tiers, int32_t hot_slots,
                              const CacheOptions& options) const;
  // Puts `cases` into `json` and writes it to --json, if given.
  Status WriteJson(nlohmann::json& json, const std::vector<PlanCase>& cases) const;

  CLI::App* app_;
  std::string preset_ = "deepseek-v3.2";
  std::string precision_ = "fp8";
  ModelShape model_;
  GpuSpec gpu_;
  std::vector<std::string> tiers_;
  std::vector<double> node_dram_gb_;  // --node-dram-gb: NodeDramTier per value
  int32_t gpus_per_node_ = 8;         // --gpus-per-node
  std::vector<int32_t> contexts_ = {16384, 32768, 65536, 131072, 262144, 524288, 1048576};
  std::vector<double> miss_rates_ = {0.2};
  int32_t hot_slots_ = 4096;
  double tpot_slo_ms_ = 50;
  double hidden_fraction_ = 0;    // StepInputs::hidden_fraction
  double host_ready_gbps_ = 1.0;  // ModelHostPoolReady's rate
  std::vector<std::string> calibration_paths_;
  std::string json_path_;
  // The manager's options the step schedule's candidates follow from (ForecastSchedule).
  int32_t copy_chunk_rows_ = 0;       // --copy-chunk-rows
  bool crosslayer_prefetch_ = false;  // --crosslayer-prefetch: max_prefetch = top_k
  std::string config_path_;           // --config
};

}  // namespace sparsekv::tools
