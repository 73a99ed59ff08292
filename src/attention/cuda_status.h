// CUDA and cuBLAS return codes as Status, and the device guard, for the attention component.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <string>

#include "sparsekv/status.h"

namespace sparsekv::mla_cuda {

inline Status CudaStatus(cudaError_t err, const char* call) {
  return Internal(std::string(call) + ": " + cudaGetErrorString(err));
}

inline Status CublasStatus(cublasStatus_t status, const char* call) {
  return Internal(std::string(call) + ": " + cublasGetStatusString(status));
}

// Makes `device` current for the calling thread for the guard's lifetime (the current device is
// per thread, and the objects may be called from any thread).
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

// Unavailable when `device` does not exist (or no driver or device at all), so that callers can
// tell "no GPU here" from a failure.
inline Status CheckDevice(int device) {
  int count = 0;
  if (cudaError_t err = cudaGetDeviceCount(&count); err != cudaSuccess) {
    cudaGetLastError();
    return Unavailable(std::string("no CUDA device: ") + cudaGetErrorString(err));
  }
  if (device < 0 || device >= count) {
    return Unavailable("CUDA device " + std::to_string(device) + " does not exist (" +
                       std::to_string(count) + " present)");
  }
  return Status::Ok();
}

}  // namespace sparsekv::mla_cuda

#define SPARSEKV_MLA_CUDA_RETURN_IF_ERROR(call)             \
  do {                                                      \
    if (cudaError_t err_ = (call); err_ != cudaSuccess) {   \
      return ::sparsekv::mla_cuda::CudaStatus(err_, #call); \
    }                                                       \
  } while (0)

#define SPARSEKV_MLA_CUBLAS_RETURN_IF_ERROR(call)                            \
  do {                                                                       \
    if (cublasStatus_t status_ = (call); status_ != CUBLAS_STATUS_SUCCESS) { \
      return ::sparsekv::mla_cuda::CublasStatus(status_, #call);             \
    }                                                                        \
  } while (0)
