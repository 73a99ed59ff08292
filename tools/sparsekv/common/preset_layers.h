// Which presets the tools drive a manager over. The manager serves every layer kind and a raw
// window (CheckServedGeometry in options.h: DeepSeek-V4's offloaded CSA layers, resident HCA
// layers, window-only layers and its raw window), but a tool can only drive the layers its
// workload gives rows for: `multi-turn` gives every kind its entries and windows (PromptRows,
// StepRows), while `replay`'s manager path and node_pool_step_bench replay rows a token each
// through a top-k on every layer, so they still take offloaded layers only
// (docs/deepseek-v4.md, "The tools over DeepSeek-V4's layer kinds").
#pragma once

#include <cstddef>
#include <string>

#include "sparsekv/options.h"
#include "sparsekv/status.h"

namespace sparsekv::tools {

// What a tool's workload gives the manager's layers.
enum class ToolLayers {
  // A row per token through a top-k on every layer: offloaded layers only, no raw window
  // (`replay`'s manager path, node_pool_step_bench, and `plan`'s calibrated uniform model).
  kOffloadedOnly,
  // Every kind its entries and raw windows (`multi-turn`): what the manager serves.
  kEveryKind,
};

// OK if a tool whose workload gives `layers` drives a manager over `geometry` and `raw_window`;
// otherwise the manager's own refusal (CheckServedGeometry), or Unimplemented naming the first
// layer or field the workload gives no rows for.
inline Status CheckToolsDriveLayers(const KVGeometry& geometry, int32_t raw_window,
                                    ToolLayers layers) {
  SPARSEKV_RETURN_IF_ERROR(CheckServedGeometry(geometry, raw_window));
  if (layers == ToolLayers::kEveryKind) return Status::Ok();
  const auto refuse = [](const std::string& what) {
    return Unimplemented(what +
                         ": this workload replays a row per token through a top-k on every "
                         "layer, so it drives offloaded layers only (docs/deepseek-v4.md, \"The "
                         "tools over DeepSeek-V4's layer kinds\")");
  };
  for (size_t i = 0; i < geometry.layers.size(); ++i) {
    const LayerKind kind = geometry.layers[i].kind;
    if (kind != LayerKind::kOffloaded) {
      return refuse("geometry.layers[" + std::to_string(i) + "].kind is " + LayerKindName(kind));
    }
  }
  if (raw_window != 0) return refuse("raw_window is " + std::to_string(raw_window));
  return Status::Ok();
}

}  // namespace sparsekv::tools
