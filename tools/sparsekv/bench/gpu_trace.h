// The CUPTI activity trace behind `sparsekv bench --trace-step` (docs/benchmark.md, "Profile a
// step"): every kernel, memcpy and memset that runs on the GPU between Start and Stop, with its
// start and end (CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, which keeps kernels concurrent, graph
// launches included), and the stream each node of the traced graph was captured on.
//
// Why the capture stream: a CUDA graph runs its branches on streams of its own, so the stream
// CUPTI reports for a graph's kernel does not say whether it was captured on the step's main
// stream or on a side stream. Between BeginCapture and EndCapture the tracer watches the capture
// (CUPTI callbacks on the launch calls and on graph node creation and cloning) and labels every
// captured node; Stop gives each record the lane of its node (step_trace.h).
//
// Built with CUPTI where the CUDA toolkit has it (CMake's CUDA::cupti, SPARSEKV_CUPTI); without
// it Create returns Unavailable. One StepTracer per process (CUPTI has one subscriber), used from
// one thread; CUPTI's callbacks may run on other threads, and the state they share is locked.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>

#include "sparsekv/status.h"
#include "tools/sparsekv/bench/step_trace.h"

namespace sparsekv::tools {

class StepTracer {
 public:
  // Whether this build has CUPTI (if not, Create returns Unavailable).
  static bool Available();

  // Subscribes to CUPTI until destroyed. Unavailable without CUPTI; FailedPrecondition if another
  // StepTracer is alive or another CUPTI client (a profiler) holds the subscription; Internal for
  // any other CUPTI error.
  static StatusOr<std::unique_ptr<StepTracer>> Create();
  ~StepTracer();
  StepTracer(const StepTracer&) = delete;
  StepTracer& operator=(const StepTracer&) = delete;

  // Labels the graph nodes created by launches, copies and memsets that the calling thread
  // captures from now until EndCapture: those on `origin` get kMainLane, those on any other
  // stream 1, 2, ... in the order the capture first uses it. The previous capture's labels are
  // forgotten. Let the window cover the instantiation too: it clones the nodes into the
  // executable graph, and the records carry the clones' ids (labelled when cloned, at any time).
  // REQUIRES: no window open (checked: FailedPrecondition).
  Status BeginCapture(cudaStream_t origin);
  Status EndCapture();

  // Records the activities between Start and Stop. CUPTI's instrumentation applies only in
  // between. REQUIRES: Start: not started (checked: FailedPrecondition); Stop: started (checked),
  // and what was traced has completed (the caller synchronised; not checked: unfinished work
  // would be missing or lack timestamps).
  Status Start();
  StatusOr<TraceCapture> Stop();

 private:
  StepTracer() = default;
  bool started_ = false;
  uint64_t window_start_ns_ = 0;  // cuptiGetTimestamp at Start
};

// Runs `capture` (a Status-returning callable that captures and instantiates a graph from
// `origin`) inside tracer's BeginCapture / EndCapture window; just runs it if tracer is null.
// Returns the first error.
template <typename Capture>
Status LabelledCapture(StepTracer* tracer, cudaStream_t origin, Capture&& capture) {
  if (tracer == nullptr) return capture();
  SPARSEKV_RETURN_IF_ERROR(tracer->BeginCapture(origin));
  const Status captured = capture();
  const Status ended = tracer->EndCapture();
  return captured.ok() ? ended : captured;
}

}  // namespace sparsekv::tools
