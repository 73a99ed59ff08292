#include "tools/sparsekv/bench/gpu_timing.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace sparsekv::tools {

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double MaxRelativeError(const std::vector<std::byte>& got, const std::vector<std::byte>& want,
                        int64_t n) {
  if (got.size() != want.size()) return 1;
  const auto value = [](const std::vector<std::byte>& v, int64_t i) {
    uint32_t bits = 0;
    std::memcpy(&bits, v.data() + 2 * i, 2);
    bits <<= 16;
    float f;
    std::memcpy(&f, &bits, 4);
    return double{f};
  };
  double worst = 0;
  const int64_t values = static_cast<int64_t>(got.size() / 2);
  for (int64_t first = 0; first + n <= values; first += n) {
    double diff = 0, norm = 0;
    for (int64_t i = first; i < first + n; ++i) {
      const double g = value(got, i), w = value(want, i);
      diff += (g - w) * (g - w);
      norm += w * w;
    }
    const double error = norm > 0 ? std::sqrt(diff / norm) : (diff > 0 ? 1.0 : 0.0);
    worst = std::isfinite(error) ? std::max(worst, error) : 1e30;  // NaN or inf: a failure
  }
  return worst;
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
