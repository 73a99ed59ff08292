#include "testing/cuda_test_util.h"

#include <gtest/gtest.h>

#include <string>

namespace sparsekv::testing {

namespace {
void Skip(const std::string& why) { GTEST_SKIP() << why; }
}  // namespace

std::shared_ptr<Backend> CudaBackendOrSkip() {
  StatusOr<std::shared_ptr<Backend>> gpu = CreateCudaBackend(0);
  if (!gpu.ok()) {
    Skip("no CUDA device: " + gpu.status().ToString());
    return nullptr;
  }
  return *gpu;
}

#if defined(SPARSEKV_WITH_CUDA)
CapturedRunPhase::~CapturedRunPhase() {
  if (exec_ != nullptr) cudaGraphExecDestroy(exec_);
}

Status CapturedRunPhase::Run() {
  const auto cuda = [](cudaError_t err, const char* what) {
    return err == cudaSuccess ? Status::Ok()
                              : Internal(std::string(what) + ": " + cudaGetErrorString(err));
  };
  if (exec_ != nullptr) {
    SPARSEKV_RETURN_IF_ERROR(cuda(cudaGraphLaunch(exec_, stream_), "cudaGraphLaunch"));
    return manager_.FinishReplayedStep();
  }
  cudaGraph_t graph = nullptr;
  SPARSEKV_RETURN_IF_ERROR(cuda(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal),
                                "cudaStreamBeginCapture"));
  const Status captured = driver_.RunPhase();
  SPARSEKV_RETURN_IF_ERROR(cuda(cudaStreamEndCapture(stream_, &graph), "cudaStreamEndCapture"));
  if (!captured.ok()) {
    cudaGraphDestroy(graph);
    return captured;
  }
  const cudaError_t instantiated = cudaGraphInstantiate(&exec_, graph, 0);
  cudaGraphDestroy(graph);
  SPARSEKV_RETURN_IF_ERROR(cuda(instantiated, "cudaGraphInstantiate"));
  return cuda(cudaGraphLaunch(exec_, stream_), "cudaGraphLaunch");
}
#endif

}  // namespace sparsekv::testing
