// The opt-in dynamic shared-memory limit of a kernel, for the CUDA components' launchers.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <utility>

namespace sparsekv::cuda_common {

// The dynamic shared memory `kernel` may use per block on the current device: the device's opt-in
// maximum less the kernel's static shared memory. The first call for a (kernel, device) raises
// the kernel's limit there to it; later calls return the cached figure.
inline cudaError_t OptInMaxDynamicSmem(const void* kernel, int32_t* bytes) {
  static std::mutex mu;
  static std::map<std::pair<const void*, int>, int32_t> limits;
  int device = 0;
  if (cudaError_t err = cudaGetDevice(&device); err != cudaSuccess) return err;
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = limits.find({kernel, device}); it != limits.end()) {
    *bytes = it->second;
    return cudaSuccess;
  }
  int optin = 0;
  if (cudaError_t err =
          cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
      err != cudaSuccess) {
    return err;
  }
  cudaFuncAttributes attributes{};
  if (cudaError_t err = cudaFuncGetAttributes(&attributes, kernel); err != cudaSuccess) {
    return err;
  }
  const int32_t limit = optin - static_cast<int32_t>(attributes.sharedSizeBytes);
  if (cudaError_t err =
          cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, limit);
      err != cudaSuccess) {
    return err;
  }
  limits.emplace(std::pair(kernel, device), limit);
  *bytes = limit;
  return cudaSuccess;
}

}  // namespace sparsekv::cuda_common
