// cuBLAS for the attention component, loaded when first used (dlopen) instead of linked.
//
// A library linked at start-up places its thread-local storage in the static TLS block that
// every thread of the process carries on its stack; cuBLAS and cuBLASLt together need about
// 106 KB of it. A thread created with a small stack then fails to start (pthread_create:
// EINVAL): e.g. those of the metrics exporter's HTTP server (100 KB stacks), which made
// `sparsekv pool --metrics-port` fail in every CUDA build. Loaded with dlopen, cuBLAS's TLS is
// allocated per thread when a thread first uses it.
#pragma once

#include <cublas_v2.h>

#include <string>

namespace sparsekv::mla_cuda {

// The cuBLAS calls the attention component makes.
struct CublasApi {
  decltype(&::cublasCreate_v2) create = nullptr;
  decltype(&::cublasDestroy_v2) destroy = nullptr;
  decltype(&::cublasSetStream_v2) set_stream = nullptr;
  decltype(&::cublasSetWorkspace_v2) set_workspace = nullptr;
  decltype(&::cublasSetSmCountTarget) set_sm_count_target = nullptr;
  // (The C API's signatures: the headers also declare C++ overloads of these two.)
  cublasStatus_t (*gemm_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                            const void*, const void*, cudaDataType, int, const void*, cudaDataType,
                            int, const void*, void*, cudaDataType, int, cublasComputeType_t,
                            cublasGemmAlgo_t) = nullptr;
  cublasStatus_t (*gemm_strided_batched_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t,
                                            int, int, int, const void*, const void*, cudaDataType,
                                            int, long long int, const void*, cudaDataType, int,
                                            long long int, const void*, void*, cudaDataType, int,
                                            long long int, int, cublasComputeType_t,
                                            cublasGemmAlgo_t) = nullptr;
  decltype(&::cublasGetStatusString) status_string = nullptr;
  // Empty once every call above is resolved; else why cuBLAS could not be loaded.
  std::string error;
};

// libcublas.so.<CUBLAS_VER_MAJOR> from the loader's search path, else from the CUDA toolkit's
// library directory the project was built with; loaded once, on the first call.
const CublasApi& Cublas();

}  // namespace sparsekv::mla_cuda
