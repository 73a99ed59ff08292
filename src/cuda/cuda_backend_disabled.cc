// Built when the library is compiled without CUDA.
#include "sparsekv/backend.h"

namespace sparsekv {

StatusOr<std::shared_ptr<Backend>> CreateCudaBackend(int, HostMemoryKind) {
  return Unavailable("sparsekv was built without the CUDA backend (no nvcc at build time)");
}

StatusOr<std::shared_ptr<Backend>> CreateCudaBackend(int device, HostMemoryKind host_memory,
                                                     const HostMemoryOptions&) {
  return CreateCudaBackend(device, host_memory);
}

bool CudaBackendCompiled() { return false; }

}  // namespace sparsekv
