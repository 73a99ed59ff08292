#include "testing/cuda_test_util.h"

#include <gtest/gtest.h>

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

}  // namespace sparsekv::testing
