#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>

#include "cuda/dependent_launch.cuh"

namespace sparsekv::dependent_launch {

bool Enabled() {
  static const bool allowed = [] {
    const char* env = std::getenv("SPARSEKV_PDL");
    return env == nullptr || std::strcmp(env, "0") != 0;
  }();
  if (!allowed) return false;
  static std::mutex mu;
  static std::map<int, bool> by_device;
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return false;
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = by_device.find(device); it != by_device.end()) return it->second;
  int major = 0;
  const bool supported =
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess &&
      major >= 9;
  by_device.emplace(device, supported);
  return supported;
}

}  // namespace sparsekv::dependent_launch
