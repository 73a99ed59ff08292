// Timing pieces of the end-to-end benchmark on the CUDA runtime: a pair of events, an
// instantiated graph of a captured stream, the median replay time of a graph, and the copy
// ceilings a step is compared with (docs/benchmark.md); and how two runs' outputs are compared.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "sparsekv/kv_footprint.h"
#include "sparsekv/status.h"
#include "tools/sparsekv/bench/gpu_variants.h"

namespace sparsekv::tools {

// The median of `v`; 0 if empty.
double Median(std::vector<double> v);

// The largest relative L2 error of `got` against `want`, bf16 vectors of `n` values each (the
// outputs of one request in one layer), over all of them; 1 if the sizes differ, 1e30 if an
// error is not finite.
double MaxRelativeError(const std::vector<std::byte>& got, const std::vector<std::byte>& want,
                        int64_t n);

// A start and a stop event; Ms is the time between them once the stop has completed.
class EventPair {
 public:
  EventPair() {
    cudaEventCreate(&start_);
    cudaEventCreate(&stop_);
  }
  ~EventPair() {
    cudaEventDestroy(start_);
    cudaEventDestroy(stop_);
  }
  EventPair(const EventPair&) = delete;
  EventPair& operator=(const EventPair&) = delete;
  Status Start(cudaStream_t s) { return CudaStatus(cudaEventRecord(start_, s), "event record"); }
  Status Stop(cudaStream_t s) { return CudaStatus(cudaEventRecord(stop_, s), "event record"); }
  // REQUIRES: the stop event has completed.
  StatusOr<double> Ms() const {
    float ms = 0;
    SPARSEKV_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, start_, stop_));
    return double{ms};
  }

 private:
  cudaEvent_t start_ = nullptr;
  cudaEvent_t stop_ = nullptr;
};

// An instantiated CUDA graph of what `body` enqueues on a stream.
class Graph {
 public:
  Graph() = default;
  ~Graph() {
    if (exec_ != nullptr) cudaGraphExecDestroy(exec_);
  }
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;

  template <typename Body>
  Status Capture(cudaStream_t stream, Body&& body) {
    SPARSEKV_CUDA_RETURN_IF_ERROR(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    const Status s = body();
    cudaGraph_t graph = nullptr;
    const cudaError_t end = cudaStreamEndCapture(stream, &graph);
    if (!s.ok() || end != cudaSuccess) {
      if (graph != nullptr) cudaGraphDestroy(graph);
      cudaGetLastError();
      return s.ok() ? CudaStatus(end, "cudaStreamEndCapture") : s;
    }
    const cudaError_t inst = cudaGraphInstantiate(&exec_, graph, 0);
    cudaGraphDestroy(graph);
    return CudaStatus(inst, "cudaGraphInstantiate");
  }
  Status Launch(cudaStream_t stream) const {
    return CudaStatus(cudaGraphLaunch(exec_, stream), "cudaGraphLaunch");
  }

 private:
  cudaGraphExec_t exec_ = nullptr;
};

// Median ms of `reps` replays of `graph` (after one untimed), timed with events.
StatusOr<double> TimeGraph(const Graph& graph, cudaStream_t stream, int reps);

// Pinned memcpy both ways and a device copy, `bytes` each, median of 5 after 1 warm-up.
StatusOr<Ceilings> MeasureCeilings(std::byte* pinned, size_t bytes, cudaStream_t s);

}  // namespace sparsekv::tools
