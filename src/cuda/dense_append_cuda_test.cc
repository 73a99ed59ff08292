// The CUDA DenseAppend against the reference (src/cpu/reference_ops.h), byte for byte.
//
// Compiled by the host compiler against the Backend interface (plus, where CUDA is built, the
// runtime's graph calls for the captured replay); every test skips where no device is present.
// Both sides get the same tables (pages and rings at the same offsets of an arena of their own),
// the same step and the same rows, over arenas filled with the same random bytes, and the whole
// arenas are compared, so a write outside what the contract allows shows up as a difference.
// The steps include unused rows, rows of no token, entries past a request's pages, null pages and
// rings, and rows at or past the batch size.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "cpu/reference_ops.h"
#include "sparsekv/backend.h"
#include "testing/cuda_test_util.h"
#include "testing/harness.h"

#if defined(SPARSEKV_WITH_CUDA)
#include <cuda_runtime.h>
#endif

namespace sparsekv {
namespace {

using Buffer = testing::DeviceBuffer;
using testing::Bytes;

struct Shape {
  int32_t entry_tokens;
  int32_t row_bytes;
  int32_t row_stride;
};

constexpr int32_t kMaxBatch = 8;
constexpr int32_t kTableRows = 12;
constexpr int32_t kPagesPerRow = 5;
constexpr int32_t kPageRows = 4;
constexpr int32_t kRawWindow = 8;

// Where the pages and rings lie in an arena: offsets, -1 for a null page or ring.
struct Tables {
  std::vector<int64_t> pages;  // [kTableRows, kPagesPerRow]
  std::vector<int64_t> rings;  // [kTableRows]
  int64_t arena_bytes = 0;
};

Tables MakeTables(const Shape& shape) {
  Tables t;
  const int64_t page_bytes = static_cast<int64_t>(kPageRows) * shape.row_stride;
  for (int32_t r = 0; r < kTableRows; ++r) {
    for (int32_t p = 0; p < kPagesPerRow; ++p) {
      // Row 3's last page and row 4's pages from the second on are null.
      const bool null = (r == 3 && p == kPagesPerRow - 1) || (r == 4 && p >= 1);
      t.pages.push_back(null ? -1 : t.arena_bytes);
      if (!null) t.arena_bytes += page_bytes;
    }
  }
  for (int32_t r = 0; r < kTableRows; ++r) {
    const bool null = r == 5;
    t.rings.push_back(null ? -1 : t.arena_bytes);
    if (!null) t.arena_bytes += static_cast<int64_t>(kRawWindow) * shape.row_stride;
  }
  return t;
}

std::vector<std::byte*> Addresses(std::byte* arena, const std::vector<int64_t>& offsets) {
  std::vector<std::byte*> out;
  for (int64_t o : offsets) out.push_back(o < 0 ? nullptr : arena + o);
  return out;
}

// A step: [0] batch size, then table rows, then seq_len, as DenseLayerStore lays it out.
std::vector<int32_t> RandomStep(std::mt19937_64& rng, const Shape& shape) {
  std::vector<int32_t> step(1 + 2 * kMaxBatch);
  step[0] = static_cast<int32_t>(rng() % (kMaxBatch + 1));
  std::vector<int32_t> rows(kTableRows);
  std::iota(rows.begin(), rows.end(), 0);
  std::shuffle(rows.begin(), rows.end(), rng);
  const int32_t most = (kPagesPerRow * kPageRows + 2) * shape.entry_tokens;
  for (int32_t b = 0; b < kMaxBatch; ++b) {
    step[1 + b] = rng() % 8 == 0 ? -1 : rows[b];
    // Often a multiple of the cadence, so that entries complete; sometimes 0 tokens.
    int32_t n = static_cast<int32_t>(rng() % (most + 1));
    if (rng() % 2 == 0) n -= n % shape.entry_tokens;
    step[1 + kMaxBatch + b] = n;
  }
  return step;
}

DenseAppendView ViewOf(const Shape& shape, const int32_t* step, const std::byte* entry_rows,
                       const std::byte* window_rows, std::byte* const* pages,
                       std::byte* const* rings, unsigned long long* invalid) {
  DenseAppendView v{};
  v.batch_size = step;
  v.table_row = step + 1;
  v.seq_len = step + 1 + kMaxBatch;
  v.entry_rows = entry_rows;
  v.entry_stride = shape.row_stride;
  v.window_rows = window_rows;
  v.window_stride = shape.row_stride;
  v.pages = pages;
  v.pages_per_row = kPagesPerRow;
  v.page_rows = kPageRows;
  v.rings = rings;
  v.raw_window = kRawWindow;
  v.entry_tokens = shape.entry_tokens;
  v.row_bytes = shape.row_bytes;
  v.row_stride = shape.row_stride;
  v.invalid = invalid;
  return v;
}

Bytes RandomBytes(std::mt19937_64& rng, size_t n) {
  Bytes out(n);
  for (auto& b : out) b = static_cast<std::byte>(rng());
  return out;
}

// Both sides' state for one shape: the reference's arena in host memory, the device's in HBM.
class DenseAppendPair {
 public:
  DenseAppendPair(Backend& gpu, const Shape& shape, std::mt19937_64& rng)
      : shape_(shape),
        tables_(MakeTables(shape)),
        cpu_arena_(RandomBytes(rng, tables_.arena_bytes)),
        gpu_arena_(gpu, tables_.arena_bytes),
        gpu_pages_(gpu, tables_.pages.size() * sizeof(std::byte*)),
        gpu_rings_(gpu, tables_.rings.size() * sizeof(std::byte*)),
        gpu_step_(gpu, (1 + 2 * kMaxBatch) * sizeof(int32_t)),
        gpu_entries_(gpu, kMaxBatch * shape.row_stride),
        gpu_window_(gpu, kMaxBatch * shape.row_stride),
        gpu_invalid_(gpu, sizeof(unsigned long long)) {
    gpu_arena_.Upload(cpu_arena_);
    gpu_pages_.Upload(Addresses(gpu_arena_.get(), tables_.pages));
    gpu_rings_.Upload(Addresses(gpu_arena_.get(), tables_.rings));
    gpu_invalid_.Upload(std::vector<unsigned long long>{0});
    cpu_pages_ = Addresses(cpu_arena_.data(), tables_.pages);
    cpu_rings_ = Addresses(cpu_arena_.data(), tables_.rings);
  }

  // The device's view, over its own buffers (valid for the pair's life: what a graph captures).
  DenseAppendView DeviceView(bool entries, bool window) const {
    return ViewOf(shape_, gpu_step_.get<int32_t>(), entries ? gpu_entries_.get() : nullptr,
                  window ? gpu_window_.get() : nullptr, gpu_pages_.get<std::byte*>(),
                  gpu_rings_.get<std::byte*>(), gpu_invalid_.get<unsigned long long>());
  }
  // Puts a new step and new rows on both sides; runs the reference.
  void NextStep(std::mt19937_64& rng, bool entries, bool window) {
    const std::vector<int32_t> step = RandomStep(rng, shape_);
    const Bytes entry_rows = RandomBytes(rng, kMaxBatch * shape_.row_stride);
    const Bytes window_rows = RandomBytes(rng, kMaxBatch * shape_.row_stride);
    gpu_step_.Upload(step);
    gpu_entries_.Upload(entry_rows);
    gpu_window_.Upload(window_rows);
    reference::DenseAppend(ViewOf(shape_, step.data(), entries ? entry_rows.data() : nullptr,
                                  window ? window_rows.data() : nullptr, cpu_pages_.data(),
                                  cpu_rings_.data(), &cpu_invalid_),
                           kMaxBatch);
  }
  void ExpectEqual() const {
    const Bytes gpu = gpu_arena_.Download(nullptr);
    ASSERT_EQ(gpu.size(), cpu_arena_.size());
    for (size_t i = 0; i < gpu.size(); ++i) {
      ASSERT_EQ(gpu[i], cpu_arena_[i]) << "arena byte " << i;
    }
    EXPECT_EQ(gpu_invalid_.Download<unsigned long long>()[0], cpu_invalid_);
  }

 private:
  Shape shape_;
  Tables tables_;
  Bytes cpu_arena_;
  std::vector<std::byte*> cpu_pages_, cpu_rings_;
  unsigned long long cpu_invalid_ = 0;
  Buffer gpu_arena_, gpu_pages_, gpu_rings_, gpu_step_, gpu_entries_, gpu_window_, gpu_invalid_;
};

class CudaDenseAppendTest : public ::testing::TestWithParam<Shape> {};

TEST_P(CudaDenseAppendTest, MatchesTheReferenceByteForByte) {
  SPARSEKV_REQUIRE_GPU(gpu);
  std::mt19937_64 rng(GetParam().entry_tokens * 1000 + GetParam().row_bytes);
  for (const bool entries : {true, false}) {
    for (const bool window : {true, false}) {
      DenseAppendPair pair(*gpu, GetParam(), rng);
      for (int step = 0; step < 20; ++step) {
        pair.NextStep(rng, entries, window);
        ASSERT_TRUE(gpu->DenseAppend(pair.DeviceView(entries, window), kMaxBatch, nullptr).ok());
        ASSERT_TRUE(gpu->Synchronize(nullptr).ok());
        pair.ExpectEqual();
      }
    }
  }
}

#if defined(SPARSEKV_WITH_CUDA)
// One launch captured, replayed over steps of other batch sizes, rows and completed entries.
TEST_P(CudaDenseAppendTest, CapturedLaunchReplaysOverNewSteps) {
  SPARSEKV_REQUIRE_GPU(gpu);
  std::mt19937_64 rng(7 + GetParam().entry_tokens);
  DenseAppendPair pair(*gpu, GetParam(), rng);
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  testing::CapturedGraph graph;
  for (int step = 0; step < 20; ++step) {
    pair.NextStep(rng, true, true);
    const Status launched =
        graph.captured() ? graph.Launch(stream) : graph.CaptureAndLaunch(stream, [&] {
          return gpu->DenseAppend(pair.DeviceView(true, true), kMaxBatch, stream);
        });
    ASSERT_TRUE(launched.ok()) << launched.ToString();
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    pair.ExpectEqual();
  }
  cudaStreamDestroy(stream);
}
#endif

TEST(CudaDenseAppendShapeTest, RefusesUnsupportedShapes) {
  SPARSEKV_REQUIRE_GPU(gpu);
  DenseAppendView v{};
  v.entry_tokens = 0;
  v.page_rows = 4;
  v.row_bytes = 8;
  v.row_stride = 8;
  EXPECT_FALSE(gpu->DenseAppend(v, kMaxBatch, nullptr).ok());
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaDenseAppendTest,
                         ::testing::Values(Shape{1, 584, 592}, Shape{4, 584, 592},
                                           Shape{128, 584, 592}, Shape{4, 37, 40},
                                           Shape{128, 368, 368}));

}  // namespace
}  // namespace sparsekv
