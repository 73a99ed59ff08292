#include "attention/cublas_loader.h"

#include <dlfcn.h>

#include <string>

namespace sparsekv::mla_cuda {
namespace {

template <typename F>
bool Resolve(void* library, const char* name, F* fn, std::string* error) {
  *fn = reinterpret_cast<F>(dlsym(library, name));
  if (*fn == nullptr && error->empty()) error->assign(std::string("cuBLAS has no ") + name);
  return *fn != nullptr;
}

CublasApi Load() {
  CublasApi api;
  const std::string soname = "libcublas.so." + std::to_string(CUBLAS_VER_MAJOR);
  void* library = dlopen(soname.c_str(), RTLD_NOW | RTLD_LOCAL);
#if defined(SPARSEKV_CUDA_LIBRARY_DIR)
  if (library == nullptr) {
    library = dlopen((std::string(SPARSEKV_CUDA_LIBRARY_DIR) + "/" + soname).c_str(),
                     RTLD_NOW | RTLD_LOCAL);
  }
#endif
  if (library == nullptr) {
    const char* why = dlerror();
    api.error = "cannot load " + soname + (why != nullptr ? std::string(": ") + why : "");
    return api;
  }
  Resolve(library, "cublasCreate_v2", &api.create, &api.error);
  Resolve(library, "cublasDestroy_v2", &api.destroy, &api.error);
  Resolve(library, "cublasSetStream_v2", &api.set_stream, &api.error);
  Resolve(library, "cublasSetWorkspace_v2", &api.set_workspace, &api.error);
  Resolve(library, "cublasSetSmCountTarget", &api.set_sm_count_target, &api.error);
  Resolve(library, "cublasGemmEx", &api.gemm_ex, &api.error);
  Resolve(library, "cublasGemmStridedBatchedEx", &api.gemm_strided_batched_ex, &api.error);
  Resolve(library, "cublasGetStatusString", &api.status_string, &api.error);
  return api;  // the library stays loaded for the process's lifetime
}

}  // namespace

const CublasApi& Cublas() {
  static const CublasApi api = Load();
  return api;
}

}  // namespace sparsekv::mla_cuda
