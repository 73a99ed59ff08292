// The CUPTI step tracer (gpu_trace.h) on a small graph captured from two streams, as `sparsekv
// bench --trace-step` uses it: labelled capture, one untraced replay, then a traced one. Needs a
// GPU (skipped without one); in a build without CUPTI, only that Create says so.
#include "tools/sparsekv/bench/gpu_trace.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "cuda_common/cuda_check.h"
#include "cuda_common/device_buffer.h"
#include "tools/sparsekv/bench/gpu_kernels.h"
#include "tools/sparsekv/bench/gpu_timing.h"

namespace sparsekv::tools {
namespace {

using cuda_common::CheckDevice;
using cuda_common::DeviceBuffer;

constexpr int64_t kValues = int64_t{1} << 24;  // bf16 values per buffer: 32 MB, tens of µs

TEST(StepTracerTest, WithoutCuptiCreateIsUnavailable) {
  if (StepTracer::Available()) GTEST_SKIP() << "built with CUPTI";
  EXPECT_EQ(StepTracer::Create().status().code(), StatusCode::kUnavailable);
}

class Streams {
 public:
  Streams() {
    cudaStreamCreateWithFlags(&main, cudaStreamNonBlocking);
    cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking);
    cudaEventCreateWithFlags(&fork, cudaEventDisableTiming);
    cudaEventCreateWithFlags(&join, cudaEventDisableTiming);
  }
  ~Streams() {
    cudaEventDestroy(fork);
    cudaEventDestroy(join);
    cudaStreamDestroy(main);
    cudaStreamDestroy(side);
  }
  cudaStream_t main = nullptr;
  cudaStream_t side = nullptr;
  cudaEvent_t fork = nullptr;
  cudaEvent_t join = nullptr;
};

TEST(StepTracerTest, LabelsTheStreamsOfAGraphAndTracesItsReplays) {
  if (!StepTracer::Available()) GTEST_SKIP() << "built without CUPTI";
  if (!CheckDevice(0).ok()) GTEST_SKIP() << "no CUDA device";
  StatusOr<std::unique_ptr<StepTracer>> created = StepTracer::Create();
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  std::unique_ptr<StepTracer> tracer = std::move(created).value();
  EXPECT_EQ(StepTracer::Create().status().code(), StatusCode::kFailedPrecondition);

  Streams st;
  StatusOr<DeviceBuffer> a = DeviceBuffer::Allocate(kValues * 2, "StepTracerTest");
  StatusOr<DeviceBuffer> b = DeviceBuffer::Allocate(kValues * 2, "StepTracerTest");
  StatusOr<DeviceBuffer> c = DeviceBuffer::Allocate(kValues * 2, "StepTracerTest");
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  // Main: fill a; fork; fill a again; join; copy a -> c. Side: fill b, memset c.
  Graph graph;
  const Status captured = LabelledCapture(tracer.get(), st.main, [&] {
    return graph.Capture(st.main, [&]() -> Status {
      SPARSEKV_CUDA_RETURN_IF_ERROR(gpu::FillBf16(a->get(), kValues, 1, st.main));
      SPARSEKV_CUDA_RETURN_IF_ERROR(cudaEventRecord(st.fork, st.main));
      SPARSEKV_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(st.side, st.fork, 0));
      SPARSEKV_CUDA_RETURN_IF_ERROR(gpu::FillBf16(b->get(), kValues, 2, st.side));
      SPARSEKV_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(c->get(), 0, c->bytes(), st.side));
      SPARSEKV_CUDA_RETURN_IF_ERROR(gpu::FillBf16(a->get(), kValues, 3, st.main));
      SPARSEKV_CUDA_RETURN_IF_ERROR(cudaEventRecord(st.join, st.side));
      SPARSEKV_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(st.main, st.join, 0));
      return cuda_common::CudaStatus(
          cudaMemcpyAsync(c->get(), a->get(), a->bytes(), cudaMemcpyDeviceToDevice, st.main),
          "memcpy");
    });
  });
  ASSERT_TRUE(captured.ok()) << captured.ToString();
  ASSERT_TRUE(graph.Launch(st.main).ok());  // untraced, as the timed steps
  ASSERT_EQ(cudaStreamSynchronize(st.main), cudaSuccess);

  for (int replay = 0; replay < 2; ++replay) {  // the tracer is reusable
    ASSERT_TRUE(tracer->Start().ok());
    EXPECT_EQ(tracer->Start().code(), StatusCode::kFailedPrecondition);
    ASSERT_TRUE(graph.Launch(st.main).ok());
    ASSERT_EQ(cudaStreamSynchronize(st.main), cudaSuccess);
    StatusOr<TraceCapture> trace = tracer->Stop();
    ASSERT_TRUE(trace.ok()) << trace.status().ToString();
    EXPECT_EQ(trace->dropped_records, 0u);
    EXPECT_EQ(trace->lanes, 2);
    // 3 kernels, the memset (possibly run as a kernel) and the copy, each once.
    ASSERT_EQ(trace->records.size(), 5u) << replay;
    int fills_main = 0, fills_side = 0;
    for (const TraceRecord& r : trace->records) {
      EXPECT_NE(r.graph_node_id, 0u) << r.name;
      EXPECT_GE(r.start_ns, trace->window_start_ns) << r.name;
      EXPECT_LE(r.end_ns, trace->window_end_ns) << r.name;
      EXPECT_LT(r.start_ns, r.end_ns) << r.name;
      ASSERT_NE(r.lane, kUnknownLane) << r.name;
      if (r.name.find("FillBf16Kernel") != std::string::npos) {
        (r.lane == kMainLane ? fills_main : fills_side) += 1;
        EXPECT_GT(r.grid[0], 0);
        EXPECT_GT(r.block[0] * r.block[1] * r.block[2], 0);
      }
      if (r.kind == TraceKind::kMemcpy) {
        EXPECT_EQ(r.lane, kMainLane);
        EXPECT_EQ(r.bytes, static_cast<uint64_t>(kValues * 2));
      }
      if (r.kind == TraceKind::kMemset) {
        EXPECT_EQ(r.lane, 1);
      }
    }
    EXPECT_EQ(fills_main, 2);
    EXPECT_EQ(fills_side, 1);
    EXPECT_TRUE(std::is_sorted(
        trace->records.begin(), trace->records.end(),
        [](const TraceRecord& x, const TraceRecord& y) { return x.start_ns < y.start_ns; }));
    const StepTraceSummary s = SummarizeStepTrace(trace->records);
    EXPECT_EQ(s.unknown_lane_records, 0);
    EXPECT_GT(s.main_busy_us, 0);
    EXPECT_GT(s.side_busy_us, 0);
    EXPECT_NEAR(s.hidden_us + s.exposed_us, s.side_busy_us, 1e-6);
  }
  EXPECT_EQ(tracer->Stop().status().code(), StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace sparsekv::tools
