// Programmatic dependent launch (Hopper and later): a kernel of the cache may start while the
// kernel before it on the stream is still running, and waits on the device, not on the host's
// launch path, for that kernel's results.
//
// A decode layer is a chain of short kernels (append, resolve, miss copy). Launched plainly, each
// starts only after the previous one has drained and its launch has gone through the front end:
// a few microseconds per link at batch 1, where the kernels themselves take 4-18 us. Launched with
// cudaLaunchAttributeProgrammaticStreamSerialization, the next grid is scheduled as soon as every
// block of the previous one has called LetDependentsLaunch (or exited); it then blocks in
// WaitForPrerequisites until the previous grid has completed and its writes are visible. The
// captured graph keeps these as programmatic edges, so replays get the same overlap.
//
// Rules every kernel launched through Launch follows:
//   * WaitForPrerequisites() comes before its first read of memory that an earlier kernel or copy
//     on the stream may write, and before its first global write (an earlier kernel may still be
//     reading what it overwrites). Only work on registers and shared memory goes before it.
//   * LetDependentsLaunch() may come anywhere: the dependents wait for this grid's completion
//     anyway; calling it early only lets them be resident sooner.
// Before sm_90 both are no-ops and Launch uses no attribute. SPARSEKV_PDL=0 in the environment
// turns the attribute off (to measure what it gains).
#pragma once

#include <cuda_runtime.h>

#include <utility>

namespace sparsekv::dependent_launch {

__device__ __forceinline__ void WaitForPrerequisites() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void LetDependentsLaunch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Whether the current device supports it (compute capability 9.0 or later) and SPARSEKV_PDL is
// not "0". Cached per device.
bool Enabled();

// kernel<<<grid, block, smem, stream>>>(args...), as a programmatic dependent launch where
// Enabled().
template <typename... Params, typename... Args>
cudaError_t Launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                   cudaStream_t stream, Args&&... args) {
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  if (Enabled()) {
    config.attrs = &attribute;
    config.numAttrs = 1;
  }
  return cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

}  // namespace sparsekv::dependent_launch
