#include <gtest/gtest.h>

#include <utility>

#include "cuda_common/cuda_check.h"
#include "cuda_common/device_buffer.h"

namespace sparsekv::cuda_common {
namespace {

Status FailingCall() {
  SPARSEKV_CUDA_RETURN_IF_ERROR(cudaErrorInvalidValue);
  return Status::Ok();
}

TEST(CudaCheckTest, ReturnsInternalNamingTheCall) {
  const Status status = FailingCall();
  EXPECT_EQ(status.code(), StatusCode::kInternal);
  EXPECT_NE(status.message().find("cudaErrorInvalidValue"), std::string::npos) << status.ToString();
}

TEST(CudaCheckTest, CudaStatusIsOkOnlyForSuccess) {
  EXPECT_TRUE(CudaStatus(cudaSuccess, "cudaStreamSynchronize").ok());
  const Status status = CudaStatus(cudaErrorInvalidValue, "ingest");
  EXPECT_EQ(status.code(), StatusCode::kInternal);
  EXPECT_EQ(status.message().rfind("ingest: ", 0), 0u) << status.ToString();
}

TEST(CudaCheckTest, NoDeviceIsUnavailable) {
  const Status status = CheckDevice(1 << 20);
  EXPECT_EQ(status.code(), StatusCode::kUnavailable) << status.ToString();
}

TEST(DeviceBufferTest, OwnsAndMovesItsMemory) {
  if (!CheckDevice(0).ok()) GTEST_SKIP() << "no CUDA device";
  StatusOr<DeviceBuffer> allocated = DeviceBuffer::Allocate(4096, "DeviceBufferTest");
  ASSERT_TRUE(allocated.ok()) << allocated.status().ToString();
  DeviceBuffer buffer = std::move(allocated).value();
  ASSERT_NE(buffer.get(), nullptr);
  EXPECT_EQ(buffer.bytes(), 4096u);
  EXPECT_EQ(cudaMemset(buffer.get(), 0x5A, buffer.bytes()), cudaSuccess);
  DeviceBuffer moved = std::move(buffer);
  EXPECT_EQ(buffer.get(), nullptr);
  EXPECT_EQ(buffer.bytes(), 0u);
  EXPECT_NE(moved.get(), nullptr);
}

TEST(DeviceBufferTest, FailedAllocationIsResourceExhausted) {
  if (!CheckDevice(0).ok()) GTEST_SKIP() << "no CUDA device";
  StatusOr<DeviceBuffer> allocated = DeviceBuffer::Allocate(size_t{1} << 62, "DeviceBufferTest");
  ASSERT_FALSE(allocated.ok());
  EXPECT_EQ(allocated.status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

}  // namespace
}  // namespace sparsekv::cuda_common
