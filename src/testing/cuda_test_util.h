// Test helpers for the CUDA backend: the backend, or a clean skip where there is none (CI has nvcc
// but no GPU); a step's run phase captured once and replayed.
#pragma once

#include <functional>
#include <memory>

#include "sparsekv/backend.h"
#include "sparsekv/manager.h"
#include "testing/harness.h"

#if defined(SPARSEKV_WITH_CUDA)
#include <cuda_runtime.h>
#endif

namespace sparsekv::testing {

// Returns the CUDA backend on device 0, or nullptr after calling GTEST_SKIP() with the reason.
// Use as: auto gpu = CudaBackendOrSkip(); if (!gpu) return;
std::shared_ptr<Backend> CudaBackendOrSkip();

#if defined(SPARSEKV_WITH_CUDA)
// Work that only enqueues on one stream, captured once as a CUDA graph; then replayed.
class CapturedGraph {
 public:
  CapturedGraph() = default;
  ~CapturedGraph();
  CapturedGraph(const CapturedGraph&) = delete;
  CapturedGraph& operator=(const CapturedGraph&) = delete;

  bool captured() const { return exec_ != nullptr; }
  // Captures `run` on `stream` and launches the graph: the CUDA call's error, else run's.
  Status CaptureAndLaunch(cudaStream_t stream, const std::function<Status()>& run);
  // Launches the captured graph on `stream`.
  Status Launch(cudaStream_t stream);

 private:
  cudaGraphExec_t exec_ = nullptr;
};

// A step's run phase (StepDriver::RunPhase) as one CUDA graph on `stream`: the first Run captures
// it and launches the graph; every later one replays the graph and closes the step on the host
// (FinishReplayedStep). Each Run follows the step's PlanStep and the driver's UploadInputs.
class CapturedRunPhase {
 public:
  CapturedRunPhase(SparseKVCacheManager& manager, StepDriver& driver, cudaStream_t stream)
      : manager_(manager), driver_(driver), stream_(stream) {}
  CapturedRunPhase(const CapturedRunPhase&) = delete;
  CapturedRunPhase& operator=(const CapturedRunPhase&) = delete;

  Status Run();

 private:
  SparseKVCacheManager& manager_;
  StepDriver& driver_;
  cudaStream_t stream_;
  CapturedGraph graph_;
};
#endif

}  // namespace sparsekv::testing

// Skips the current test (with the reason) unless a CUDA device is present.
#define SPARSEKV_REQUIRE_GPU(var)                                                      \
  std::shared_ptr<::sparsekv::Backend> var = ::sparsekv::testing::CudaBackendOrSkip(); \
  if (var == nullptr) return
