// Built when the library is compiled without CUDA.
#include "sparsekv/prefetch.h"

namespace sparsekv {

Status PredictPrefetchCuda(const PrefetchView&, int32_t, StreamHandle) {
  return Unavailable("sparsekv was built without the CUDA backend (no nvcc at build time)");
}

}  // namespace sparsekv
