// Built when the library is compiled without CUDA.
#include "sparsekv/backend.h"

namespace sparsekv {

StatusOr<std::shared_ptr<Backend>> CreateCudaBackend(int, HostMemoryKind) {
  return Unavailable("sparsekv was built without the CUDA backend (no nvcc at build time)");
}

bool CudaBackendCompiled() { return false; }

}  // namespace sparsekv
