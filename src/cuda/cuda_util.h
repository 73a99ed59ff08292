// CUDA return codes as Status, device checks and the per-thread device guard, shared by the CUDA
// backend and the other CUDA components (attention).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "sparsekv/status.h"

namespace sparsekv::cuda_util {

inline Status CudaError(cudaError_t err, const char* call) {
  return Internal(std::string(call) + ": " + cudaGetErrorString(err));
}

// Unavailable when `device` does not exist (or there is no driver or device at all), so that
// callers can tell "no GPU here" from a failure.
inline Status CheckDevice(int device) {
  int count = 0;
  if (cudaError_t err = cudaGetDeviceCount(&count); err != cudaSuccess) {
    cudaGetLastError();
    return Unavailable(std::string("no usable CUDA device: cudaGetDeviceCount: ") +
                       cudaGetErrorString(err));
  }
  if (count == 0) return Unavailable("no CUDA device present");
  if (device < 0 || device >= count) {
    return Unavailable("CUDA device " + std::to_string(device) + " requested, " +
                       std::to_string(count) + " present");
  }
  return Status::Ok();
}

// Makes `device` current for the calling thread for the guard's lifetime: the CUDA current device
// is per thread, and our objects may be called from any thread.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    if (cudaGetDevice(&previous_) == cudaSuccess && previous_ != device) {
      cudaSetDevice(device);
    } else {
      previous_ = -1;
    }
  }
  ~DeviceGuard() {
    if (previous_ >= 0) cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
};

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

}  // namespace sparsekv::cuda_util

#define SPARSEKV_CUDA_RETURN_IF_ERROR(call)                         \
  do {                                                              \
    if (cudaError_t err_ = (call); err_ != cudaSuccess) {           \
      return ::sparsekv::cuda_util::CudaError(err_, #call);         \
    }                                                               \
  } while (0)
