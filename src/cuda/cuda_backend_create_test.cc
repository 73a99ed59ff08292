// CreateCudaBackend on a machine without a GPU: Unavailable, saying that no device is present
// (not that the driver is too old). Runs where the CUDA backend is compiled and no GPU exists.
#include <gtest/gtest.h>

#include <filesystem>

#include "sparsekv/backend.h"

namespace sparsekv {
namespace {

TEST(CudaBackendCreateTest, WithoutAGpuSaysNoDeviceIsPresent) {
  if (!CudaBackendCompiled()) GTEST_SKIP() << "built without the CUDA backend";
  StatusOr<std::shared_ptr<Backend>> backend = CreateCudaBackend(0);
  if (backend.ok()) GTEST_SKIP() << "a CUDA device is present";
  EXPECT_EQ(backend.status().code(), StatusCode::kUnavailable) << backend.status().ToString();
  EXPECT_NE(backend.status().message().find("CUDA device"), std::string::npos)
      << backend.status().ToString();
  // No NVIDIA kernel driver loaded: nothing may blame the driver's version.
  if (!std::filesystem::exists("/proc/driver/nvidia")) {
    EXPECT_NE(backend.status().message().find("no CUDA device is present"), std::string::npos)
        << backend.status().ToString();
  }
}

}  // namespace
}  // namespace sparsekv
