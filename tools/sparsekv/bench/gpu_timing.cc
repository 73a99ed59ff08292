#include "tools/sparsekv/bench/gpu_timing.h"

#include <algorithm>

namespace sparsekv::tools {

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

StatusOr<double> TimeGraph(const Graph& graph, cudaStream_t stream, int reps) {
  EventPair ev;
  std::vector<double> ms;
  for (int rep = 0; rep <= reps; ++rep) {
    SPARSEKV_RETURN_IF_ERROR(ev.Start(stream));
    SPARSEKV_RETURN_IF_ERROR(graph.Launch(stream));
    SPARSEKV_RETURN_IF_ERROR(ev.Stop(stream));
    SPARSEKV_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
    SPARSEKV_ASSIGN_OR_RETURN(const double t, ev.Ms());
    if (rep > 0) ms.push_back(t);
  }
  return Median(ms);
}

StatusOr<Ceilings> MeasureCeilings(std::byte* pinned, size_t bytes, cudaStream_t s) {
  SPARSEKV_ASSIGN_OR_RETURN(DeviceBuffer a, DeviceBuffer::Allocate(bytes, kBenchMemory));
  SPARSEKV_ASSIGN_OR_RETURN(DeviceBuffer b, DeviceBuffer::Allocate(bytes, kBenchMemory));
  SPARSEKV_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(b.get(), 0x5A, bytes, s));
  auto time = [&](void* dst, const void* src) -> StatusOr<double> {
    Graph g;
    SPARSEKV_RETURN_IF_ERROR(g.Capture(s, [&] {
      return CudaStatus(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, s), "memcpy");
    }));
    return TimeGraph(g, s, 5);
  };
  Ceilings c;
  SPARSEKV_ASSIGN_OR_RETURN(const double h2d, time(a.get(), pinned));
  SPARSEKV_ASSIGN_OR_RETURN(const double d2h, time(pinned, b.get()));
  SPARSEKV_ASSIGN_OR_RETURN(const double d2d, time(a.get(), b.get()));
  c.pcie_h2d_gbps = bytes / (h2d * 1e6);
  c.pcie_d2h_gbps = bytes / (d2h * 1e6);
  c.hbm_gbps = 2.0 * bytes / (d2d * 1e6);
  return c;
}

}  // namespace sparsekv::tools
