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
namespace {
Status Cuda(cudaError_t err, const char* what) {
  return err == cudaSuccess ? Status::Ok()
                            : Internal(std::string(what) + ": " + cudaGetErrorString(err));
}
}  // namespace

CapturedGraph::~CapturedGraph() {
  if (exec_ != nullptr) cudaGraphExecDestroy(exec_);
}

Status CapturedGraph::CaptureAndLaunch(cudaStream_t stream, const std::function<Status()>& run) {
  cudaGraph_t graph = nullptr;
  SPARSEKV_RETURN_IF_ERROR(Cuda(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal),
                                "cudaStreamBeginCapture"));
  const Status captured = run();
  SPARSEKV_RETURN_IF_ERROR(Cuda(cudaStreamEndCapture(stream, &graph), "cudaStreamEndCapture"));
  if (!captured.ok()) {
    cudaGraphDestroy(graph);
    return captured;
  }
  const cudaError_t instantiated = cudaGraphInstantiate(&exec_, graph, 0);
  cudaGraphDestroy(graph);
  SPARSEKV_RETURN_IF_ERROR(Cuda(instantiated, "cudaGraphInstantiate"));
  return Launch(stream);
}

Status CapturedGraph::Launch(cudaStream_t stream) {
  return Cuda(cudaGraphLaunch(exec_, stream), "cudaGraphLaunch");
}

Status CapturedRunPhase::Run() {
  if (graph_.captured()) {
    SPARSEKV_RETURN_IF_ERROR(graph_.Launch(stream_));
    return manager_.FinishReplayedStep();
  }
  return graph_.CaptureAndLaunch(stream_, [&] { return driver_.RunPhase(); });
}
#endif

}  // namespace sparsekv::testing
