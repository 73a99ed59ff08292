// Built when the tool has no CUDA: the end-to-end benchmark is unavailable.
#include "tools/sparsekv/bench/gpu_bench.h"

namespace sparsekv::tools {

StatusOr<E2EReport> RunE2EBench(const BenchConfig&, std::shared_ptr<Backend>, std::ostream&) {
  return Unavailable("the end-to-end benchmark needs a build with CUDA");
}

}  // namespace sparsekv::tools
