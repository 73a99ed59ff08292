// DeviceBuffer: device memory owned by one object, freed on destruction.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <string>
#include <utility>

#include "cuda_common/cuda_check.h"
#include "sparsekv/status.h"

namespace sparsekv::cuda_common {

// cudaMalloc'd memory on the device current at Allocate, freed there on destruction (whatever
// device is current then). Move-only; a default-constructed or moved-from buffer holds nothing.
// Not thread-safe; the memory is not initialised.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  ~DeviceBuffer() { Reset(); }
  DeviceBuffer(DeviceBuffer&& other) noexcept
      : ptr_(std::exchange(other.ptr_, nullptr)),
        bytes_(std::exchange(other.bytes_, 0)),
        device_(other.device_) {}
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
    if (this != &other) {
      Reset();
      ptr_ = std::exchange(other.ptr_, nullptr);
      bytes_ = std::exchange(other.bytes_, 0);
      device_ = other.device_;
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  // `bytes` on the current device. ResourceExhausted, naming `owner`, when cudaMalloc fails (its
  // error is cleared, so that it does not surface at the next unrelated CUDA call).
  static StatusOr<DeviceBuffer> Allocate(size_t bytes, const char* owner) {
    DeviceBuffer buffer;
    if (cudaError_t err = cudaGetDevice(&buffer.device_); err != cudaSuccess) {
      return CudaError(err, "cudaGetDevice");
    }
    if (cudaError_t err = cudaMalloc(&buffer.ptr_, bytes); err != cudaSuccess) {
      cudaGetLastError();
      buffer.ptr_ = nullptr;
      return ResourceExhausted(std::string(owner) + ": cudaMalloc of " + std::to_string(bytes) +
                               " bytes: " + cudaGetErrorString(err));
    }
    buffer.bytes_ = bytes;
    return StatusOr<DeviceBuffer>(std::move(buffer));
  }

  template <typename T = void>
  T* get() const {
    return static_cast<T*>(ptr_);
  }
  size_t bytes() const { return bytes_; }

 private:
  void Reset() {
    if (ptr_ == nullptr) return;
    DeviceGuard guard(device_);
    cudaFree(ptr_);
    ptr_ = nullptr;
    bytes_ = 0;
  }

  void* ptr_ = nullptr;
  size_t bytes_ = 0;
  int device_ = 0;
};

}  // namespace sparsekv::cuda_common
