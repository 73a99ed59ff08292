// The --preset flag of the subcommands: a name FindPreset knows (options.h's PresetNames(), not a
// list of the tool's own), and for the commands that drive a manager, a preset it serves today.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "sparsekv/options.h"

namespace sparsekv::tools {

// "{deepseek-v3.2,glm-5,...}": the names, as CLI11 prints a set.
inline std::string PresetNameList() {
  std::string names;
  for (const std::string& n : PresetNames()) names += (names.empty() ? "" : ",") + n;
  return "{" + names + "}";
}

// Accepts a name of PresetNames().
inline CLI::Validator KnownPreset() {
  return CLI::Validator(
      [](std::string& input) -> std::string {
        return FindPreset(input).ok() ? "" : input + " is not a preset " + PresetNameList();
      },
      PresetNameList());
}

// Accepts a preset whose layers the manager serves (CheckServedGeometry: DeepSeek-V4's too), for
// the commands whose workload gives every layer kind its rows (bench on the CPU backend,
// multi-turn: CheckToolsDriveLayers with ToolLayers::kEveryKind).
inline CLI::Validator ManagerPreset() {
  return CLI::Validator(
      [](std::string& input) -> std::string {
        const StatusOr<ModelPreset> preset = FindPreset(input);
        if (!preset.ok()) return input + " is not a preset " + PresetNameList();
        const Status served = CheckServedGeometry(preset->geometry(), preset->raw_window);
        if (served.ok()) return "";
        return input + " cannot run here yet (" + served.message() + "); `sparsekv plan --preset " +
               input + "` models its capacity";
      },
      PresetNameList());
}

}  // namespace sparsekv::tools
