// Test helper: the CUDA backend, or a clean skip where there is none (CI has nvcc but no GPU).
#pragma once

#include <memory>

#include "sparsekv/backend.h"

namespace sparsekv::testing {

// Returns the CUDA backend on device 0, or nullptr after calling GTEST_SKIP() with the reason.
// Use as: auto gpu = CudaBackendOrSkip(); if (!gpu) return;
std::shared_ptr<Backend> CudaBackendOrSkip();

}  // namespace sparsekv::testing

// Skips the current test (with the reason) unless a CUDA device is present.
#define SPARSEKV_REQUIRE_GPU(var)                                                      \
  std::shared_ptr<::sparsekv::Backend> var = ::sparsekv::testing::CudaBackendOrSkip(); \
  if (var == nullptr) return
