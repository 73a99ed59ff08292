// The end-to-end decode benchmark on a GPU (docs/benchmark.md): for every context, KV variant
// (full-hbm, sparsekv, no-cache), miss rate and batch size, a whole decode step of every layer
// (new-token append, top-k -> rows, miss copy, sparse MLA attention, weight-streaming proxy) is
// captured once as a CUDA graph and replayed, timed with CUDA events.
#pragma once

#include <memory>
#include <ostream>

#include "sparsekv/backend.h"
#include "sparsekv/status.h"
#include "tools/sparsekv/bench/bench.h"
#include "tools/sparsekv/bench/e2e_report.h"

namespace sparsekv::tools {

// Runs on the device of `cuda` (a CUDA backend). Progress lines go to `log`. Unavailable if the
// tool was built without CUDA; any library or CUDA error otherwise. A failed correctness check is
// not an error: it is in the report's checks. REQUIRES: ValidateBenchConfig(config) is ok.
StatusOr<E2EReport> RunE2EBench(const BenchConfig& config, std::shared_ptr<Backend> cuda,
                                std::ostream& log);

}  // namespace sparsekv::tools
