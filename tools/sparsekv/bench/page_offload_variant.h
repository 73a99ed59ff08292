// The page-offload variant as a StepVariant of the end-to-end GPU benchmark (gpu_variants.h): a
// PageOffloadCache (page_offload.h) on the CUDA backend, its element-wise steps as the kernels of
// gpu_kernels.h, every request's prompt filled with the benchmark's synthetic content.
#pragma once

#include <cuda_runtime.h>

#include <memory>

#include "sparsekv/backend.h"
#include "sparsekv/status.h"
#include "tools/sparsekv/bench/gpu_variants.h"

namespace sparsekv::tools {

// Creates the variant for `setup` and fills every request's prompt (synchronising `stream` before
// returning). `host` serves the host pool (the pinned arena).
StatusOr<std::unique_ptr<StepVariant>> CreatePageOffloadVariant(const VariantSetup& setup,
                                                                std::shared_ptr<Backend> host,
                                                                cudaStream_t stream);

}  // namespace sparsekv::tools
