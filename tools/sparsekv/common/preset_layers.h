// Which presets the tools drive a manager over: those whose every layer is offloaded, with no raw
// window. The manager serves more (CheckServedGeometry in options.h: DeepSeek-V4's resident and
// window-only layers and its raw window), but the tools' workloads build their manager's geometry
// from offloaded rows and run every layer through a top-k, so DeepSeek-V4's presets are still
// refused there (docs/deepseek-v4.md, "What is built of step 4").
#pragma once

#include <cstddef>
#include <string>

#include "sparsekv/options.h"
#include "sparsekv/status.h"

namespace sparsekv::tools {

// OK if the tools drive a manager over `geometry` and `raw_window`; Unimplemented naming the first
// layer or field they do not.
inline Status CheckToolsDriveLayers(const KVGeometry& geometry, int32_t raw_window) {
  SPARSEKV_RETURN_IF_ERROR(CheckServedGeometry(geometry, raw_window));
  const auto refuse = [](const std::string& what) {
    return Unimplemented(what +
                         ": the tools drive the manager over offloaded layers only "
                         "(docs/deepseek-v4.md, \"What is built of step 4\")");
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
