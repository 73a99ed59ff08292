// CUDA return codes as Status, the device check and the per-thread device guard: the one home of
// these for every CUDA component (the CUDA backend, prefetch, attention).
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "sparsekv/status.h"

namespace sparsekv::cuda_common {

// Internal, naming the failed call and CUDA's description of `err`.
inline Status CudaError(cudaError_t err, const char* call) {
  return Internal(std::string(call) + ": " + cudaGetErrorString(err));
}

// Ok for cudaSuccess, otherwise CudaError(err, call): for a function whose result is that of its
// last CUDA call.
inline Status CudaStatus(cudaError_t err, const char* call) {
  return err == cudaSuccess ? Status::Ok() : CudaError(err, call);
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

}  // namespace sparsekv::cuda_common

// In a function returning Status: returns CudaError(err, "call") when `call` is not cudaSuccess.
#define SPARSEKV_CUDA_RETURN_IF_ERROR(call)                   \
  do {                                                        \
    if (cudaError_t err_ = (call); err_ != cudaSuccess) {     \
      return ::sparsekv::cuda_common::CudaError(err_, #call); \
    }                                                         \
  } while (0)
