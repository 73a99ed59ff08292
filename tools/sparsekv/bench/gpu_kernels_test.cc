// The benchmark's kernels for DeepSeek-V4 against their definitions on the host (kv_content.h,
// entry_scopes.h): the entries' content and full-hbm's scope indices and append, byte for byte.
// Needs a GPU (skipped without one).
#include "tools/sparsekv/bench/gpu_kernels.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "cuda_common/cuda_check.h"
#include "cuda_common/device_buffer.h"
#include "tools/sparsekv/bench/entry_scopes.h"
#include "tools/sparsekv/bench/kv_content.h"

namespace sparsekv::tools {
namespace {

using cuda_common::CheckDevice;
using cuda_common::DeviceBuffer;

constexpr const char* kOwner = "GpuKernelsTest";

template <typename T>
DeviceBuffer Upload(const std::vector<T>& host) {
  StatusOr<DeviceBuffer> d = DeviceBuffer::Allocate(host.size() * sizeof(T), kOwner);
  EXPECT_TRUE(d.ok());
  EXPECT_EQ(cudaMemcpy(d->get(), host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice),
            cudaSuccess);
  return std::move(*d);
}

template <typename T>
std::vector<T> Download(const DeviceBuffer& d) {
  std::vector<T> host(d.bytes() / sizeof(T));
  EXPECT_EQ(cudaMemcpy(host.data(), d.get(), d.bytes(), cudaMemcpyDeviceToHost), cudaSuccess);
  return host;
}

TEST(GpuKernelsTest, FillKVRowsWritesKVContentWord) {
  if (!CheckDevice(0).ok()) GTEST_SKIP() << "no CUDA device";
  for (int32_t row_bytes : {656, 1152, 584, 368}) {
    const int32_t rows = 5, stride = row_bytes + 8;
    DeviceBuffer d = Upload(std::vector<uint32_t>(rows * stride / 4, 0));
    ASSERT_EQ(gpu::FillKVRows(d.get<std::byte>(), stride, 0, rows, row_bytes, 3, 7, 40, 9, nullptr),
              cudaSuccess);
    const std::vector<uint32_t> got = Download<uint32_t>(d);
    for (int32_t r = 0; r < rows; ++r) {
      for (int32_t w = 0; w < row_bytes / 4; ++w) {
        ASSERT_EQ(got[r * stride / 4 + w], KVContentWord(row_bytes, w, 3, 7, 40 + r, 9))
            << row_bytes << " row " << r << " word " << w;
      }
    }
  }
  EXPECT_EQ(gpu::FillKVRows(nullptr, 576, 0, 1, 576, 0, 0, 0, 1, nullptr), cudaErrorInvalidValue);
}

TEST(GpuKernelsTest, EntryScopeIndicesAndAppendFollowEntryScopes) {
  if (!CheckDevice(0).ok()) GTEST_SKIP() << "no CUDA device";
  const int32_t batch = 3, r = 4, entry_rows = 12, w = 8, width = 14, stride = 16;
  const std::vector<int32_t> positions = {3, 10, 39};  // tokens 4, 11, 40
  DeviceBuffer pos = Upload(positions);
  DeviceBuffer every = Upload(std::vector<int32_t>(batch * width, 7));
  DeviceBuffer window = Upload(std::vector<int32_t>(batch * w, 7));
  ASSERT_EQ(gpu::EntryScopeIndices(pos.get<int32_t>(), batch, width, r, entry_rows,
                                   every.get<int32_t>(), w, window.get<int32_t>(), nullptr),
            cudaSuccess);
  const std::vector<int32_t> e = Download<int32_t>(every), x = Download<int32_t>(window);
  for (int32_t b = 0; b < batch; ++b) {
    for (int32_t k = 0; k < width; ++k) {
      EXPECT_EQ(e[b * width + k], EveryEntryIndex(b, k, positions[b] + 1, r, entry_rows));
    }
    for (int32_t i = 0; i < w; ++i) {
      EXPECT_EQ(x[b * w + i], WindowIndex(b, i, positions[b] + 1, w));
    }
  }
  // The append: row b of new_rows (bytes b + 1) to the completed entry and to the ring slot.
  std::vector<uint8_t> rows(batch * stride);
  for (int32_t b = 0; b < batch; ++b) std::memset(rows.data() + b * stride, b + 1, stride);
  DeviceBuffer new_rows = Upload(rows);
  DeviceBuffer entries = Upload(std::vector<uint8_t>(batch * entry_rows * stride, 0));
  DeviceBuffer rings = Upload(std::vector<uint8_t>(batch * w * stride, 0));
  ASSERT_EQ(gpu::AppendEntryRows(new_rows.get<std::byte>(), batch, stride, stride,
                                 pos.get<int32_t>(), r, entry_rows, entries.get<std::byte>(), w,
                                 rings.get<std::byte>(), nullptr),
            cudaSuccess);
  const std::vector<uint8_t> got_entries = Download<uint8_t>(entries);
  const std::vector<uint8_t> got_rings = Download<uint8_t>(rings);
  for (int32_t b = 0; b < batch; ++b) {
    const int32_t n = positions[b] + 1;
    for (int32_t row = 0; row < batch * entry_rows; ++row) {
      const uint8_t want = row == AppendedEntryRow(b, n, r, entry_rows) ? b + 1 : 0;
      if (row / entry_rows != b) continue;
      EXPECT_EQ(got_entries[row * stride], want) << b << " " << row;
    }
    for (int32_t row = b * w; row < (b + 1) * w; ++row) {
      EXPECT_EQ(got_rings[row * stride], row == AppendedWindowRow(b, n, w) ? b + 1 : 0)
          << b << " " << row;
    }
  }
}

}  // namespace
}  // namespace sparsekv::tools
