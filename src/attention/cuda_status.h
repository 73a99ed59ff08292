// cuBLAS return codes as Status for the attention component; the CUDA ones come from
// cuda_common/cuda_check.h.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <string>

#include "attention/cublas_loader.h"
#include "cuda_common/cuda_check.h"
#include "cuda_common/device_buffer.h"
#include "sparsekv/status.h"

namespace sparsekv::mla_cuda {

using cuda_common::CheckDevice;
using cuda_common::DeviceBuffer;
using cuda_common::DeviceGuard;

inline Status CublasStatus(cublasStatus_t status, const char* call) {
  const CublasApi& cublas = Cublas();
  return Internal(std::string(call) + ": " +
                  (cublas.status_string != nullptr ? std::string(cublas.status_string(status))
                                                   : "cuBLAS status " + std::to_string(status)));
}

// A cuBLAS handle in *handle; Unavailable if cuBLAS could not be loaded.
inline Status CreateCublas(cublasHandle_t* handle) {
  const CublasApi& cublas = Cublas();
  if (!cublas.error.empty()) return Unavailable(cublas.error);
  const cublasStatus_t status = cublas.create(handle);
  return status == CUBLAS_STATUS_SUCCESS ? Status::Ok() : CublasStatus(status, "cublasCreate");
}

}  // namespace sparsekv::mla_cuda

#define SPARSEKV_MLA_CUBLAS_RETURN_IF_ERROR(call)                            \
  do {                                                                       \
    if (cublasStatus_t status_ = (call); status_ != CUBLAS_STATUS_SUCCESS) { \
      return ::sparsekv::mla_cuda::CublasStatus(status_, #call);             \
    }                                                                        \
  } while (0)
