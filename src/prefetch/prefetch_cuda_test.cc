// The CUDA prefetch predictor against its reference (sparsekv/prefetch.h), on random inputs with
// padding, duplicates, out-of-range positions, unused rows and rows past the batch size. The
// output is poisoned identically on both sides and compared whole. Skips without a GPU.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "sparsekv/prefetch.h"
#include "testing/cuda_test_util.h"
#include "testing/harness.h"

#if defined(SPARSEKV_WITH_CUDA)
#include <cuda_runtime.h>
#endif

namespace sparsekv {
namespace {

using Buffer = testing::DeviceBuffer;

struct Case {
  int32_t max_batch;
  int32_t batch_size;
  int32_t top_k;
  int32_t stride_pad;
  int32_t budget;
  int32_t window;
  int32_t max_seq_len;  // small: many collisions between misses and their neighbours
};

std::string Describe(const Case& c) {
  return "max_batch " + std::to_string(c.max_batch) + " batch " + std::to_string(c.batch_size) +
         " top_k " + std::to_string(c.top_k) + " budget " + std::to_string(c.budget) + " window " +
         std::to_string(c.window) + " seq_len <= " + std::to_string(c.max_seq_len);
}

TEST(PrefetchCudaTest, MatchesTheReferenceOnRandomRows) {
  SPARSEKV_REQUIRE_GPU(gpu);
  const std::vector<Case> cases = {{1, 1, 1, 0, 1, 1, 4},          {4, 3, 64, 0, 16, 1, 200},
                                   {8, 8, 64, 5, 1024, 1, 90},     {16, 11, 300, 0, 37, 3, 100000},
                                   {5, 5, 2048, 0, 256, 1, 32768}, {3, 2, 2048, 7, 1024, 0, 3000},
                                   {2, 2, 4096, 0, 1024, 1, 9000}, {64, 40, 257, 0, 200, 2, 600},
                                   {4, 0, 64, 0, 8, 1, 100}};
  std::mt19937_64 rng(11);
  for (const Case& c : cases) {
    SCOPED_TRACE(Describe(c));
    const int32_t stride = c.top_k + c.stride_pad;
    std::vector<BatchEntry> batch(c.max_batch);
    std::vector<int32_t> topk(static_cast<size_t>(c.max_batch) * stride);
    std::vector<uint8_t> fill(static_cast<size_t>(c.max_batch) * c.top_k);
    for (int32_t b = 0; b < c.max_batch; ++b) {
      const int32_t seq_len = static_cast<int32_t>(rng() % (c.max_seq_len + 1));
      batch[b] = {rng() % 7 == 0 ? -1 : b, seq_len, b};
      int32_t* row = topk.data() + static_cast<size_t>(b) * stride;
      for (int32_t k = 0; k < stride; ++k) {
        const uint64_t kind = rng() % 10;
        row[k] = kind == 0            ? -1
                 : kind == 1          ? static_cast<int32_t>(rng() % 64) + seq_len  // out of range
                 : kind == 2          ? -2 - static_cast<int32_t>(rng() % 5)
                 : kind == 3 && k > 0 ? row[rng() % k]                        // duplicate
                 : kind == 4 ? seq_len - 1 - static_cast<int32_t>(rng() % 4)  // near the window
                             : static_cast<int32_t>(rng() % std::max(1, seq_len));
      }
      for (int32_t k = 0; k < c.top_k; ++k) fill[b * c.top_k + k] = rng() % 2 ? 1 : 0;
    }
    const int32_t batch_size = c.batch_size;
    const size_t out_count = static_cast<size_t>(c.max_batch) * c.budget;

    std::vector<int32_t> expected(out_count);
    std::memset(expected.data(), 0xA5, out_count * sizeof(int32_t));
    PredictPrefetchReference({&batch_size, batch.data(), topk.data(), c.top_k, stride, fill.data(),
                              c.window, c.budget, expected.data()});

    Buffer d_size(*gpu, sizeof(int32_t));
    Buffer d_batch(*gpu, batch.size() * sizeof(BatchEntry));
    Buffer d_topk(*gpu, topk.size() * sizeof(int32_t));
    Buffer d_fill(*gpu, fill.size());
    Buffer d_out(*gpu, out_count * sizeof(int32_t));
    d_size.Upload(std::vector<int32_t>{batch_size});
    d_batch.Upload(batch);
    d_topk.Upload(topk);
    d_fill.Upload(fill);
    d_out.Fill(0xA5);
    const PrefetchView view{d_size.get<int32_t>(),
                            d_batch.get<BatchEntry>(),
                            d_topk.get<int32_t>(),
                            c.top_k,
                            stride,
                            d_fill.get<uint8_t>(),
                            c.window,
                            c.budget,
                            d_out.get<int32_t>()};
    const Status launched = PredictPrefetchCuda(view, c.max_batch, nullptr);
    ASSERT_TRUE(launched.ok()) << launched.ToString();
    ASSERT_TRUE(gpu->Synchronize(nullptr).ok());
    const std::vector<int32_t> got = d_out.Download<int32_t>();
    for (size_t i = 0; i < out_count; ++i) {
      ASSERT_EQ(got[i], expected[i]) << "row " << i / c.budget << " entry " << i % c.budget;
    }
  }
}

#if defined(SPARSEKV_WITH_CUDA)
// One launch captured into a CUDA graph, replayed with new contents of the same buffers (batch
// size included): each replay matches the reference on that step's inputs.
TEST(PrefetchCudaTest, ACapturedLaunchReplaysWithNewInputs) {
  SPARSEKV_REQUIRE_GPU(gpu);
  constexpr int32_t kMaxBatch = 6, kTopK = 2048, kBudget = 64, kWindow = 1;
  Buffer d_size(*gpu, sizeof(int32_t));
  Buffer d_batch(*gpu, kMaxBatch * sizeof(BatchEntry));
  Buffer d_topk(*gpu, kMaxBatch * kTopK * sizeof(int32_t));
  Buffer d_fill(*gpu, kMaxBatch * kTopK);
  Buffer d_out(*gpu, kMaxBatch * kBudget * sizeof(int32_t));
  const PrefetchView view{d_size.get<int32_t>(),
                          d_batch.get<BatchEntry>(),
                          d_topk.get<int32_t>(),
                          kTopK,
                          kTopK,
                          d_fill.get<uint8_t>(),
                          kWindow,
                          kBudget,
                          d_out.get<int32_t>()};
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  const Status captured = PredictPrefetchCuda(view, kMaxBatch, stream);
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  ASSERT_TRUE(captured.ok()) << captured.ToString();
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  std::mt19937_64 rng(3);
  for (int32_t batch_size : {6, 2, 5}) {
    SCOPED_TRACE("batch " + std::to_string(batch_size));
    std::vector<BatchEntry> batch(kMaxBatch);
    std::vector<int32_t> topk(kMaxBatch * kTopK);
    std::vector<uint8_t> fill(kMaxBatch * kTopK);
    for (int32_t b = 0; b < kMaxBatch; ++b) {
      const int32_t seq_len = 4096 + static_cast<int32_t>(rng() % 60000);
      batch[b] = {b, seq_len, b};
      for (int32_t k = 0; k < kTopK; ++k) {
        topk[b * kTopK + k] = static_cast<int32_t>(rng() % seq_len);
        fill[b * kTopK + k] = rng() % 5 == 0 ? 1 : 0;
      }
    }
    std::vector<int32_t> expected(kMaxBatch * kBudget);
    std::memset(expected.data(), 0xA5, expected.size() * sizeof(int32_t));
    PredictPrefetchReference({&batch_size, batch.data(), topk.data(), kTopK, kTopK, fill.data(),
                              kWindow, kBudget, expected.data()});
    d_size.Upload(std::vector<int32_t>{batch_size});
    d_batch.Upload(batch);
    d_topk.Upload(topk);
    d_fill.Upload(fill);
    d_out.Fill(0xA5);
    ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    EXPECT_EQ(d_out.Download<int32_t>(), expected);
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}
#endif

TEST(PrefetchCudaTest, RejectsShapesItDoesNotCover) {
  SPARSEKV_REQUIRE_GPU(gpu);
  const int32_t one = 1;
  PrefetchView view{&one, nullptr, nullptr, 64, 64, nullptr, 1, 16, nullptr};
  view.top_k = kMaxPrefetchTopK + 1;
  view.topk_stride = view.top_k;
  EXPECT_EQ(PredictPrefetchCuda(view, 1, nullptr).code(), StatusCode::kInvalidArgument);
  view.top_k = view.topk_stride = 64;
  view.budget = kMaxPrefetchBudget + 1;
  EXPECT_EQ(PredictPrefetchCuda(view, 1, nullptr).code(), StatusCode::kInvalidArgument);
  view.budget = 16;
  view.topk_stride = 63;
  EXPECT_EQ(PredictPrefetchCuda(view, 1, nullptr).code(), StatusCode::kInvalidArgument);
  view.topk_stride = 64;
  view.window = -1;
  EXPECT_EQ(PredictPrefetchCuda(view, 1, nullptr).code(), StatusCode::kInvalidArgument);
}

TEST(PrefetchCudaTest, UnavailableWithoutTheCudaBuild) {
  if (CudaBackendCompiled()) GTEST_SKIP() << "built with CUDA";
  const int32_t one = 1;
  const PrefetchView view{&one, nullptr, nullptr, 1, 1, nullptr, 1, 1, nullptr};
  EXPECT_EQ(PredictPrefetchCuda(view, 1, nullptr).code(), StatusCode::kUnavailable);
}

}  // namespace
}  // namespace sparsekv
